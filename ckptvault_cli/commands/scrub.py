"""`ckptvault scrub [--sample N] [--repair] [--replica NAME]`: check every object of the rotation's saves
on every copy (the primary and each `[[replicas]]` store holding them) against the manifest, and with
`--repair` rewrite what is missing or bad from a good copy (docs/FORMAT.md, "Scrub and repair"); first,
on every copy whose bucket keeps versions, the tamper check of every committed save (docs/object-lock.md,
"Noticed: the tamper check"), whose findings are sent as `tamper` alerts and set the
`ckptvault_tampered_saves` gauge. Exit 0 when nothing is wrong (or everything was repaired), 1 when a
problem is left or a save was tampered with, 2 on bad input (an unknown replica, one that cannot be
reached as configured, `--sample` under 1)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ckptvault.errors import CkptvaultError
from ckptvault_cli.output import emit_json, say
from ckptvault_cli.preflight import EXIT_FAILED, EXIT_OK, UsageError, preflight_store

if TYPE_CHECKING:
    from ckptvault.replication.scrub import SaveScrub


def _print(s: SaveScrub) -> None:
    from ckptvault.replication.scrub_report import save_lines

    for bad, line in save_lines(s):
        say(line) if bad else print(line)


def cmd_scrub(args: argparse.Namespace) -> int:
    from ckptvault.alerts.sending import send_alerts
    from ckptvault.catalog import Catalog
    from ckptvault.observe.ledger import note_ledger
    from ckptvault.replication.replicas import ReplicaUnusable, open_replica
    from ckptvault.replication.scrub import PRIMARY, Copy
    from ckptvault.replication.scrub_pass import run_scrub
    from ckptvault.replication.scrub_report import (
        choose_copies,
        closing_line,
        tamper_alerts,
        tamper_lines,
        tampered_saves,
    )

    if args.sample is not None and args.sample < 1:
        raise UsageError(f"--sample must be at least 1 (saves per scrub), got {args.sample}")
    cfg, primary = preflight_store(args, need_sources=False)
    # every copy is opened (and checked: exit 2 naming the one that cannot be reached) before anything
    # is read, each being a repair's source; with --replica NAME only the primary and that one
    try:
        choice = choose_copies(cfg.replicas, args.replica)
        copies = [Copy(PRIMARY, primary, cfg.store.prefix)]
        copies += [Copy(r.name, open_replica(r, cfg.lock), r.prefix, r.expire_after_days) for r in choice.replicas]
    except ReplicaUnusable as e:
        raise UsageError(str(e)) from None
    checked = choice.checked
    catalog = Catalog(primary, cfg.store.prefix)
    report = run_scrub(
        copies, checked, catalog.current(), catalog.events(), sample=args.sample, repair=args.repair,
        lock=cfg.lock, catalog=catalog, on_save=None if args.json else _print,
    )  # fmt: skip
    if not args.json:
        for bad, line in tamper_lines(report):
            say(line) if bad else print(line)
    # the tamper alerts are this command's to send (the scrub flow sends them and the scrub_problem ones):
    # deduplicated, so a second scrub finding the same sends nothing
    try:
        send_alerts(cfg, primary, tamper_alerts(report))
    except CkptvaultError as e:  # the scrub is recorded; an unsent alert is said, and sent by the next one
        say(f"ckptvault: could not send the tamper alerts ({e})")
    if (n := tampered_saves(report)) is not None:
        note_ledger(primary, cfg.store.prefix, gauges={"tampered_saves": n}, delete=cfg.store.flows_delete)
    if args.json:
        emit_json(report.as_dict())
    else:
        print(closing_line(report, args.repair))
    return EXIT_OK if report.ok else EXIT_FAILED
