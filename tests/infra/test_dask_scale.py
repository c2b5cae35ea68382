"""`ckptvault ingest` on Dask ([scale], --dask-address, --dask-workers), through the command line,
against a real S3 server (SeaweedFS): what is refused before any work, and with what message."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config

MiB = 2**20


@pytest.fixture
def one_source(seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config with one run of one small checkpoint, the store's credentials in the environment."""
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    root = tmp_path / "hot"
    root.mkdir()
    write_checkpoint(root, "hf", 100, MiB, seed=1)
    return write_config(tmp_path / "c.toml", seaweedfs, bucket_factory(seaweedfs), [("r", root, "hf")])


def _closed_port() -> int:
    with socket.socket() as s:  # bound and closed again: nothing listens there
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_an_unreachable_scheduler_is_exit_2_naming_it_and_the_fix(
    one_source: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # an API URL that nothing serves: the scheduler check comes before any use of Prefect
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{_closed_port()}/api")
    address = f"tcp://127.0.0.1:{_closed_port()}"
    with one_source.open("a") as f:
        f.write(f'[scale]\ndask_address = "{address}"\nconnect_timeout_seconds = 1\n')
    err = _refused(capsys, ["--config", str(one_source), "ingest"])
    assert f"[scale] dask_address: no Dask scheduler answered at {address} within 1 s" in err
    assert "infra/local/dask.sh up" in err


def test_a_bad_address_flag_is_exit_2_with_the_form_to_use(
    one_source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(capsys, ["--config", str(one_source), "ingest", "--dask-address", "dask-scheduler:8786"])
    assert "--dask-address: 'dask-scheduler:8786' is not a Dask scheduler address" in err
    assert "tcp://HOST:PORT" in err


def test_a_cluster_without_a_prefect_server_is_exit_2(
    one_source: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    err = _refused(capsys, ["--config", str(one_source), "ingest", "--dask-address", "tcp://127.0.0.1:8786"])
    assert "PREFECT_API_URL" in err and "--dask-workers N" in err


def test_a_bad_scale_key_is_exit_2_naming_it(one_source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with one_source.open("a") as f:
        f.write('[scale]\ndask_address = "http://h:8786"\n')
    err = _refused(capsys, ["--config", str(one_source), "ingest"])
    assert "scale.dask_address" in err and "tcp://HOST:PORT" in err
