"""`ckptvault replicate`: copy the committed saves each `[[replicas]]` store should hold and does not
(docs/FORMAT.md, "Replicas"), without Prefect. Each replica's bucket is checked first: a missing bucket,
refused credentials, an unknown profile or (with `[lock]` on) a bucket without Object Lock is exit 2
naming the replica, before anything is copied; so is (with `expire_after_days`) a bucket whose default
retention outlasts it. The replica's retention rule is installed on its own bucket before its copies
(ckptvault/replication/retention.py). The replicate flow (ckptvault_prefect/flows/replicate.py)
makes the same library calls."""

from __future__ import annotations

import argparse

from ckptvault_cli.output import emit_json, say
from ckptvault_cli.preflight import EXIT_FAILED, EXIT_OK, UsageError, preflight_store


def cmd_replicate(args: argparse.Namespace) -> int:
    from ckptvault.catalog import Catalog
    from ckptvault.errors import CkptvaultError
    from ckptvault.replication import (
        ReplicaPass,
        ReplicateResult,
        ReplicaUnusable,
        open_replica,
        replicate,
        select_replicas,
    )
    from ckptvault.replication.replicas import named
    from ckptvault.store import StoreError
    from ckptvault.tiering.replica_selection import wanted

    cfg, primary = preflight_store(args, need_sources=False)
    try:
        replicas = select_replicas(cfg.replicas, args.replica)
    except ReplicaUnusable as e:
        raise UsageError(str(e)) from None
    if not replicas:
        raise UsageError(
            "no [[replicas]] configured (configured: none). Add one to the configuration: docs/configuration.md"
        )
    stores = []
    for r in replicas:  # every replica checked before any copy
        try:
            stores.append((r, open_replica(r, cfg.lock)))
        except ReplicaUnusable as e:
            raise UsageError(str(e)) from None
        except StoreError as e:  # a transient one too: before any copy, the command stops as preflight does
            raise UsageError(named(r.name, str(e))) from None
    catalog = Catalog(primary, cfg.store.prefix)
    states = catalog.current()
    outcomes: list[tuple[str, ReplicaPass | BaseException]] = []
    for replica, store in stores:
        saves = wanted(states, replica, cfg.policy)
        try:
            p: ReplicaPass | BaseException = replicate(
                primary, cfg.store.prefix, store, replica, saves, cfg.lock, catalog=catalog, hot=not args.from_primary
            )
        except CkptvaultError as e:  # the pass stopped (a save's own failure is in p.failures): go on to the next
            p = e
        outcomes.append((replica.name, p))
        if not args.json:  # each replica's lines as soon as its pass ends
            for bad, line in ReplicateResult.of([(replica.name, p)]).lines():
                if bad:
                    say(line)
                else:
                    print(line)
    result = ReplicateResult.of(outcomes)
    if args.json:
        emit_json(result.as_dict())
    return EXIT_OK if result.ok else EXIT_FAILED
