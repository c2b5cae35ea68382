"""`ckptvault blocks backfill [--run R] [--step N] [--json]`: give the committed saves that have no
`_BLOCKS.json` (committed before block checksums existed, or whose sidecar does not verify) one, read
from their objects and checked against their manifests (docs/FORMAT.md, "Block checksums"). Exit 0
when every save has a verified sidecar or needs none, 1 when one could not get one (a damaged or an
archived object: each named), 2 on bad input (a run or step the catalog does not have)."""

from __future__ import annotations

import argparse

from ckptvault_cli.output import emit_json, say
from ckptvault_cli.preflight import EXIT_FAILED, EXIT_OK, UsageError, preflight_store


def cmd_blocks_backfill(args: argparse.Namespace) -> int:
    from ckptvault.catalog import Catalog
    from ckptvault.humanize import size
    from ckptvault.replication.blocks_backfill import backfill

    if args.step is not None and args.run is None:
        raise UsageError("--step needs --run: which run's step (see `ckptvault ls`)")
    cfg, store = preflight_store(args, need_sources=False)
    states = Catalog(store, cfg.store.prefix).current(args.run)
    if args.run is not None and not any(args.step is None or s.step == args.step for s in states):
        where = args.run if args.step is None else f"{args.run} step {args.step}"
        raise UsageError(f"{where} is not in the catalog. See `ckptvault ls --run {args.run}`.")
    done = backfill(store, cfg.store.prefix, states, run=args.run, step=args.step)
    failed = [d for d in done if d.outcome == "failed"]
    if args.json:
        emit_json({"saves": [d.as_dict() for d in done], "failed": len(failed)})
    else:
        for d in done:
            line = f"{d.run} step {d.step} save {d.save}: {d.outcome}"
            if d.outcome == "written":
                line += f" ({d.files} files, {size(d.bytes_read)} read)"
            if d.outcome == "failed":
                say(f"{line}: {d.detail}")
            else:
                print(line)
        written = sum(d.outcome == "written" for d in done)
        print(f"{len(done)} saves: {written} sidecars written, {len(failed)} failed")
    return EXIT_FAILED if failed else EXIT_OK
