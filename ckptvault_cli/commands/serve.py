"""`ckptvault serve`: every deployment served from this process (one machine, no work pool)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from ckptvault_cli import process
from ckptvault_cli.preflight import EXIT_OK, UsageError, preflight_runner, preflight_store, quiet_prefect_env

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from ckptvault.config import Config
    from ckptvault.store import ObjectStore


def start_metrics(cfg: Config, store: ObjectStore) -> WSGIServer | None:
    """`/metrics` on `[metrics]`'s port, from a thread of this process, when one is set (docs/metrics.md):
    computed from the catalog on every scrape, so the flows this process runs need not report anything
    and one that crashed leaves nothing stale; the server ends with the process (or `.shutdown()`, which
    the test that points a real Prometheus at it calls)."""
    if cfg.metrics.port is None:
        return None
    from ckptvault.catalog import Catalog
    from ckptvault.observe import metrics
    from ckptvault.pricing import PriceError
    from ckptvault_cli.output import say

    try:
        options = metrics.options_for(cfg)
        server, _ = metrics.serve_metrics(
            cfg.metrics.bind_address, cfg.metrics.port, lambda: Catalog(store, cfg.store.prefix), options
        )
    except (PriceError, metrics.MetricsServerError) as e:
        raise UsageError(str(e)) from None
    host = cfg.metrics.bind_address
    say(f"metrics: http://{f'[{host}]' if ':' in host else host}:{server.server_port}/metrics")
    return server


def cmd_serve(args: argparse.Namespace) -> int:
    cfg_path = args.config or os.environ.get("CKPTVAULT_CONFIG")
    cfg, store = preflight_store(args, need_sources=False)
    start_metrics(cfg, store)  # before Prefect: a port in use is exit 2 at once, not after 30 s
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
