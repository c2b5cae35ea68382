"""`ckptvault catalog compact`: every partition of the catalog (or the named runs') compacted now."""

from __future__ import annotations

import argparse

from ckptvault_cli.output import emit_json
from ckptvault_cli.preflight import EXIT_OK, UsageError, preflight_store


def cmd_catalog_compact(args: argparse.Namespace) -> int:
    from ckptvault.catalog import Catalog
    from ckptvault.transfer.progress import ProgressBar

    runs = args.runs
    if runs is not None and not all(runs):
        raise UsageError("--runs: give one or more run names (as `ckptvault ls` shows them), e.g. --runs llama-7b")
    cfg, store = preflight_store(args, need_sources=False)
    catalog = Catalog(store, cfg.store.prefix)
    # Partitions at once: as many as `ls` reads partitions with, within the store's connection pool;
    # each is a few round trips, one at a time within it. The bar is on stderr, only on a terminal.
    bar = lambda n: ProgressBar(n, "compact", unit="partitions")  # noqa: E731
    # [store] deletes = "tier-only": this role may not delete, so snapshots only (the tier run merges)
    done = catalog.compact_now(runs, progress=bar, workers=8, deletes=cfg.store.flows_delete)
    if args.json:
        emit_json(done.as_dict())
    else:
        what = "every run" if runs is None else ", ".join(runs)
        print(
            f"compacted {done.partitions} partitions of {what} ({done.files} event files merged or migrated, "
            f"{done.passes} passes, {done.seconds:.1f} s)"
        )
    return EXIT_OK
