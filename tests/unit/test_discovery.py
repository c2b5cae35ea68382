"""Discovery: readiness = commit rule + quiescence; symlinks, loops and unreadable entries."""

from __future__ import annotations

import copy
import os
import pickle
import time
from pathlib import Path

import pytest

from ckptvault.checkpoint.local_files import LocalFile
from ckptvault.formats import FormatError
from ckptvault.ingest.discovery import DiscoveryResult, Found, discover
from ckptvault_cli import synthetic
from tests.helpers import simulate_run

FORMATS = list(synthetic.FORMATS)
SIZE = 64 << 10
SETTLE = 60.0


def later() -> float:
    """A `now` well after every file written by the test: everything is quiescent."""
    return time.time() + 3600


def by_step(res: DiscoveryResult) -> dict[int, Found]:
    return {f.step: f for f in res.found}


@pytest.mark.parametrize("fmt", FORMATS)
def test_complete_checkpoint_is_ready(tmp_path: Path, fmt: str) -> None:
    path = synthetic.write_checkpoint(tmp_path, fmt, 1200, SIZE)
    res = discover("r1", tmp_path, fmt, SETTLE, later())
    assert res.problems == []
    (f,) = res.found
    assert (f.run, f.step, f.format, f.path, f.ready, f.reason) == ("r1", 1200, fmt, path, True, "")
    assert f.files and [x.rel for x in f.files] == sorted(x.rel for x in f.files)
    on_disk = [p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()]
    assert f.total_bytes == sum(p.stat().st_size for p in on_disk)
    assert len(f.files) == len(on_disk)
    assert f.newest_mtime == max(os.lstat(p).st_mtime for p in [path, *on_disk])


@pytest.mark.parametrize("fmt", FORMATS)
def test_incomplete_then_finished(tmp_path: Path, fmt: str) -> None:
    synthetic.write_checkpoint(tmp_path, fmt, 100, SIZE)
    synthetic.write_checkpoint(tmp_path, fmt, 200, SIZE, complete=False)
    found = by_step(discover("r", tmp_path, fmt, SETTLE, later()))
    assert found[100].ready
    assert not found[200].ready and found[200].reason
    assert found[200].files == ()
    synthetic.finish_checkpoint(tmp_path, fmt, 200)
    found = by_step(discover("r", tmp_path, fmt, SETTLE, later()))
    assert found[200].ready and found[200].reason == ""


@pytest.mark.parametrize("fmt", FORMATS)
def test_fresh_checkpoint_is_not_quiescent(tmp_path: Path, fmt: str) -> None:
    synthetic.write_checkpoint(tmp_path, fmt, 7, SIZE)
    (f,) = discover("r", tmp_path, fmt, SETTLE, time.time()).found
    assert not f.ready
    assert "still being written" in f.reason and "settle_seconds = 60" in f.reason
    (f,) = discover("r", tmp_path, fmt, 0, time.time() + 1).found
    assert f.ready


@pytest.mark.parametrize("fmt", FORMATS)
def test_auto_format(tmp_path: Path, fmt: str) -> None:
    simulate_run(tmp_path, fmt, [30, 10, 20], SIZE)
    res = discover("r", tmp_path, "auto", SETTLE, later())
    assert [(f.step, f.format, f.ready) for f in res.found] == [(10, fmt, True), (20, fmt, True), (30, fmt, True)]


def test_one_fresh_file_deep_inside_blocks_readiness(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "dcp", 5, SIZE)
    old = time.time() - 1000
    for p in [d, *d.rglob("*")]:
        os.utime(p, (old, old))
    assert discover("r", tmp_path, "dcp", SETTLE, time.time()).found[0].ready
    os.utime(d / "__1_0.distcp", None)  # touched just now
    (f,) = discover("r", tmp_path, "dcp", SETTLE, time.time()).found
    assert not f.ready and "settle_seconds" in f.reason


def test_future_mtime_is_not_ready(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "dcp", 5, SIZE)
    (f,) = discover("r", tmp_path, "dcp", SETTLE, time.time() - 100).found
    assert not f.ready and "future" in f.reason


def test_lightning_single_file_rel_is_its_name(tmp_path: Path) -> None:
    p = synthetic.write_checkpoint(tmp_path, "lightning", 3, SIZE)
    (f,) = discover("r", tmp_path, "lightning", SETTLE, later()).found
    assert f.files == (LocalFile(p.name, p, p.stat().st_size, p.stat().st_mtime),)


def test_nested_rel_paths_use_slashes(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "megatron", 100, SIZE)
    (f,) = discover("r", tmp_path, "megatron", SETTLE, later()).found
    assert [x.rel for x in f.files] == ["mp_rank_00/model_optim_rng.pt", "mp_rank_01/model_optim_rng.pt"]


def test_symlink_outside_is_reported_and_not_followed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    d = synthetic.write_checkpoint(run, "hf", 10, SIZE)
    secret = tmp_path / "elsewhere"
    secret.mkdir()
    (secret / "big.bin").write_bytes(b"x" * 1000)
    (d / "linked_dir").symlink_to(secret)
    (d / "linked_file.bin").symlink_to(secret / "big.bin")
    res = discover("r", run, "hf", SETTLE, later())
    (f,) = res.found
    rels = {x.rel for x in f.files}
    assert not any(r.startswith("linked") for r in rels)
    assert len(res.problems) == 2
    for name in ("linked_dir", "linked_file.bin"):
        (msg,) = [p for p in res.problems if name in p]
        assert str(d / name) in msg and "outside the checkpoint" in msg and "not followed" in msg


def test_symlink_inside_is_reported_too(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "dcp", 1, SIZE)
    (d / "alias.distcp").symlink_to("__0_0.distcp")
    res = discover("r", tmp_path, "dcp", SETTLE, later())
    assert "alias.distcp" not in {x.rel for x in res.found[0].files}
    assert any("alias.distcp" in p and "inside the checkpoint" in p for p in res.problems)


@pytest.mark.timeout(20)
def test_symlink_loops_do_not_hang(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "dcp", 1, SIZE)
    (d / "loop").symlink_to(d)
    (d / "self").symlink_to("self")
    (tmp_path / "step-2").symlink_to(tmp_path / "step-2")  # a candidate name that loops on itself
    res = discover("r", tmp_path, "dcp", SETTLE, later())
    assert [f.step for f in res.found] == [1]
    assert any(str(d / "loop") in p for p in res.problems)
    assert any(str(d / "self") in p for p in res.problems)


def test_symlinked_checkpoint_dir_is_skipped(tmp_path: Path) -> None:
    real = synthetic.write_checkpoint(tmp_path / "real", "deepspeed", 5, SIZE)
    run = tmp_path / "run"
    run.mkdir()
    (run / "global_step5").symlink_to(real)
    (run / "latest").write_text("global_step5")
    res = discover("r", run, "deepspeed", SETTLE, later())
    assert res.found == []
    assert any("global_step5" in p and "symlink" in p for p in res.problems)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_unreadable_dir_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "megatron", 100, SIZE)
    (d / "mp_rank_01").chmod(0)
    try:
        res = discover("r", tmp_path, "megatron", SETTLE, later())
    finally:
        (d / "mp_rank_01").chmod(0o755)
    (f,) = res.found
    assert not f.ready and "mp_rank_01" in f.reason
    assert any("mp_rank_01" in p and "cannot read" in p for p in res.problems)


def test_special_files_are_skipped(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "dcp", 1, SIZE)
    os.mkfifo(d / "pipe")
    res = discover("r", tmp_path, "dcp", SETTLE, later())
    assert "pipe" not in {x.rel for x in res.found[0].files}
    assert any("pipe" in p and "not a regular file" in p for p in res.problems)


def test_missing_root_is_a_problem(tmp_path: Path) -> None:
    res = discover("r", tmp_path / "nope", "hf", SETTLE, later())
    assert res.found == [] and "nope" in res.problems[0] and "'r'" in res.problems[0]


def test_auto_on_empty_root_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    res = discover("r", tmp_path, "auto", SETTLE, later())
    assert res.found == [] and "set format" in res.problems[0]


def test_auto_ambiguous_raises(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "hf", 1, SIZE)
    synthetic.write_checkpoint(tmp_path, "megatron", 1, SIZE)
    with pytest.raises(FormatError, match="ambiguous"):
        discover("r", tmp_path, "auto", SETTLE, later())


def test_leftover_temp_beside_finished_step(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "orbax", 8, SIZE)
    (tmp_path / "8.orbax-checkpoint-tmp-99").mkdir()
    res = discover("r", tmp_path, "orbax", SETTLE, later())
    assert [(f.step, f.path.name, f.ready) for f in res.found] == [(8, "8", True)]
    assert any("8.orbax-checkpoint-tmp-99" in p and "leftover" in p for p in res.problems)


def test_duplicate_step_keeps_one(tmp_path: Path) -> None:
    p = synthetic.write_checkpoint(tmp_path, "lightning", 4, SIZE)
    (tmp_path / "epoch=0-step=4-v1.ckpt").write_bytes(p.read_bytes())
    res = discover("r", tmp_path, "lightning", SETTLE, later())
    assert [f.path.name for f in res.found] == [p.name]
    assert any("epoch=0-step=4-v1.ckpt" in x and "second checkpoint for step 4" in x for x in res.problems)


def test_local_file_is_an_immutable_value(tmp_path: Path) -> None:
    a = LocalFile("x/y", str(tmp_path / "x" / "y"), 3, 1.0)
    b = LocalFile("x/y", tmp_path / "x" / "y", 3, 1.0)
    assert a == b and hash(a) == hash(b) and isinstance(a.path, Path)
    with pytest.raises(AttributeError):
        a.size = 4


def test_unreadable_dir_simulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same as above, for runs as root: opening one subdirectory fails with EACCES."""
    d = synthetic.write_checkpoint(tmp_path, "megatron", 100, SIZE)
    blocked = os.fspath(d / "mp_rank_01")
    real_open = os.open

    def open_(path: str, flags: int, *args: object, **kw: object) -> int:
        if os.fspath(path) == blocked:
            raise PermissionError(13, "Permission denied", blocked)
        return real_open(path, flags, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", open_)
    res = discover("r", tmp_path, "megatron", SETTLE, later())
    (f,) = res.found
    assert not f.ready and "mp_rank_01" in f.reason and "Permission denied" in f.reason
    assert any(blocked in p and "cannot read directory" in p for p in res.problems)


def test_local_file_pickles_and_copies(tmp_path: Path) -> None:
    a = LocalFile("a.bin", str(tmp_path / "a.bin"), 1, 2.0)
    assert pickle.loads(pickle.dumps(a)) == a
    assert copy.deepcopy(a) == a and copy.copy(a).path == tmp_path / "a.bin"
    assert "a.bin" in repr(a)
