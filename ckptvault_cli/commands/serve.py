"""`ckptvault serve`: every deployment served from this process (one machine, no work pool)."""

from __future__ import annotations

import argparse
import os

from ckptvault_cli import process
from ckptvault_cli.preflight import EXIT_OK, preflight, preflight_runner, quiet_prefect_env


def cmd_serve(args: argparse.Namespace) -> int:
    cfg_path = args.config or os.environ.get("CKPTVAULT_CONFIG")
    cfg = preflight(args, need_sources=False)
    # [scale] as `ckptvault ingest` reads it, checked now: a scheduler that does not answer is exit 2 at
    # start, not a failed run every ten minutes
    choice = preflight_runner(cfg)
    quiet_prefect_env()
    from ckptvault_prefect.deployments.serve import serve_all

    runner = None
    if choice.needs_prefect:
        from ckptvault_prefect.runtime.runners import task_runner_for

        runner = task_runner_for(choice)
    process.imports_done()  # a long-lived process from here on: collection back on
    serve_all(cfg_path, runner)
    return EXIT_OK
