"""Without the `dask` extra, each way of asking for Dask (--dask-address, --dask-workers, [scale]
dask_address) is exit 2 naming it and `pip install 'ckptvault[dask]'`, before anything is uploaded or
restored; the default runner goes on working without Dask.

The console script runs with `distributed` and `prefect_dask` first on its path as packages whose import
fails the way an uninstalled one does (ModuleNotFoundError), so the real installed ones are never
reached: what a user without the extra gets, on SeaweedFS."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptvault_cli.synthetic import write_checkpoint
from ckptvault_cli.warm import protocol as proto
from tests.helpers import write_config

REPO = Path(__file__).resolve().parents[2]
INSTALL = "pip install 'ckptvault[dask]'"


@pytest.fixture
def no_dask(tmp_path: Path, seaweedfs: Any) -> dict[str, str]:
    """The environment of a console script that cannot import distributed or prefect_dask."""
    shadow = tmp_path / "no-dask"
    for name in ("distributed", "prefect_dask"):
        (shadow / name).mkdir(parents=True)
        (shadow / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n"
        )
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "CKPTVAULT_PREFECT")}
    env.update(seaweedfs.env(), PYTHONPATH=f"{shadow}{os.pathsep}{REPO}", **{proto.OFF_ENV: "0"})
    # a cluster needs a Prefect server, checked after Dask: this one is never reached
    env["PREFECT_API_URL"] = "http://127.0.0.1:9/api"
    return env


def _cli(env: dict[str, str], cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ckptvault_cli.entry", "--config", str(cfg), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=REPO)


def _refused(out: subprocess.CompletedProcess[str], origin: str) -> None:
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"ckptvault: {origin} runs the work on Dask, which this environment cannot import ")
    assert INSTALL in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr  # the one message


def test_each_way_of_asking_for_dask_is_exit_2_with_the_install(
    no_dask: dict[str, str], seaweedfs: Any, bucket_factory: Callable[[Any], str], tmp_path: Path
) -> None:
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    write_checkpoint(root, "hf", 100, 64 << 10, shards=1, seed=1)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "hf")])
    scaled = write_config(
        tmp_path / "scaled.toml", seaweedfs, bucket, [("r", root, "hf")],
        extra='[scale]\ndask_address = "tcp://127.0.0.1:8786"\n',
    )  # fmt: skip

    def stored() -> list[str]:
        return [o["Key"] for o in seaweedfs.client().list_objects_v2(Bucket=bucket).get("Contents", [])]

    _refused(_cli(no_dask, cfg, "ingest", "--dask-workers", "2"), "--dask-workers")
    _refused(_cli(no_dask, cfg, "ingest", "--dask-address", "tcp://127.0.0.1:8786"), "--dask-address")
    _refused(_cli(no_dask, scaled, "ingest"), "[scale] dask_address")
    assert stored() == []  # refused before a byte was uploaded

    # Dask is not needed otherwise: the same environment ingests on this host's threads
    plain = _cli({k: v for k, v in no_dask.items() if k != "PREFECT_API_URL"}, cfg, "ingest")
    assert plain.returncode == 0 and "uploaded" in plain.stdout, plain.stderr
    dest = tmp_path / "back"
    _refused(_cli(no_dask, cfg, "restore", "r", "--dest", str(dest), "--dask-workers", "2"), "--dask-workers")
    assert not dest.exists()
