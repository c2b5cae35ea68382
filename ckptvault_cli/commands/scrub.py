"""`ckptvault scrub [--sample N] [--repair] [--replica NAME]`: check every object of the rotation's saves
on every copy (the primary and each `[[replicas]]` store holding them) against the manifest, and with
`--repair` rewrite what is missing or bad from a good copy (docs/FORMAT.md, "Scrub and repair"). Exit 0
when nothing is wrong (or everything was repaired), 1 when a problem is left, 2 on bad input (an unknown
replica, one that cannot be reached as configured, `--sample` under 1)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ckptvault_cli.output import emit_json, say
from ckptvault_cli.preflight import EXIT_FAILED, EXIT_OK, UsageError, preflight_store

if TYPE_CHECKING:
    from ckptvault.replication.scrub import SaveScrub


def _label(s: SaveScrub) -> str:
    return f"{s.run} step {s.step}" + (f" save {s.save}" if s.save > 1 else "")


def _print(s: SaveScrub) -> None:
    for c in s.copies:
        n = c.counts()
        how = f"{n['read']} read whole, {n['size_only']} archived or without a CRC32C: size only"
        for p in c.problems:
            fixed = p.path in c.repaired
            line = f"{c.store}: {_label(s)}: {p.path}: {p.why}" + (" -> repaired" if fixed else "")
            print(line) if fixed else say(line)
        for path, why in c.left.items():
            if not any(p.path == path and p.why == why for p in c.problems):
                say(f"{c.store}: {_label(s)}: {path}: {why}")
        state = "OK" if c.ok else f"{len(c.left)} problem(s) left"
        print(f"{c.store}: {_label(s)}: {n['objects']} objects checked ({how}): {state}")


def cmd_scrub(args: argparse.Namespace) -> int:
    from ckptvault.catalog import Catalog
    from ckptvault.replication.replicas import ReplicaUnusable, open_replica
    from ckptvault.replication.scrub import PRIMARY, Copy
    from ckptvault.replication.scrub_pass import run_scrub

    if args.sample is not None and args.sample < 1:
        raise UsageError(f"--sample must be at least 1 (saves per scrub), got {args.sample}")
    cfg, primary = preflight_store(args, need_sources=False)
    names = [PRIMARY, *(r.name for r in cfg.replicas)]
    if args.replica is not None and args.replica not in names:
        raise UsageError(
            f"no [[replicas]] entry is named {args.replica!r} (copies: {', '.join(names)}). Name one of them, or "
            "leave --replica out to scrub every copy"
        )
    # every copy is opened (and checked: exit 2 naming the one that cannot be reached) before anything
    # is read, each being a repair's source; with --replica NAME only the primary and that one
    wanted = [r for r in cfg.replicas if args.replica in (None, PRIMARY, r.name)]
    copies = [Copy(PRIMARY, primary, cfg.store.prefix)]
    try:
        copies += [Copy(r.name, open_replica(r, cfg.lock), r.prefix) for r in wanted]
    except ReplicaUnusable as e:
        raise UsageError(str(e)) from None
    checked = [c.name for c in copies] if args.replica is None else [args.replica]
    catalog = Catalog(primary, cfg.store.prefix)
    report = run_scrub(
        copies, checked, catalog.current(), catalog.events(), sample=args.sample, repair=args.repair,
        lock=cfg.lock, catalog=catalog, on_save=None if args.json else _print,
    )  # fmt: skip
    if args.json:
        emit_json(report.as_dict())
    else:
        sel = report.selection
        runs = f"{sel.window} scrub" + ("s" if sel.window != 1 else "")
        print(
            f"scrubbed {len(report.saves)} of {sel.scrubbable} saves on {', '.join(checked)} (sample {sel.sample}, "
            f"{len(sel.rechecked)} rechecked: every save within {runs}): {report.found} problem(s) "
            f"found, {len(report.repairs)} repaired, {report.left} left"
            + ("" if report.ok or args.repair else "; `ckptvault scrub --repair` rewrites them from a good copy")
        )
    return EXIT_OK if report.ok else EXIT_FAILED
