"""Every name ckptvault uses that Prefect does not offer as its API: a private attribute, a module global,
the layout of its modules. Each is listed here (`NAMES`) with why ckptvault uses it and what ckptvault
does once the installed Prefect no longer has it, and the code reaches the first two kinds only through
this module's functions. Every fallback is the cold path: what a process does that never had the
shortcut, slower and otherwise the same.

A Prefect upgrade is checked here, in one place: tests/unit/test_prefect_private.py fails (never skips)
for each name the installed Prefect lacks, and runs each fallback.

No Prefect at import time: the command line imports this (ckptvault_cli/process.py) before it has chosen
to load Prefect; each function imports what it reaches.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ckptvault_prefect.runtime.preload import COMMAND


@dataclass(frozen=True)
class PrivateName:
    """`name` inside module `module` (a dotted attribute path; "" for the module itself)."""

    module: str
    name: str
    why: str
    when_gone: str


FLOW_ENGINE_MULTIPROCESSING = PrivateName(
    "prefect.flow_engine",
    "multiprocessing",
    why="`ckptvault serve`'s warm start (ckptvault_prefect/runtime/warm_start.py) replaces this module global:"
    " the runner's direct starter asks it for the \"spawn\" context, and gets the forkserver's instead",
    when_gone="`install` changes nothing and returns False: served flow runs start in a new interpreter each"
    " (spawn), as Prefect starts them",
)
FLOW_ENGINE_SUBPROCESS = PrivateName(
    "prefect.flow_engine",
    "run_flow_in_subprocess",
    why="the function that reads FLOW_ENGINE_MULTIPROCESSING: its presence says the runner starts flow runs"
    " the way the warm start knows (prefect 3.9)",
    when_gone="as FLOW_ENGINE_MULTIPROCESSING gone: served flow runs start cold",
)
CLIENT_HTTP = PrivateName(
    "prefect.client.orchestration",
    "SyncPrefectClient._client",
    why="the HTTP client under the Prefect client the warm process makes before it forks"
    " (ckptvault_cli/process.py, prepare_prefect_client): the CSRF identity below is its attribute",
    when_gone="`renew_csrf_id` is False and the pre-made client is not used: each command's flow run makes its"
    " own client, as a cold command's does",
)
CLIENT_CSRF_ID = PrivateName(
    "prefect.client.base",
    "PrefectHttpxSyncClient.csrf_client_id",
    why="drawn when a client is made, so every child forked from the warm process would share the warm"
    " process's; a server with CSRF protection keeps one token per identity, and concurrent commands would"
    " keep invalidating each other's. Each child draws its own, as a client made in it would",
    when_gone="as CLIENT_HTTP gone: the pre-made client is not used, each flow run makes its own",
)
# The preload list (ckptvault_prefect/runtime/preload.py) names Prefect's modules by their place in its
# package: a layout Prefect may change without notice.
PRELOADED = tuple(
    PrivateName(
        name,
        "",
        why="imported before the warm process's first fork (the preload list), not in each command's child",
        when_gone="`ckptvault warm` fails to start and says so (its log has the ImportError); with no warm"
        " process, every command runs cold. serve's forkserver skips a module it cannot import",
    )
    for name in COMMAND
    if name == "prefect" or name.startswith("prefect.")
)
NAMES = (FLOW_ENGINE_MULTIPROCESSING, FLOW_ENGINE_SUBPROCESS, CLIENT_HTTP, CLIENT_CSRF_ID, *PRELOADED)


def flow_engine() -> ModuleType | None:
    """prefect.flow_engine, when it starts flow runs the way the warm start knows (FLOW_ENGINE_*); None
    otherwise."""
    import prefect.flow_engine as engine

    if not isinstance(getattr(engine, FLOW_ENGINE_MULTIPROCESSING.name, None), ModuleType):
        return None
    if not hasattr(engine, FLOW_ENGINE_SUBPROCESS.name):
        return None
    return engine


def flow_engine_multiprocessing() -> object:
    """What prefect.flow_engine's module global holds now (None where it has none)."""
    import prefect.flow_engine as engine

    return getattr(engine, FLOW_ENGINE_MULTIPROCESSING.name, None)


def set_flow_engine_multiprocessing(engine: ModuleType, replacement: ModuleType) -> None:
    setattr(engine, FLOW_ENGINE_MULTIPROCESSING.name, replacement)


def renew_csrf_id(context: Any) -> bool:
    """A new CSRF identity for the client of `context` (a prefect.context.SyncClientContext made in another
    process); False, changing nothing, where the client has none ckptvault knows (CLIENT_*)."""
    http = getattr(getattr(context, "client", None), _last(CLIENT_HTTP), None)
    if not hasattr(http, _last(CLIENT_CSRF_ID)):
        return False
    setattr(http, _last(CLIENT_CSRF_ID), uuid.uuid4())
    return True


def _last(private: PrivateName) -> str:
    return private.name.rpartition(".")[2]
