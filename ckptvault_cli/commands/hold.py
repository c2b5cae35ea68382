"""`ckptvault hold` and `ckptvault release`: a legal hold on every object of a committed save
(ckptvault/objectlock/legal_hold.py), recorded in the catalog with the reason and the user."""

from __future__ import annotations

import argparse

from ckptvault.errors import CkptvaultError
from ckptvault_cli.output import say
from ckptvault_cli.preflight import EXIT_OK, UsageError, preflight_store


def cmd_hold(args: argparse.Namespace) -> int:
    return _hold(args, on=True)


def cmd_release(args: argparse.Namespace) -> int:
    return _hold(args, on=False)


def _hold(args: argparse.Namespace, *, on: bool) -> int:
    import getpass

    from ckptvault.alerts import kinds
    from ckptvault.alerts.sending import send_alerts
    from ckptvault.catalog import Catalog, events
    from ckptvault.objectlock.legal_hold import HoldError, set_legal_hold

    cfg, store = preflight_store(args, need_sources=False)
    catalog = Catalog(store, cfg.store.prefix)
    saves = {s.save: s for s in catalog.current(args.run) if s.step == args.step}
    if not saves:
        raise UsageError(f"{args.run} step {args.step} is not in the catalog. See `ckptvault ls --run {args.run}`.")
    save = args.save if args.save is not None else max(saves)
    if save not in saves:
        listed = ", ".join(map(str, sorted(saves)))
        raise UsageError(f"{args.run} step {args.step} has no save {save} (its saves: {listed}).")
    try:
        n = set_legal_hold(store, cfg.store.prefix, args.run, args.step, save, on)
    except HoldError as e:
        raise UsageError(str(e)) from None
    who = getpass.getuser()
    catalog.append([events.held(args.run, args.step, save, saves[save].format, who, args.reason, n, on)])
    verb = "held" if on else "released"
    print(f"{verb} {args.run} step {args.step} save {save}: {n} objects ({args.reason}; by {who})")
    alert = kinds.build(
        "legal_hold", run=args.run, step=args.step, save=save, on=on, who=who, why=args.reason, objects=n
    )
    try:
        send_alerts(cfg, store, [alert])
    except CkptvaultError as e:  # the hold is set and recorded: an unsent alert does not undo it
        say(f"ckptvault: could not send the legal_hold alert ({e})")
    return EXIT_OK
