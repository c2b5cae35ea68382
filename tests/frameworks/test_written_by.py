"""What wrote each save, as `ls --json` shows it after an ingest of the real frameworks' checkpoints
(tests/frameworks/writers.py): the versions the checkpoint records are the installed frameworks' own
(docs/FORMAT.md, "What wrote a save")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from ckptvault_cli.main import main
from tests.frameworks.test_frameworks import SPECS, _config, _env, _ls


def _expected(fw: str) -> dict[str, str]:
    if fw == "hf":
        return {"transformers": version("transformers")}
    if fw == "lightning":
        return {"pytorch-lightning": version("lightning")}  # writers.py trains with the `lightning` package
    if fw == "deepspeed":
        return {"deepspeed": version("deepspeed")}
    from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION

    if fw == "dcp":
        return {"torch.dcp": CURRENT_DCP_VERSION}
    if fw == "megatron":
        from megatron.core.dist_checkpointing.core import CheckpointingConfig

        default = next(
            f.default for f in dataclasses.fields(CheckpointingConfig) if f.name == "sharded_backend_version"
        )
        return {"megatron-core.torch_dist": str(default), "torch.dcp": CURRENT_DCP_VERSION}
    return {}  # orbax records none


@pytest.mark.parametrize("fw", ["hf", "lightning", "deepspeed", "megatron", "dcp", "orbax"])
def test_ls_json_shows_the_versions_that_wrote_each_save(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, framework_run: Callable[[str], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fw: str,
) -> None:  # fmt: skip
    spec = SPECS[fw]
    root = framework_run(fw)
    _env(monkeypatch, seaweedfs)
    cfg = _config(tmp_path, seaweedfs, bucket_factory(seaweedfs), root, spec.fmt)
    assert main(["--config", str(cfg), "ingest"]) == 0
    rows = _ls(cfg, capsys)
    want = _expected(fw)
    assert want or fw == "orbax"
    assert {s: r["written_by"] for s, r in rows.items()} == dict.fromkeys(spec.steps, want)
