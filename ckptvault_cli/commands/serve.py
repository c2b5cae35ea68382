"""`ckptvault serve`: every deployment served from this process (one machine, no work pool)."""

from __future__ import annotations

import argparse
import os

from ckptvault_cli import process
from ckptvault_cli.preflight import EXIT_OK, preflight, quiet_prefect_env


def cmd_serve(args: argparse.Namespace) -> int:
    cfg_path = args.config or os.environ.get("CKPTVAULT_CONFIG")
    preflight(args, need_sources=False)
    quiet_prefect_env()
    from ckptvault_prefect.deployments.serve import serve_all

    process.imports_done()  # a long-lived process from here on: collection back on
    serve_all(cfg_path)
    return EXIT_OK
