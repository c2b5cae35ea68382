"""A training job SIGKILLed from outside while the framework is writing a checkpoint (DeepSpeed's
save_checkpoint, Megatron-Core's dist_checkpointing.save): what it leaves is never reported ready and
never uploaded; once the restarted job saves that step again to the end, it is uploaded, once.

The model is wide (hidden 131072: ~42 MB of weights, ~170 MB per DeepSpeed checkpoint, ~127 MB per
Megatron one) so that writing the last checkpoint takes ~0.4 s here; the test watches the file system
and kills the child as soon as the rank file it names has bytes in it and the pointer file does not
name that step yet. If the save finished first anyway, the test fails saying so (it does not pass
having killed nothing)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from ckptvault.checkpoint.manifest import MANIFEST_NAME
from ckptvault.ingest.discovery import discover
from ckptvault_cli.main import main
from tests.frameworks import need
from tests.frameworks.conftest import MODULE, REPO, write_run
from tests.frameworks.test_frameworks import _config, _env, _ls, _stored, _tree

HIDDEN = "131072"


@dataclass(frozen=True)
class Kill:
    ckpt: str  # the last checkpoint's directory under the run root
    watch: str  # a file in it that the kill waits for (bytes written, save not finished)
    pointer: str  # the run-root pointer file, and what it holds before and after the last save
    before: str
    after: str
    reason: str  # what discovery says of the killed save


KILLS = {
    "deepspeed": Kill(
        "global_step6", "zero_pp_rank_0_mp_rank_00_optim_states.pt", "latest", "global_step4", "global_step6",
        "'latest' names global_step4; global_step6 is still being saved",
    ),
    "megatron": Kill(
        "iter_0000006", "__0_0.distcp", "latest_checkpointed_iteration.txt", "4", "6",
        "latest_checkpointed_iteration.txt names iteration 4; 6 is still being saved",
    ),
}  # fmt: skip


def _group_gone(pgid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = []
        for p in psutil.process_iter(["pid", "status"]):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                    alive.append(p.pid)
        if not alive:
            return True
        time.sleep(0.1)
    return False


def _kill_mid_save(fw: str, root: Path, log: Path) -> dict[str, int]:
    """Train `fw` in a child and SIGKILL it while it writes the last checkpoint; the sizes it left."""
    k = KILLS[fw]
    cmd = [sys.executable, "-m", "tests.frameworks.writers", "train", fw, str(root), "--hidden", HIDDEN]
    watch, pointer = root / k.ckpt / k.watch, root / k.pointer
    with open(log, "wb") as out:
        # its own process group, killed whole: Megatron's save forks writer processes, and a SIGKILL of
        # the trainer alone left one alive (orphaned, ~460 MB) for the rest of the test session
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    if watch.stat().st_size > 0:
                        os.killpg(proc.pid, signal.SIGKILL)
                        break
                except FileNotFoundError:
                    pass
                time.sleep(0.001)
            rc = proc.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):  # the group's survivors, whatever happened above
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.poll() is None:
                proc.kill()
    assert _group_gone(proc.pid), f"{fw}: a process of the killed writer's group is still alive"
    tail = log.read_text(errors="replace")[-4000:]
    assert rc == -signal.SIGKILL, f"{fw}: the writer was not killed mid-save (exit {rc}):\n{tail}"
    held = pointer.read_text().strip()
    assert held == k.before, (
        f"{fw}: {k.pointer} holds {held!r} after the kill: the save finished before the kill landed "
        "(the box wrote the checkpoint faster than it was watched); nothing in-progress was tested"
    )
    return {p.name: p.stat().st_size for p in sorted((root / k.ckpt).iterdir())}


@pytest.mark.parametrize("fw", sorted(KILLS))
def test_a_save_killed_from_outside_is_not_uploaded_until_saved_again(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], fw: str,
) -> None:  # fmt: skip
    need(MODULE[fw])
    k = KILLS[fw]
    root = tmp_path / "root"
    left = _kill_mid_save(fw, root, tmp_path / "writer.log")
    assert left.get(k.watch, 0) > 0, left  # the kill landed inside the save: its file has bytes, the save is not done

    found = {f.step: f for f in discover("r", root, "auto", 0, time.time() + 1).found}
    assert sorted(found) == [2, 4, 6]
    assert found[2].ready and found[4].ready
    assert not found[6].ready and k.reason in found[6].reason, (found[6], left)

    _env(monkeypatch, seaweedfs)
    bucket = bucket_factory(seaweedfs)
    cfg = _config(tmp_path, seaweedfs, bucket, root, "auto")
    capsys.readouterr()
    assert main(["--config", str(cfg), "ingest", "--json"]) == 0
    first = {o["step"]: (o["result"], o["message"]) for o in json.loads(capsys.readouterr().out)["outcomes"]}
    assert first[6][0] == "waiting" and k.reason in first[6][1], first
    assert (first[2][0], first[4][0]) == ("uploaded", "uploaded"), first
    assert sorted(_ls(cfg, capsys)) == [2, 4]
    assert _stored(seaweedfs, bucket, 6) == [], f"the killed save was uploaded (left: {left})"

    # the job restarts from step 4 and saves step 6 again, to the end, over what the kill left
    write_run(fw, root, "--resume-step", "4", "--hidden", HIDDEN)
    assert (root / k.pointer).read_text().strip() == k.after
    [finished] = [f for f in discover("r", root, "auto", 0, time.time() + 1).found if f.step == 6]
    assert finished.ready, finished
    capsys.readouterr()
    assert main(["--config", str(cfg), "ingest", "--json"]) == 0
    outcomes = {o["step"]: o["result"] for o in json.loads(capsys.readouterr().out)["outcomes"]}
    assert outcomes == {2: "present", 4: "present", 6: "uploaded"}, outcomes
    rows = _ls(cfg, capsys)
    assert sorted(rows) == [2, 4, 6] and (rows[6]["state"], rows[6]["save"]) == ("verified", 1), rows[6]
    assert MANIFEST_NAME in _stored(seaweedfs, bucket, 6)
    assert main(["--config", str(cfg), "ingest", "--json"]) == 0  # and a later pass uploads nothing again
    again = {o["step"]: o["result"] for o in json.loads(capsys.readouterr().out)["outcomes"]}
    assert again == {2: "present", 4: "present", 6: "present"}, again
    dest = tmp_path / "restored"
    assert main(["--config", str(cfg), "restore", "r", "--dest", str(dest)]) == 0
    assert _tree(dest / k.ckpt) == _tree(root / k.ckpt)
