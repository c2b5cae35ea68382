"""An ingest read top to bottom: from the command line to the multipart upload, no module of ours is
entered twice on the way down (issue [N]: the old path went back into a module it had left 41 times).

Observers record the Python stack where the flow hands the upload tasks out and where a file's multipart
upload starts, then call the real functions: the ingest runs as it always does, on SeaweedFS with a real
Prefect API, and must succeed."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import pytest

from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config

REPO = Path(__file__).resolve().parents[2]
OURS = ("ckptvault/", "ckptvault_cli/", "ckptvault_prefect/")
MiB = 2**20


def _our_modules(stack: traceback.StackSummary) -> list[str]:
    """The modules of ours on a stack, outermost first, consecutive frames of one module as one."""
    mods: list[str] = []
    for frame in stack:
        path = Path(frame.filename).resolve()
        if not path.is_relative_to(REPO):
            continue
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(OURS) and (not mods or mods[-1] != rel):
            mods.append(rel)
    return mods


def test_ingest_from_the_cli_to_the_multipart_upload_never_reenters_a_module(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ckptvault.store.upload as upload_mod
    import ckptvault_prefect.tasks.step as step_mod
    from ckptvault.store import multipart
    from ckptvault_cli.main import main

    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    write_checkpoint(root, "hf", 100, 12 * MiB, shards=1, seed=1)  # files over a 5 MiB part: multipart
    no_gates = "[validation]\nenabled = false\n"
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "hf")], extra=no_gates)

    handed_out: list[traceback.StackSummary] = []
    started: list[traceback.StackSummary] = []
    real_map, real_upload = step_mod.Step.map, multipart.upload_multipart

    def map_observed(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.task.name == "upload-file" and not handed_out:
            handed_out.append(traceback.extract_stack())
        return real_map(self, *args, **kwargs)

    def upload_observed(*args: Any, **kwargs: Any) -> Any:
        if not started:
            started.append(traceback.extract_stack())
        return real_upload(*args, **kwargs)

    monkeypatch.setattr(step_mod.Step, "map", map_observed)
    assert getattr(upload_mod, "upload_multipart", None) is real_upload, "the store calls it from store/upload.py"
    monkeypatch.setattr(upload_mod, "upload_multipart", upload_observed)

    assert main(["--config", str(cfg), "ingest"]) == 0
    assert handed_out and started, "the ingest never reached the upload tasks or a multipart upload"

    # the flow's thread, from the command line through the flow and the library's ingest pass to the
    # submitter that hands out the upload tasks
    down = _our_modules(handed_out[0])
    assert down[0] == "ckptvault_cli/main.py" and down[-1] == "ckptvault_prefect/runtime/submitter.py", down
    # (no PREFECT_API_URL in the environment: direct mode, the flow's body without its Prefect flow)
    assert down.index("ckptvault_prefect/flows/ingest_body.py") < down.index("ckptvault/ingest/ingest_pass.py"), down
    # a task's thread, from the task to the store's multipart upload
    task = _our_modules(started[0])
    assert "ckptvault_prefect/tasks/ingest.py" in task and task[-1] == "ckptvault/store/upload.py", task
    assert task.index("ckptvault/ingest/steps.py") > task.index("ckptvault_prefect/tasks/ingest.py"), task
    for chain in (down, task):
        assert len(chain) == len(set(chain)), f"a module entered twice on the way down: {chain}"
