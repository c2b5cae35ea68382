"""The one-shot process settings of the `ckptvault` command line (ckptvault_cli/process.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.settings import get_current_settings

from ckptvault_cli import process

ROOT = Path(__file__).resolve().parents[2]


def test_flow_settings_turn_heartbeats_off_and_back(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in process.HEARTBEAT_VARS:
        monkeypatch.delenv(name, raising=False)
    before = get_current_settings().flows.heartbeat_frequency
    assert before is not None, "Prefect's default emits heartbeats; this test needs that default"
    with process.flow_settings():
        assert get_current_settings().flows.heartbeat_frequency is None
    assert get_current_settings().flows.heartbeat_frequency == before


def test_flow_settings_are_made_once_per_settings_they_start_from(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    for name in process.HEARTBEAT_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(process, "_made", [])
    process.prepare_flow_settings()  # as the warm process does before it forks
    with process.flow_settings():
        first = get_current_settings()
    with process.flow_settings():
        assert get_current_settings() is first  # not made again (~26 ms each time)
    # a Prefect variable of the environment changed between two flow runs of one process: made anew, as
    # Prefect's own temporary_settings would make them (a value the settings in force set explicitly, as
    # a test server's fixture does, wins over the environment in both)
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:2/api")
    with temporary_settings(updates={"flows.heartbeat_frequency": None}) as expected:  # type: ignore[dict-item]
        wanted = expected.api.url
    with process.flow_settings():
        assert get_current_settings() is not first
        assert get_current_settings().api.url == wanted
    monkeypatch.delenv("PREFECT_API_URL")
    # settings changed under it (another API): made anew from those, never the stale ones
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:1/api"}), process.flow_settings():
        assert get_current_settings().api.url == "http://127.0.0.1:1/api"
        assert get_current_settings().flows.heartbeat_frequency is None
    with process.flow_settings():
        assert get_current_settings().api.url == first.api.url


def test_the_warm_processs_prefect_client_serves_the_first_flow_run_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.context import SyncClientContext
    from prefect.settings import PREFECT_API_URL, temporary_settings

    api = "http://127.0.0.1:9/api"  # nothing listens: no request may be made before a flow run's own
    monkeypatch.setenv("PREFECT_API_URL", api)
    monkeypatch.setattr(process, "_client_made", [])
    checks = {"client.server_version_check_enabled": False}  # entering a client asks the server otherwise
    with temporary_settings(updates={PREFECT_API_URL: api, **checks}):  # type: ignore[dict-item]
        process.prepare_prefect_client()  # as the warm process does before it forks
        [made] = process._client_made
        assert SyncClientContext.get() is None  # made, not entered: it holds no connection to fork
        identity = made.client._client.csrf_client_id  # drawn in the warm process: every child's otherwise
        with process.prefect_client(), SyncClientContext.get_or_create() as found:  # as the flow engine asks
            assert found is made and str(found.client.api_url) == api + "/"
            assert found.client._client.csrf_client_id != identity  # its own CSRF identity
        assert found.client._closed and not process._client_made
        with process.prefect_client():  # a later flow run in the same process makes its own client
            assert SyncClientContext.get() is None
    monkeypatch.delenv("PREFECT_API_URL")
    process.prepare_prefect_client()  # no API: direct mode runs no flow, nothing is made
    assert not process._client_made


def test_the_settings_made_before_the_fork_are_the_ones_a_childs_flow_run_asks_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ckptvault_cli.preflight import QUIET_PREFECT, quiet_prefect_env

    for name in (*process.HEARTBEAT_VARS, *QUIET_PREFECT):
        monkeypatch.delenv(name, raising=False)  # a user's shell sets none of them
    monkeypatch.setattr(process, "_made", [])
    process.prepare_flow_settings(QUIET_PREFECT)
    assert not any(name in os.environ for name in QUIET_PREFECT)  # the warm process's own env unchanged
    [(_, _, made)] = process._made
    quiet_prefect_env()  # what a command does before its flow run
    with process.flow_settings():
        assert get_current_settings() is made  # found, not made again
        assert get_current_settings().server.analytics_enabled is False


@pytest.mark.parametrize("name", process.HEARTBEAT_VARS)
def test_flow_settings_keep_heartbeats_the_operator_asked_for(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "60")
    before = get_current_settings().flows.heartbeat_frequency
    with process.flow_settings():
        assert get_current_settings().flows.heartbeat_frequency == before
        assert before is not None


def _child(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_one_shot_collects_nothing_during_imports_then_freezes_them() -> None:
    got = _child(
        "import gc\n"
        "from ckptvault_cli import process\n"
        "process.begin_one_shot()\n"
        "off = not gc.isenabled()\n"
        "import ckptvault_prefect.flows.restore\n"
        "process.imports_done()\n"
        "print(off, gc.isenabled(), gc.get_freeze_count() > 100_000)\n"
    )
    assert got == "True True True"


def test_in_process_callers_keep_their_collector() -> None:
    # Tests and other long-lived callers run `main` without `run`: imports_done changes nothing.
    got = _child(
        "import gc\n"
        "from ckptvault_cli import process\n"
        "process.imports_done(); process.end_one_shot()\n"
        "print(gc.isenabled(), gc.get_freeze_count())\n"
    )
    assert got == "True 0"


def test_console_entry_exits_with_the_command_code(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    out = subprocess.run(
        [sys.executable, "-c", "from ckptvault_cli.main import run; run()", "--config", str(missing), "ls"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert str(missing) in out.stderr


def _entry(code: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_console_entry_runs_every_exit_handler_then_skips_the_native_teardown() -> None:
    # A handler a library registers while the command runs (Prefect's log drain) still runs, and the
    # code is the command's, also when the process then ends without the interpreter's teardown.
    code = (
        "import atexit, ckptvault_cli.main as m\n"
        "def cmd(argv=None):\n"
        "    atexit.register(lambda: print('drained'))\n"
        "    print('result')\n"
        "    return 2\n"
        "m.main = cmd\n"
        "m.run()\n"
    )
    out = _entry(code)
    assert (out.returncode, out.stdout.split()) == (2, ["result", "drained"]), out.stderr


@pytest.mark.parametrize(("argv", "rc"), [(("--help",), 0), (("--no-such-flag",), 2), (("hold", "r"), 2)])
def test_console_entry_keeps_argparse_exit_codes(argv: tuple[str, ...], rc: int) -> None:
    out = _entry("from ckptvault_cli.main import run; run()", *argv)
    assert out.returncode == rc, out.stderr
