"""The framework hooks' signal (ckptvault/hooks/signal.py): where it goes, that the training thread
only queues it, that a failure never reaches training and is said once, and that `import
ckptvault.hooks` needs no framework."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptvault import hooks
from ckptvault.hooks import signal as sig
from ckptvault.hooks.signal import Dispatcher, Saved, channels, ingest_command, is_rank_zero, resolve_mode

REPO = Path(__file__).resolve().parents[2]
WAIT = 60.0  # a bound on a wait for a condition, never an expectation of speed


def test_importing_the_hooks_imports_no_framework_and_not_prefect() -> None:
    code = (
        "import sys, ckptvault.hooks\n"
        "print(','.join(m for m in ('torch', 'transformers', 'lightning', 'prefect') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize(
    ("mode", "api", "expected"),
    [
        ("auto", None, ("ingest",)),
        ("auto", "http://prefect:4200/api", ("event",)),
        ("event", None, ("event",)),
        ("ingest", "http://prefect:4200/api", ("ingest",)),
        ("both", None, ("event", "ingest")),
        ("off", "http://prefect:4200/api", ()),
        ("bogus", None, ("ingest",)),
    ],
)
def test_the_channel_follows_the_mode_and_whether_a_prefect_api_is_configured(
    mode: str, api: str | None, expected: tuple[str, ...]
) -> None:
    env = {"PREFECT_API_URL": api} if api else {}
    assert channels(mode, env) == expected


def test_the_mode_comes_from_the_hook_then_the_environment_then_auto() -> None:
    assert resolve_mode("both", {"CKPTVAULT_HOOK_SIGNAL": "off"}) == "both"
    assert resolve_mode(None, {"CKPTVAULT_HOOK_SIGNAL": "off"}) == "off"
    assert resolve_mode(None, {}) == "auto"


def test_only_global_rank_zero_signals() -> None:
    assert is_rank_zero({}) and is_rank_zero({"RANK": "0"}) and is_rank_zero({"SLURM_PROCID": "0"})
    assert not is_rank_zero({"RANK": "3"}) and not is_rank_zero({"OMPI_COMM_WORLD_RANK": "1"})


def test_the_ingest_command_names_run_step_and_config() -> None:
    cmd = ingest_command(Saved("r1", 40, "/ckpt/checkpoint-40", "/etc/c.toml"))
    assert cmd[1:] == ["-m", "ckptvault_cli.main", "ingest", "--run", "r1", "--step", "40", "--config", "/etc/c.toml"]
    assert "--config" not in ingest_command(Saved("r1", 40, "/p"))


def test_the_signal_is_sent_from_another_thread_while_the_caller_has_already_returned() -> None:
    release, sent = threading.Event(), []

    def slow(saved: Saved, env: object) -> None:
        release.wait(WAIT)  # held until the caller has returned: proof the caller did not wait on it
        sent.append((saved.step, threading.current_thread() is threading.main_thread()))

    d = Dispatcher(send={"ingest": slow}, env={})
    d.put(Saved("r", 2, "/p"))
    assert sent == []  # put returned with the send still held
    release.set()
    assert d.drain(WAIT)
    assert sent == [(2, False)]


def test_the_same_step_of_a_run_is_signalled_once() -> None:
    seen: list[tuple[str, int]] = []
    d = Dispatcher(send={"ingest": lambda s, env: seen.append((s.run, s.step))}, env={})
    for run, step in [("a", 2), ("a", 2), ("b", 2), ("a", 4)]:
        d.put(Saved(run, step, "/p"))
    assert d.drain(WAIT)
    assert seen == [("a", 2), ("b", 2), ("a", 4)]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_prefect_api_is_one_warning_and_never_an_exception(caplog: pytest.LogCaptureFixture) -> None:
    api = f"http://127.0.0.1:{_closed_port()}/api"
    d = Dispatcher(env={"PREFECT_API_URL": api})  # the real send: an HTTP POST to the events endpoint
    with caplog.at_level(logging.WARNING):
        for step in (2, 4, 6):
            d.put(Saved("r", step, f"/ckpt/checkpoint-{step}"))
        assert d.drain(WAIT)
    mine = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(mine) == 1 and mine[0].name == "ckptvault.hooks"
    assert "run 'r' step 2 by event" in mine[0].getMessage() and "scheduled ingest" in mine[0].getMessage()
    assert d.warned == {"event"}


def test_a_failing_channel_never_raises_into_the_caller_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    def broken(saved: Saved, env: object) -> None:
        raise OSError("no such file: ckptvault")

    d = Dispatcher(send={"ingest": broken}, env={})
    with caplog.at_level(logging.WARNING, logger="ckptvault.hooks"):
        d.put(Saved("r", 1, "/p"))
        d.put(Saved("r", 2, "/p"))
        assert d.drain(WAIT)
    assert [r.getMessage().count("no such file") for r in caplog.records if r.name == "ckptvault.hooks"] == [1]


def test_notify_saved_on_another_rank_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    queued: list[Saved] = []
    monkeypatch.setattr(sig.DISPATCHER, "put", queued.append)
    monkeypatch.setenv("RANK", "1")
    hooks.notify_saved("r", 10, "/p")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("CKPTVAULT_CONFIG", "/etc/c.toml")
    hooks.notify_saved("r", 10, Path("/p"), signal="ingest")
    assert queued == [Saved("r", 10, "/p", "/etc/c.toml", "ingest")]


def test_notify_saved_with_a_bad_argument_warns_instead_of_raising(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(sig.DISPATCHER, "warned", set())
    with caplog.at_level(logging.WARNING, logger="ckptvault.hooks"):
        hooks.notify_saved("r", "not a step", "/p")  # type: ignore[arg-type]
    assert any("not signalled" in r.getMessage() for r in caplog.records)


def test_a_detached_ingest_that_fails_is_warned_about_once_naming_its_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setenv("CKPTVAULT_HOOK_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(sig.DISPATCHER, "warned", set())
    missing = str(tmp_path / "no-such-config.toml")
    with caplog.at_level(logging.WARNING, logger="ckptvault.hooks"):
        sig.run_ingest(Saved("r", 7, "/p", missing), {})  # the real command: exits 2 on the missing config
        deadline = time.monotonic() + WAIT  # the reaper thread warns when the child has exited
        while not any("exited" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.1)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "ckptvault.hooks"]
    assert "--run r --step 7` exited 2" in warning and str(tmp_path / "logs" / "r.log") in warning
    assert "no-such-config.toml" in (tmp_path / "logs" / "r.log").read_text()


class _Proc:
    """A detached ingest that exits when the test says."""

    pids = iter(range(10_000, 20_000))

    def __init__(self, saved: Saved) -> None:
        self.saved, self.pid, self.code = saved, next(self.pids), 0
        self.done = threading.Event()

    def wait(self) -> int:
        self.done.wait(WAIT)
        return self.code


def _until(check: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert check(), what


def test_one_detached_ingest_per_run_at_a_time_the_others_wait_their_turn_in_order() -> None:
    started: list[_Proc] = []

    def start(saved: Saved) -> _Proc:
        started.append(_Proc(saved))
        return started[-1]

    ingests = sig.Ingests(start=start)
    for step in (10, 20, 30):
        ingests.submit(Saved("a", step, "/p"))
    ingests.submit(Saved("b", 5, "/p"))  # another run is not held up by a's
    assert [(p.saved.run, p.saved.step) for p in started] == [("a", 10), ("b", 5)]
    assert [s.step for s in ingests.waiting("a")] == [20, 30]
    started[0].code = 1  # a failed ingest still lets the next one start
    started[0].done.set()
    _until(lambda: len(started) == 3, "a's step 20 started when step 10's ingest ended")
    assert started[2].saved.step == 20 and [s.step for s in ingests.waiting("a")] == [30]
    started[2].done.set()
    _until(lambda: len(started) == 4, "a's step 30 started when step 20's ingest ended")
    started[3].done.set()
    started[1].done.set()
    _until(lambda: not ingests._running, "both runs idle")
    ingests.submit(Saved("a", 40, "/p"))  # idle again: starts at once
    assert started[-1].saved.step == 40 and len(started) == 5
    # at interpreter exit the waiting ones start at once, unreaped: the training is over
    ingests.submit(Saved("a", 50, "/p"))
    ingests.submit(Saved("a", 60, "/p"))
    assert len(started) == 5
    ingests.start_waiting()
    assert [p.saved.step for p in started[5:]] == [50, 60] and ingests.waiting("a") == []
    started[4].done.set()


def test_an_ingest_that_cannot_start_raises_to_the_dispatcher_and_frees_its_run() -> None:
    def start(saved: Saved) -> _Proc:
        raise OSError("no such interpreter")

    ingests = sig.Ingests(start=start)
    with pytest.raises(OSError, match="no such interpreter"):
        ingests.submit(Saved("a", 1, "/p"))
    assert not ingests._running  # the next signal tries again instead of waiting forever


def test_the_detached_ingest_runs_nicer_than_the_training_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        sig.lower_priority(child.pid)
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == min(own + 10, 19)
    finally:
        child.kill()
        child.wait()
    sig.lower_priority(child.pid)  # gone already: nothing raised
