"""What a one-shot `ckptvault` process does to its own interpreter and to the Prefect settings of the
flow it runs: the command line's fixed cost is paid on every invocation, so it is kept small.

Measured on a 64 MiB restore (2 cores, a running Prefect server): 4.3 s before, ~2.7 s after.
- Prefect emits a flow-run heartbeat every 180 s by default, from a thread that sleeps in 1 s steps
  and is joined when the flow ends: up to 1 s per run, spent after the work is done. Heartbeats only
  matter to an automation that marks silent runs as crashed, which ckptvault does not install.
- The imports (Prefect, pydantic, pyarrow, boto) build about a million long-lived objects. Collecting
  them during start-up (~0.3 s), again in later full collections, and once more at interpreter exit
  (~0.6 s) finds nothing to free.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ckptvault_prefect.runtime import prefect_private

# Either name turns heartbeats back on for command-line flows (the second is Prefect's legacy alias).
HEARTBEAT_VARS = ("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY")

_one_shot: list[bool] = []


def begin_one_shot() -> None:
    """Called once by the console-script entry, never by code that calls `main` in a longer-lived
    process (tests): collection stays off until the flow's modules are imported, and for the whole of
    a command that runs no flow (ls, plan, accept, catalog: short, and they build no reference cycles
    worth collecting)."""
    _one_shot.append(True)
    gc.disable()


def one_shot() -> bool:
    """True in the console script's process (`begin_one_shot` was called), False for `main` in-process."""
    return bool(_one_shot)


def imports_done() -> None:
    """After the heavy imports: what exists now lives until exit, so later collections skip it."""
    if _one_shot and not gc.isenabled():
        gc.freeze()
        gc.enable()


def end_one_shot() -> None:
    """Before exit: skip the final collection over everything (the interpreter still flushes and
    runs every exit handler; nothing is cut short)."""
    if _one_shot:
        gc.freeze()


# (the settings a flow's were made from, the environment's PREFECT_* variables then, the flow's): building
# Prefect's settings again costs ~26 ms (it reads the environment and the profiles file anew), on the way
# to every command's first byte
_made: list[tuple[Any, list[tuple[str, str]], Any]] = []


def _without_heartbeats(settings: Any) -> Any:
    # keyed on the Prefect variables of the environment too: Prefect's copy reads them again, and a
    # caller that lives across commands (tests, `main` in-process) may change them between flow runs
    key = (settings, sorted((k, v) for k, v in os.environ.items() if k.startswith("PREFECT_")))
    for base, env, made in _made:
        if base is key[0] and env == key[1]:
            return made
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY

    made = settings.copy_with_update(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})
    _made[:] = [(key[0], key[1], made)]
    return made


def _heartbeats_asked() -> bool:
    return any(os.environ.get(name) for name in HEARTBEAT_VARS)


def prepare_flow_settings(defaults: Mapping[str, str] | None = None) -> None:
    """The warm process, before it forks: the settings `flow_settings` enters, made once for every child
    (the children run in this process's environment: ckptvault_cli/warm/server.py's fingerprint).
    `defaults`: the variables a command sets where unset before its flow runs (preflight.QUIET_PREFECT),
    set here only while the settings are made, so they are the ones a child's flow run asks for; this
    process's own environment, which decides what it may run, is left as it was."""
    if _heartbeats_asked():
        return
    from prefect.context import get_settings_context

    missing = {k: v for k, v in (defaults or {}).items() if k not in os.environ}
    os.environ.update(missing)
    try:
        _without_heartbeats(get_settings_context().settings)
    finally:
        for name in missing:
            del os.environ[name]


# The warm process's Prefect client context for its child's flow run, made before the fork (at most one)
_client_made: list[Any] = []


def prepare_prefect_client() -> None:
    """The warm process, before it forks: the Prefect client a flow run's engine makes first (~20 ms, most
    of it loading certifi's CA bundle into a TLS context, which a plain-HTTP API never uses), made once
    here. It has no connection yet: each child enters its own copy (the fork's), and only that child
    ever opens connections with it. Nothing without a Prefect API (direct mode runs no flow)."""
    if os.environ.get("PREFECT_API_URL"):
        from prefect.context import SyncClientContext

        _client_made[:] = [SyncClientContext()]


@contextmanager
def prefect_client() -> Iterator[None]:
    """The client `prepare_prefect_client` made, entered for this process's first flow run: the flow
    engine finds it (SyncClientContext.get_or_create) instead of making one. Used once: a client closed
    at the end of a flow run cannot be opened again; a later flow run makes its own, as always."""
    made = _client_made.pop() if _client_made else None
    # Its CSRF identity was drawn in the warm process, every child's otherwise: each draws its own
    # (prefect_private.CLIENT_CSRF_ID says why)
    if made is None or not prefect_private.renew_csrf_id(made):
        yield  # none made, or a Prefect whose client this does not know: the flow engine makes its own
        return
    with made:
        yield


@contextmanager
def flow_settings() -> Iterator[None]:
    """Prefect settings for a flow run started from the command line: no heartbeats unless the
    operator asked for them in the environment (see HEARTBEAT_VARS). What Prefect's
    `temporary_settings` does, with the new settings made once per process (`_without_heartbeats`)."""
    if _heartbeats_asked():
        yield
        return
    from prefect.context import SettingsContext, get_settings_context

    context = get_settings_context()
    with SettingsContext(profile=context.profile, settings=_without_heartbeats(context.settings)):
        yield
