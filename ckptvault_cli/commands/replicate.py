"""`ckptvault replicate`: copy the committed saves each `[[replicas]]` store should hold and does not
(docs/FORMAT.md, "Replicas"), without Prefect. Each replica's bucket is checked first: a missing bucket,
refused credentials, an unknown profile or (with `[lock]` on) a bucket without Object Lock is exit 2
naming the replica, before anything is copied."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ckptvault.humanize import size
from ckptvault_cli.output import emit_json, say
from ckptvault_cli.preflight import EXIT_FAILED, EXIT_OK, UsageError, preflight_store

if TYPE_CHECKING:
    from ckptvault.config import Config, ReplicaConfig
    from ckptvault.store import ObjectStore


def _named(replica: ReplicaConfig, message: str) -> str:
    return message if f"replica {replica.name}" in message else f"replica {replica.name}: {message}"


def _open_replica(cfg: Config, replica: ReplicaConfig) -> ObjectStore:
    """The replica's store, checked as preflight checks [store]: every problem is a UsageError naming it."""
    from ckptvault.lock_probe_cache import ProbeCache
    from ckptvault.save_lock import lock_problem
    from ckptvault.store import StoreError, open_store

    try:
        store = open_store(replica)
        store.check_bucket()
        problem = lock_problem(cfg.lock, store, ProbeCache.of(replica))
    except StoreError as e:
        raise UsageError(_named(replica, str(e))) from None
    if problem:
        raise UsageError(_named(replica, problem))
    return store


def cmd_replicate(args: argparse.Namespace) -> int:
    from ckptvault.catalog import Catalog
    from ckptvault.replication import replicate
    from ckptvault.tiering.replica_selection import wanted

    cfg, primary = preflight_store(args, need_sources=False)
    replicas = [r for r in cfg.replicas if args.replica in (None, r.name)]
    if not replicas:
        known = ", ".join(r.name for r in cfg.replicas) or "none"
        what = f"no [[replicas]] entry is named {args.replica!r}" if args.replica else "no [[replicas]] configured"
        raise UsageError(f"{what} (configured: {known}). Add one to the configuration: docs/configuration.md")
    stores = [(r, _open_replica(cfg, r)) for r in replicas]  # every replica checked before any copy
    catalog = Catalog(primary, cfg.store.prefix)
    states = catalog.current()
    passes = []
    for replica, store in stores:
        p = replicate(
            primary, cfg.store.prefix, store, replica, wanted(states, replica, cfg.policy), cfg.lock, catalog=catalog
        )
        passes.append(p)
        if not args.json:
            for s in p.copied:
                print(
                    f"{replica.name}: {s.run} step {s.step} save {s.save}: {s.copied} objects copied, {s.kept} kept, "
                    f"{size(s.bytes)} in {s.seconds:.1f} s"
                )
            for s in p.recorded:
                print(f"{replica.name}: {s.run} step {s.step} save {s.save}: committed by an earlier pass, recorded")
            for save, why in p.failed.items():
                say(f"{replica.name}: {save} FAILED: {why}")
            if p.copied or p.failed:
                print(
                    f"{replica.name}: {len(p.copied)} saves copied, {p.present} already there, {len(p.failed)} failed"
                )
            else:
                print(f"{replica.name}: nothing to copy ({p.present} saves already there)")
    if args.json:
        emit_json({"replicas": [p.as_dict() for p in passes]})
    return EXIT_FAILED if any(p.failed for p in passes) else EXIT_OK
