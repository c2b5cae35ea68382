"""`ckptvault plan`, `tier` and `watch`: the tiering plan (read-only, or carried out) and the hourly watch."""

from __future__ import annotations

import argparse

from ckptvault_cli import process, running
from ckptvault_cli.output import emit_json, say
from ckptvault_cli.preflight import EXIT_FAILED, EXIT_OK, preflight, preflight_store, start_prefect_note


def cmd_plan(args: argparse.Namespace) -> int:
    """The tiering plan without Prefect: fast, read-only, what `tier --apply` would do."""
    import time

    from ckptvault.catalog import Catalog
    from ckptvault.objectlock.save_lock import bucket_lock
    from ckptvault.pricing import load_prices
    from ckptvault.tiering.milestone_lock import would_extend
    from ckptvault.tiering.policy import plan
    from ckptvault.tiering.replica_selection import unreplicated
    from ckptvault.tiering.report import plan_record, render_text
    from ckptvault.tiering.store_cost import plan_primary_rows, store_costs

    cfg, store = preflight_store(args, need_sources=False)
    kind = cfg.store.kind if cfg.store.kind != "auto" else store.kind()
    states = Catalog(store, cfg.store.prefix).current()
    prices = load_prices(cfg.policy.prices)
    now = time.time()
    waits = unreplicated(states, cfg.replicas, cfg.policy, now)  # from the catalog: no replica is reached
    p = plan(states, cfg.policy, prices, kind, now, cfg.node_local_runs(), waits)
    would_lock = would_extend(states, cfg.policy, cfg.lock)  # from the catalog: no I/O
    lock = (cfg.store.bucket, bucket_lock(store))
    # with replicas, each store's classes and their egress (None without: the output stays as it was)
    stores = store_costs(states, cfg.store, cfg.policy, cfg.replicas, prices, kind, p.now, plan_primary_rows(p.summary))
    if args.json:
        emit_json(plan_record(p, would_lock, lock, stores))
    else:
        print(render_text(p, would_lock, lock, stores))
    return EXIT_OK


def cmd_tier(args: argparse.Namespace) -> int:
    preflight(args, need_sources=False)
    start_prefect_note()
    from ckptvault_prefect.flows.tier import tier

    process.imports_done()
    result = running.run_flow(tier, 4, apply=args.apply, config_path=args.config)
    if isinstance(result, BaseException):
        if args.json:
            emit_json({"applied": False, "error": str(result)})
        say(f"tier failed: {result}")
        return EXIT_FAILED
    if args.json:
        emit_json(result.as_dict())
    if not args.apply:
        say("dry run: nothing was changed. Pass --apply to carry out this plan.")
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    preflight(args, need_sources=False)
    start_prefect_note()
    from ckptvault_prefect.flows.watch import watch

    process.imports_done()
    result = running.run_flow(watch, 4, config_path=args.config)
    if isinstance(result, BaseException):
        if args.json:
            emit_json({"error": str(result)})
        say(f"watch failed: {result}")
        return EXIT_FAILED
    if args.json:
        emit_json(result.as_dict())
        return EXIT_OK
    print(f"{len(result.alerts)} alert(s); storage ${result.monthly_usd:.2f}/month")
    return EXIT_OK
