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


def test_the_ingest_command_of_several_saves_names_each_step_once() -> None:
    saves = [Saved("r1", step, f"/ckpt/checkpoint-{step}", "/etc/c.toml") for step in (40, 50, 40)]
    cmd = ingest_command(*saves)
    assert cmd[3:] == ["ingest", "--run", "r1", "--step", "40", "--step", "50", "--config", "/etc/c.toml"]


def test_what_the_training_process_runs_goes_with_the_command_and_the_event() -> None:
    """The hook reports the imported frameworks' versions and torch's CUDA (ckptvault/hooks/runtime.py):
    as `--written-by` on the detached ingest, and in the saved event's payload for the deployment's
    trigger; both in the one text form ingest parses back."""
    import torch  # the dev venv has it (the frameworks extra); a hook reports only what is imported

    from ckptvault.checkpoint.written_by import parse
    from ckptvault.hooks.runtime import runtime_versions

    now = runtime_versions()
    assert now["torch"] == torch.__version__.split("+")[0] or now["torch"] == torch.__version__, now
    assert ("torch.cuda" in now) == (torch.version.cuda is not None), now
    assert "deepspeed" not in now or "deepspeed" in sys.modules
    words = "torch=2.9.1 torch.cuda=12.8"
    cmd = ingest_command(Saved("r1", 40, "/p", None, "auto", words))
    assert cmd[-2:] == ["--written-by", words] and parse(cmd[-1]) == {"torch": "2.9.1", "torch.cuda": "12.8"}
    assert sig.event_body(Saved("r1", 40, "/p", None, "auto", words))["payload"]["written_by"] == words
    assert "--written-by" not in ingest_command(Saved("r1", 40, "/p"))


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
    from ckptvault.checkpoint.written_by import render
    from ckptvault.hooks.runtime import runtime_versions

    assert queued == [Saved("r", 10, "/p", "/etc/c.toml", "ingest", render(runtime_versions()))]


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

    def __init__(self, saved: Saved, *more: Saved) -> None:
        self.saved, self.pid, self.code = saved, next(self.pids), 0
        self.steps = [s.step for s in (saved, *more)]
        self.done = threading.Event()

    def wait(self) -> int:
        self.done.wait(WAIT)
        return self.code


def _until(check: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert check(), what


def _starter() -> tuple[list[_Proc], sig.Start]:
    started: list[_Proc] = []

    def start(saved: Saved, *more: Saved) -> _Proc:
        started.append(_Proc(saved, *more))
        return started[-1]

    return started, start


def test_one_detached_ingest_per_run_at_a_time_the_others_wait_their_turn() -> None:
    started, start = _starter()
    ingests = sig.Ingests(start=start)
    for step in (10, 20):
        ingests.submit(Saved("a", step, "/p"))
    ingests.submit(Saved("b", 5, "/p"))  # another run is not held up by a's
    assert [(p.saved.run, p.steps) for p in started] == [("a", [10]), ("b", [5])]
    assert [s.step for s in ingests.waiting("a")] == [20]
    started[0].code = 1  # a failed ingest still lets the next one start
    started[0].done.set()
    _until(lambda: len(started) == 3, "a's step 20 started when step 10's ingest ended")
    assert started[2].steps == [20] and ingests.waiting("a") == []
    started[2].done.set()
    started[1].done.set()
    _until(lambda: not ingests._running, "both runs idle")
    ingests.submit(Saved("a", 40, "/p"))  # idle again: starts at once
    assert started[-1].steps == [40] and len(started) == 4
    # at interpreter exit the waiting ones start at once, unreaped, in one ingest: the training is over
    ingests.submit(Saved("a", 50, "/p"))
    ingests.submit(Saved("a", 60, "/p"))
    assert len(started) == 4
    ingests.start_waiting()
    assert [p.steps for p in started[4:]] == [[50, 60]] and ingests.waiting("a") == []
    started[3].done.set()


def test_the_saves_that_waited_for_their_runs_ingest_are_drained_by_one_start() -> None:
    started, start = _starter()
    ingests = sig.Ingests(start=start)
    ingests.submit(Saved("a", 10, "/p"))
    ingests.submit(Saved("a", 20, "/p"))
    ingests.submit(Saved("a", 30, "/p"))
    ingests.submit(Saved("a", 35, "/p", config="/other.toml"))  # one command reads one config
    assert [p.steps for p in started] == [[10]]
    started[0].done.set()
    _until(lambda: len(started) == 2, "the waiting saves started when step 10's ingest ended")
    assert started[1].steps == [20, 30]  # both waiting saves, one process
    assert [s.step for s in ingests.waiting("a")] == [35]
    ingests.submit(Saved("a", 40, "/p", config="/other.toml"))  # queued behind, joins 35's turn
    started[1].done.set()
    _until(lambda: len(started) == 3, "the other config's saves started next")
    assert started[2].steps == [35, 40] and started[2].saved.config == "/other.toml"
    started[2].done.set()
    _until(lambda: not ingests._running, "the run idle")
    assert len(started) == 3


def test_an_ingest_that_cannot_start_raises_to_the_dispatcher_and_frees_its_run() -> None:
    def start(saved: Saved, *more: Saved) -> _Proc:
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


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"PREFECT_API_KEY": "pnu_x"}, "Bearer pnu_x"),
        ({"PREFECT_API_AUTH_STRING": "admin:pass"}, "Basic YWRtaW46cGFzcw=="),
        ({}, None),
    ],
)
def test_the_event_post_carries_the_apis_credentials(env: dict[str, str], want: str | None) -> None:
    import json
    from http.server import BaseHTTPRequestHandler, HTTPServer

    got: list[tuple[str, str | None, list[dict[str, object]]]] = []

    class Events(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            got.append((self.path, self.headers.get("Authorization"), body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Events)
    threading.Thread(target=server.handle_request, daemon=True).start()
    api = f"http://127.0.0.1:{server.server_port}/api"
    sig.send_event(Saved("r1", 40, "/ckpt/checkpoint-40"), {"PREFECT_API_URL": api, **env})
    server.server_close()
    [(path, auth, body)] = got
    assert path == "/api/events" and auth == want
    assert body[0]["event"] == "ckptvault.checkpoint.saved" and body[0]["payload"] == {
        "run": "r1", "step": 40, "path": "/ckpt/checkpoint-40", "written_by": ""
    }  # fmt: skip
