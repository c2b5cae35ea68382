"""Every name ckptvault uses that Prefect does not offer as API (ckptvault_prefect/runtime/prefect_private.py):
each test of the first part fails, never skips, when the installed Prefect no longer has one; the second
part takes each away and runs what ckptvault does then, the cold path."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import tempfile
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptvault_prefect.runtime import prefect_private as private
from ckptvault_prefect.runtime import warm_start

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def made_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Prefect client context made as the warm process makes it, before its fork; nothing listens."""
    from prefect.context import SyncClientContext
    from prefect.settings import PREFECT_API_URL, temporary_settings

    api = "http://127.0.0.1:9/api"
    monkeypatch.setenv("PREFECT_API_URL", api)
    checks = {"client.server_version_check_enabled": False}  # entering a client asks the server otherwise
    with temporary_settings(updates={PREFECT_API_URL: api, **checks}):  # type: ignore[dict-item]
        yield SyncClientContext()


def test_every_name_says_why_and_what_happens_without_it() -> None:
    assert len({(n.module, n.name) for n in private.NAMES}) == len(private.NAMES)
    assert all(n.why and n.when_gone for n in private.NAMES)
    assert {n.module for n in private.PRELOADED} >= {"prefect.flow_engine", "prefect.client.orchestration"}


# --- the installed Prefect still has each name ---


def test_the_flow_engine_has_the_module_global_serves_warm_start_replaces() -> None:
    import prefect.flow_engine as engine

    assert isinstance(getattr(engine, private.FLOW_ENGINE_MULTIPROCESSING.name, None), types.ModuleType)
    assert callable(getattr(engine, private.FLOW_ENGINE_SUBPROCESS.name, None))
    assert private.flow_engine() is engine


def test_the_flow_engine_still_asks_that_global_for_spawn() -> None:
    """The seam is where the runner's starter asks, not merely present: its source still reads it."""
    import inspect

    import prefect.flow_engine as engine

    source = inspect.getsource(getattr(engine, private.FLOW_ENGINE_SUBPROCESS.name))
    assert 'multiprocessing.get_context("spawn")' in source


def test_the_prefect_client_has_the_csrf_identity_each_child_redraws(made_client: Any) -> None:
    http = getattr(made_client.client, private.CLIENT_HTTP.name.rpartition(".")[2])
    assert type(http).__name__ == private.CLIENT_CSRF_ID.name.partition(".")[0]
    before = getattr(http, private.CLIENT_CSRF_ID.name.rpartition(".")[2])
    assert private.renew_csrf_id(made_client)
    assert http.csrf_client_id != before


@pytest.mark.parametrize("name", [n.module for n in private.PRELOADED])
def test_every_preloaded_prefect_module_exists(name: str) -> None:
    assert importlib.util.find_spec(name) is not None, f"Prefect has no module {name} any more"


def test_the_registry_imports_no_prefect() -> None:
    code = "import sys; import ckptvault_prefect.runtime.prefect_private; print('prefect' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# --- without it: the cold path ---


def test_without_the_engines_global_serve_starts_flow_runs_cold(monkeypatch: pytest.MonkeyPatch) -> None:
    import prefect.flow_engine as engine

    monkeypatch.delattr(engine, private.FLOW_ENGINE_MULTIPROCESSING.name)
    assert private.flow_engine() is None
    assert warm_start.install() is False  # nothing started, nothing replaced: Prefect spawns, as it does
    assert not hasattr(engine, private.FLOW_ENGINE_MULTIPROCESSING.name) and not warm_start.installed()


def test_without_the_subprocess_starter_serve_starts_flow_runs_cold(monkeypatch: pytest.MonkeyPatch) -> None:
    import prefect.flow_engine as engine

    before = engine.multiprocessing  # type: ignore[attr-defined]
    monkeypatch.delattr(engine, private.FLOW_ENGINE_SUBPROCESS.name)
    assert warm_start.install() is False
    assert engine.multiprocessing is before  # type: ignore[attr-defined]


def test_without_the_clients_csrf_identity_a_flow_run_makes_its_own_client(
    monkeypatch: pytest.MonkeyPatch, made_client: Any
) -> None:
    from prefect.context import SyncClientContext

    from ckptvault_cli import process

    http = getattr(made_client.client, private.CLIENT_HTTP.name.rpartition(".")[2])
    monkeypatch.delattr(type(http), "csrf_client_id", raising=False)
    monkeypatch.delattr(http, "csrf_client_id")
    assert not private.renew_csrf_id(made_client)
    monkeypatch.setattr(process, "_client_made", [made_client])
    with process.prefect_client():
        assert SyncClientContext.get() is None  # not entered: the flow engine makes its own, as cold
    assert not process._client_made  # and it is not offered again


def test_without_the_clients_http_client_a_flow_run_makes_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.context import SyncClientContext

    from ckptvault_cli import process

    other = types.SimpleNamespace(client=types.SimpleNamespace())  # a client with no `_client`
    assert not private.renew_csrf_id(other)
    monkeypatch.setattr(process, "_client_made", [other])
    with process.prefect_client():
        assert SyncClientContext.get() is None


_MISSING_PRELOAD = textwrap.dedent(
    """
    import os, sys
    from ckptvault_prefect.runtime import preload
    from ckptvault_cli.warm import server

    preload.COMMAND = ("prefect.no_such_module_any_more",)
    started = []
    cli = server.CommandLine(lambda: started.append(1), lambda: sys.exit(9), [])
    try:
        server.main(lambda: cli, ["--socket", sys.argv[1]])
    except ModuleNotFoundError as e:
        print("refused to start:", e.name, "socket" if os.path.exists(sys.argv[1]) else "no socket")
    """
)


def test_without_a_preloaded_module_the_warm_process_does_not_start_and_commands_run_cold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The warm process stops at the missing module, before it listens: no socket, so the console script
    finds nothing to hand its command to and runs it here (test_warm_protocol: no socket, cold)."""
    from ckptvault_cli.warm import client
    from ckptvault_cli.warm import protocol as proto

    directory = tempfile.mkdtemp(prefix="cvw-")  # short: a socket's path is limited to 107 bytes
    Path(directory).chmod(0o700)
    monkeypatch.setenv(proto.DIR_ENV, directory)
    path = proto.socket_path()
    out = subprocess.run(
        [sys.executable, "-c", _MISSING_PRELOAD, path], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "refused to start: prefect.no_such_module_any_more no socket"
    assert client.hand_off(["--config", "c.toml", "ls"], 0.0) is None  # cold
