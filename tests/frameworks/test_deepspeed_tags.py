"""DeepSpeed saved with custom tags (`save_checkpoint(dir, tag="warmup-done")`, no step in the name):
found through `latest` with format = "auto" and by name, at the global_steps DeepSpeed recorded, uploaded,
restored with `latest` naming the tag, and resumed by `load_checkpoint` from the restored directory."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptvault.ingest.discovery import discover
from ckptvault_cli.main import main
from tests.frameworks.conftest import writer
from tests.frameworks.test_frameworks import _assert_same_tensors, _config, _env, _ls, _tensors, _tree
from tests.frameworks.writers import DEEPSPEED_TAGS


@pytest.mark.parametrize("fmt", ["auto", "deepspeed"])
def test_custom_tags_are_found_through_latest(framework_run: Callable[[str], Path], fmt: str) -> None:
    root = framework_run("deepspeed-tags")
    assert (root / "latest").read_text() == DEEPSPEED_TAGS[6]
    result = discover("r", root, fmt, 0, time.time() + 1)
    assert result.problems == []
    assert [(f.step, f.format, f.ready, f.path) for f in result.found] == [
        (step, "deepspeed", True, root / tag) for step, tag in sorted(DEEPSPEED_TAGS.items())
    ]


def test_custom_tags_uploaded_restored_and_resumed_by_load_checkpoint(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, framework_run: Callable[[str], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    root = framework_run("deepspeed-tags")
    _env(monkeypatch, seaweedfs)
    bucket = bucket_factory(seaweedfs)
    cfg = _config(tmp_path, seaweedfs, bucket, root, "auto")
    assert main(["--config", str(cfg), "ingest"]) == 0
    rows = _ls(cfg, capsys)
    assert {s: (r["state"], r["format"]) for s, r in rows.items()} == dict.fromkeys(
        DEEPSPEED_TAGS, ("verified", "deepspeed")
    )

    dest = tmp_path / "restored"
    assert main(["--config", str(cfg), "restore", "r", "--dest", str(dest)]) == 0
    assert (dest / "latest").read_text() == "final"  # the tag, so load_checkpoint(dest) finds it
    assert _tree(dest / "final") == _tree(root / "final")
    older = tmp_path / "older"
    assert main(["--config", str(cfg), "restore", "r", "--step", "2", "--dest", str(older)]) == 0
    assert (older / "latest").read_text() == "warmup-done"
    assert _tree(older / "warmup-done") == _tree(root / "warmup-done")

    runs = {}
    for name, base in (("original", root), ("restored", dest)):
        out = tmp_path / f"resume-{name}"
        got = writer("resume", "deepspeed-tags", str(base), str(out), "--steps", "8")
        assert (got["resumed_at"], got["first_step"], got["ended_at"]) == (6, 7, 8), got
        runs[name] = out
    _assert_same_tensors(_tensors(runs["original"] / "loaded.pt"), _tensors(runs["restored"] / "loaded.pt"), "loaded")
    _assert_same_tensors(_tensors(runs["original"] / "final.pt"), _tensors(runs["restored"] / "final.pt"), "final")
