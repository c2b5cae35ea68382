"""The exit codes, and what every command checks before it touches anything (config, paths, the
bucket): bad input or environment is a UsageError, exit 2, before a flow run exists."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from ckptvault.command import memo
from ckptvault.config import Config, check_sources
from ckptvault.errors import CkptvaultError
from ckptvault_cli import running
from ckptvault_cli.output import say

if TYPE_CHECKING:
    from ckptvault.history.view import View
    from ckptvault.store import ObjectStore
    from ckptvault_prefect.runtime.scale import RunnerChoice

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# `ingest --run R --step S` when that step is not ready (its commit rule, or settle_seconds): nothing uploaded
EXIT_WAITING = 3


class UsageError(CkptvaultError):
    """Bad input or environment: exit 2 with the message."""


# Telemetry off, always: offline it fails noisily, and we promise users it is off.
QUIET_PREFECT = {"DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def quiet_prefect_env() -> None:
    for name, value in QUIET_PREFECT.items():
        os.environ.setdefault(name, value)


def preflight(
    args: argparse.Namespace, *, need_sources: bool, config_read: Callable[[Config], None] | None = None
) -> Config:
    """Everything that can be checked before touching anything: config, source paths, the bucket."""
    return preflight_store(args, need_sources=need_sources, config_read=config_read)[0]


def preflight_store(
    args: argparse.Namespace, *, need_sources: bool, config_read: Callable[[Config], None] | None = None
) -> tuple[Config, ObjectStore]:
    """`preflight`, and the store it checked, for a command that reads it next (a client costs ~70 ms).
    `config_read`: called with the config as soon as it is parsed, before the checks and the store's
    import and round trips (ingest starts its gate child there, so the child boots beside them)."""
    cfg = memo.load_config(args.config)
    if config_read is not None:
        config_read(cfg)
    from ckptvault.store import StoreError

    if need_sources:
        problems = check_sources(cfg)
        if problems:
            raise UsageError("\n".join(problems))
        if not cfg.sources:
            raise UsageError("no [[sources]] in the configuration: add one per training run to ingest.")
    try:
        # remembered for this command: the flow it runs next in this process does not probe again
        store = memo.checked_store(cfg.store)
    except StoreError as e:
        raise UsageError(str(e)) from None
    if need_sources:  # a command that writes saves: their locks must hold (docs/FORMAT.md, "Object Lock")
        from ckptvault.objectlock.probe_cache import ProbeCache
        from ckptvault.objectlock.save_lock import lock_problem

        try:
            problem = lock_problem(cfg.lock, store, ProbeCache.of(cfg.store))
        except StoreError as e:
            raise UsageError(str(e)) from None
        if problem:
            raise UsageError(problem)
    return cfg, store


def preflight_runner(cfg: Config, *, address_flag: str | None = None, workers_flag: int | None = None) -> RunnerChoice:
    """Where ingest's uploads run (flags, then `[scale]`: ckptvault_prefect.runtime.scale decides), and for
    an existing cluster one bounded handshake: a wrong address is exit 2 now, not a hang in a flow run.
    Shared by `ckptvault ingest` and `ckptvault serve`."""
    from ckptvault_prefect.runtime.scale import RunnerChoiceError, SchedulerUnreachable, check_scheduler, choose_runner

    try:
        choice = choose_runner(
            cfg.scale, address_flag=address_flag, workers_flag=workers_flag, api_url=os.environ.get("PREFECT_API_URL")
        )
        if choice.kind == "cluster":
            check_scheduler(choice)
    except (RunnerChoiceError, SchedulerUnreachable) as e:
        raise UsageError(str(e)) from None
    return choice


_noted: list[bool] = []


def start_prefect_note(force_prefect: bool = False) -> None:
    quiet_prefect_env()
    if (force_prefect or not running.direct()) and not os.environ.get("PREFECT_API_URL") and not _noted:
        _noted.append(True)  # the temporary API lives as long as this process: say it once
        say(
            "starting a temporary Prefect API for this command (10-30 s; "
            "set PREFECT_API_URL to a running server, e.g. `make up`, to skip this)"
        )


def check_destination_or_usage(check: Callable[..., None], args: argparse.Namespace) -> None:
    from pathlib import Path

    from ckptvault.restore.steps import RestoreError

    try:
        check(Path(args.dest).expanduser().resolve(), args.force)
    except RestoreError as e:
        raise UsageError(str(e)) from None


def past_view(store: ObjectStore, text: str, prefix: str, flag: str = "--as-of") -> View:
    """`--as-of TIME` / `--since TIME`: the store as it was then (ckptvault/history/view.py), exit 2 on a
    TIME that names no moment or a bucket that keeps no versions; its warnings on stderr."""
    from ckptvault.history.as_of import AsOfError
    from ckptvault.history.view import open_at

    try:
        view = open_at(store, text, prefix, flag)
    except AsOfError as e:
        raise UsageError(str(e)) from None
    for warning in view.warnings:
        say(f"ckptvault: warning: {warning}")
    return view
