"""`ckptvault warm` and the commands it runs, as the console script starts them (ckptvault_cli.entry in a
subprocess), on SeaweedFS: an ingest and a restore handed to the warm process give the same bytes and
output a cold command does, `--profile` still adds up from the command's own start, a bad config still
exits 2 with its one line, Ctrl-C on the command reaches its child (exit 130, the usual message), and
every way of not having a usable warm process (another environment, a killed one, `--stop`) runs the
command cold with nothing said. Which commands the warm process ran is read from its log, so a command
that silently ran cold fails the assertions that expect it warm."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptvault_cli.synthetic import write_checkpoint
from ckptvault_cli.warm import protocol as proto
from tests.following import Follower
from tests.helpers import write_config

MiB = 2**20
REPO = Path(__file__).resolve().parents[2]
SERVED = re.compile(r"child (\d+) `([^`]*)` exit (-?\d+)")


@pytest.fixture
def warm_env(seaweedfs: Any) -> Iterator[dict[str, str]]:
    # a short directory of its own: a Unix socket's path is limited to 107 bytes
    directory = tempfile.mkdtemp(prefix="cvw-")
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "CKPTVAULT_PREFECT", proto.OFF_ENV)}
    env.update(seaweedfs.env(), PYTHONPATH=str(REPO), **{proto.DIR_ENV: directory})
    yield env
    _cli(env, "warm", "--stop")
    log = Path(proto.log_path(proto.socket_path(env)))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "stopped after" not in (log.read_text() if log.exists() else "stopped after"):
        time.sleep(0.1)
    shutil.rmtree(directory, ignore_errors=True)


def _cli(env: dict[str, str], *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ckptvault_cli.entry", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=cwd)


def _served(env: dict[str, str]) -> list[tuple[str, int]]:
    """What the warm process's log says it ran: (argv, exit code), in order."""
    log = Path(proto.log_path(proto.socket_path(env)))
    return [(m[2], int(m[3])) for m in SERVED.finditer(log.read_text())]


def _log(env: dict[str, str]) -> str:
    return Path(proto.log_path(proto.socket_path(env))).read_text()


def _settled(env: dict[str, str]) -> None:
    """Every command child of the warm process has ended (a released restore's goes on after its command)."""
    deadline = time.monotonic() + 60
    while ", 0 running" not in (status := _cli(env, "warm", "--status")).stderr:
        assert time.monotonic() < deadline, status.stderr
        time.sleep(0.1)


def _command_child(warm_pid: int) -> int:
    """The warm process's child that runs a command (not its spare Great Expectations child)."""
    for _ in range(100):
        for pid in Path(f"/proc/{warm_pid}/task/{warm_pid}/children").read_text().split():
            if b"quality_child_main" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
        time.sleep(0.1)
    raise AssertionError(f"warm process {warm_pid} has no command child")


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_commands_run_in_the_warm_process_as_they_do_cold(
    warm_env: dict[str, str], seaweedfs: Any, bucket_factory: Callable[[Any], str], tmp_path: Path
) -> None:
    env = warm_env
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    write_checkpoint(root, "deepspeed", 100, 6 * MiB, shards=2, seed=3)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "deepspeed")])

    assert _cli(env, "warm", "--status").returncode == 1  # none yet
    started = _cli(env, "warm", "--idle-minutes", "10")
    assert started.returncode == 0 and "ready in" in started.stderr, started.stderr
    status = _cli(env, "warm", "--status")
    assert status.returncode == 0 and "is running: 0 command(s) served" in status.stderr, status.stderr
    again = _cli(env, "warm")
    assert again.returncode == 0 and "already serves this environment" in again.stderr, again.stderr

    ingest = _cli(env, "--config", str(cfg), "ingest", "--json")
    assert ingest.returncode == 0, ingest.stderr
    assert [o["result"] for o in json.loads(ingest.stdout)["outcomes"]] == ["uploaded"]
    dest = tmp_path / "back"
    restore = _cli(env, "--config", str(cfg), "restore", "r", "--dest", str(dest), "--profile", cwd=tmp_path)
    assert restore.returncode == 0, restore.stderr
    assert "restored r step 100" in restore.stdout
    cold_dest = tmp_path / "cold"
    cold = _cli({**env, proto.OFF_ENV: "0"}, "--config", str(cfg), "restore", "r", "--dest", str(cold_dest))
    assert cold.returncode == 0, cold.stderr
    assert _files(dest) == _files(cold_dest) and set(_files(dest)) == set(_files(root))
    _settled(env)
    assert [a.split()[2] for a, _ in _served(env)] == ["ingest", "restore"]  # the warm process ran both
    # the restore's command was given its exit code once the result was final (durable, in place and
    # recorded), its child going on with the alert, ledger and compaction: their output in the log
    restore_child = re.search(r"child (\d+) `--config \S+ restore r", _log(env))
    assert restore_child is not None, _log(env)
    assert f"child {restore_child[1]} released its command with exit 0" in _log(env)
    ended = f"child {restore_child[1]} `--config {cfg} restore r"
    assert re.search(re.escape(ended) + r".* exit 0 after .*\(its command was given exit 0 before\)", _log(env))
    # the ingest's gates ran in the Great Expectations child the warm process had started for it
    log = Path(proto.log_path(proto.socket_path(env))).read_text()
    ingest_child = re.search(r"child (\d+) `--config \S+ ingest", log)
    assert ingest_child is not None and f"handed to child {ingest_child[1]}" in log, log
    # --profile from the command's own process start: the phases still add up to the printed total
    table = restore.stderr[restore.stderr.index("--profile, where this command's") :].splitlines()[2:]
    rows = {m[1]: float(m[2]) for ln in table if (m := re.match(r"^(\S.*?)\s+(\d+\.\d{3})\s+\d+\.\d%$", ln))}
    total = rows.pop("total")
    assert rows["process start"] > 0 and rows["transfer"] > 0
    assert abs(sum(rows.values()) - total) <= 0.001 * (len(rows) + 1)

    # a relative --dest is the command's working directory's, not the warm process's (/)
    restore2 = _cli(env, "--config", str(cfg), "restore", "r", "--dest", "rel", cwd=tmp_path)
    assert restore2.returncode == 0, restore2.stderr
    assert _files(tmp_path / "rel") == _files(cold_dest)
    _settled(env)  # its child has ended too (released at the result, it logs its end a moment later)

    bad = _cli(env, "--config", str(tmp_path / "missing.toml"), "ls")
    assert bad.returncode == 2 and "missing.toml does not exist" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr
    assert _served(env)[-1] == (f"--config {tmp_path / 'missing.toml'} ls", 2)

    # Prefect reads .env, prefect.toml and pyproject's [tool.prefect] from the working directory when it is
    # imported: from such a directory the command runs cold (the warm process imported Prefect in /)
    n = len(_served(env))
    project = tmp_path / "project"
    project.mkdir()
    (project / "prefect.toml").write_text('[logging]\nlevel = "WARNING"\n')
    there = _cli(env, "--config", str(cfg), "ls", "--json", cwd=project)
    assert there.returncode == 0 and json.loads(there.stdout)[0]["step"] == 100, there.stderr
    assert len(_served(env)) == n and "the working directory has Prefect settings" in _log(env)

    # another environment: another socket; nothing there, so the command runs cold and says nothing of it
    n = len(_served(env))
    other = _cli({**env, "CKPTVAULT_SOMETHING_ELSE": "1"}, "--config", str(cfg), "ls", "--json")
    assert other.returncode == 0 and json.loads(other.stdout)[0]["step"] == 100, other.stderr
    assert len(_served(env)) == n and other.stderr == ""
    # CKPTVAULT_WARM=0: cold on purpose
    off = _cli({**env, proto.OFF_ENV: "0"}, "--config", str(cfg), "ls", "--json")
    assert off.returncode == 0 and len(_served(env)) == n

    stop = _cli(env, "warm", "--stop")
    assert stop.returncode == 0 and "stops after its running commands" in stop.stderr, stop.stderr
    deadline = time.monotonic() + 30
    while os.path.exists(proto.socket_path(env)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(proto.socket_path(env))
    cold = _cli(env, "--config", str(cfg), "ls", "--json")
    assert cold.returncode == 0 and cold.stderr == "" and len(_served(env)) == n


def test_ctrl_c_reaches_the_command_and_a_killed_warm_process_leaves_commands_cold(
    warm_env: dict[str, str], seaweedfs: Any, bucket_factory: Callable[[Any], str], tmp_path: Path
) -> None:
    env = warm_env
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    root.mkdir()
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "hf")], settle=600)
    assert _cli(env, "warm").returncode == 0
    follower = Follower(cfg, env, "--poll-seconds", "3600", entry="ckptvault_cli.entry")
    try:
        follower.started()
        write_checkpoint(root, "hf", 100, 1 << 20, seed=1)
        follower.wait_line("uploaded  r step 100 ", 60.0)
        code = follower.stop()  # SIGINT to the command's process, which relays it to its child
    finally:
        follower.kill()
    err = "\n".join(follower.err)
    assert code == 130, (code, err[-2000:])
    assert "interrupted; rerun the same command" in err and "Traceback" not in err, err[-2000:]
    assert _served(env)[-1][1] == 130 and "follow" in _served(env)[-1][0]

    status = _cli(env, "warm", "--status")
    pid = int(re.search(r"warm process (\d+)", status.stderr)[1])  # type: ignore[index]

    # a child killed by a signal: the command ends by the same signal (a shell shows 137), no traceback
    follower = Follower(cfg, env, "--poll-seconds", "3600", entry="ckptvault_cli.entry")
    try:
        follower.started()
        os.kill(_command_child(pid), signal.SIGKILL)
        code = follower.proc.wait(30)
    finally:
        follower.kill()
    assert code == -signal.SIGKILL, (code, follower.err[-20:])
    assert _served(env)[-1][1] == -signal.SIGKILL

    os.kill(pid, signal.SIGKILL)  # its socket is left behind, with nothing listening
    time.sleep(0.2)
    assert os.path.exists(proto.socket_path(env))
    cold = _cli(env, "--config", str(cfg), "ls", "--json")
    assert cold.returncode == 0 and json.loads(cold.stdout)[0]["step"] == 100 and cold.stderr == "", cold.stderr
    restarted = _cli(env, "warm")  # a new one takes the stale socket's place
    assert restarted.returncode == 0 and "ready in" in restarted.stderr, restarted.stderr
    assert _cli(env, "--config", str(cfg), "ls").returncode == 0
    assert _served(env)[-1] == (f"--config {cfg} ls", 0)


def test_a_warm_restore_through_a_prefect_flow_run_gives_its_result_before_the_run_ends(
    prefect_api: None, warm_env: dict[str, str], seaweedfs: Any, bucket_factory: Callable[[Any], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    from prefect.settings import PREFECT_API_URL

    env = {**warm_env, "PREFECT_API_URL": str(PREFECT_API_URL.value())}  # another environment: its own
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    write_checkpoint(root, "hf", 100, 4 * MiB, shards=2, seed=5)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "hf")])
    try:
        assert _cli(env, "warm", "--idle-minutes", "10").returncode == 0
        ingest = _cli(env, "--config", str(cfg), "ingest", "--json")
        assert ingest.returncode == 0, ingest.stderr
        dest = tmp_path / "back"
        restore = _cli(env, "--config", str(cfg), "restore", "r", "--dest", str(dest), "--json")
        assert restore.returncode == 0, restore.stderr
        # one document on stdout (Prefect's log_prints in the flow run did not take the print), printed once
        assert json.loads(restore.stdout)["status"] == "restored"
        assert _files(dest) and set(_files(dest)) == set(_files(root))
        _settled(env)
        log = _log(env)
        child = re.search(r"child (\d+) released its command with exit 0", log)
        assert child is not None, log
        # the flow run ended after the command did: its last lines are in the warm log, not the command's
        after = log[child.end() :]
        assert "Finished in state Completed()" in after and "Flow run" in after, after
        assert not re.search(r"Flow run '[^']*' - Finished in state", restore.stderr), restore.stderr
        assert re.search(rf"child {child[1]} `--config \S+ restore r` exit 0 after .*given exit 0 before", log)
    finally:
        _cli(env, "warm", "--stop")
