"""The commands that read or append to the catalog without a flow: `ls`, `catalog stats`, `catalog
rebuild` and `accept`."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ckptvault.config import Config
from ckptvault.errors import CkptvaultError
from ckptvault_cli.output import emit_json, say
from ckptvault_cli.preflight import EXIT_OK, UsageError, past_view, preflight_store

if TYPE_CHECKING:
    from ckptvault.catalog import Catalog, CheckpointState  # imported when a command reads it: pyarrow costs start-up
    from ckptvault.store import ObjectStore
    from ckptvault.tiering.store_cost import StoreCosts


def cmd_ls(args: argparse.Namespace) -> int:
    import time

    from ckptvault.catalog import LIFECYCLE_STATES, Catalog
    from ckptvault.catalog.listing import SINCE_EXAMPLES, parse_since, render_table, select

    since = None
    if args.since is not None:
        try:
            since = parse_since(args.since, time.time())
        except ValueError as e:
            raise UsageError(f"--since {e}; give {SINCE_EXAMPLES}") from None
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit {args.limit}: give a number of checkpoint saves, 1 or more (e.g. --limit 20)")
    if args.state and args.state not in LIFECYCLE_STATES:
        raise UsageError(f"--state {args.state!r} is not a state; one of: {', '.join(LIFECYCLE_STATES)}")
    cfg, store = preflight_store(args, need_sources=False)
    past = args.as_of is not None
    if past:  # the catalog as it was, from its objects' versions (docs/object-lock.md, "After an attack")
        store = past_view(store, args.as_of, cfg.store.prefix).store
    catalog = Catalog(store, cfg.store.prefix)
    if args.json:
        # from the Arrow tables, without a CheckpointState per save: the same text, a fraction of the time
        from ckptvault.catalog.table_view import current_table, select_table, write_json_table

        table = select_table(current_table(catalog, args.run), args.state, since, args.limit)
        if not past:  # a view of the past only reads: the alert state is today's
            alert_unreadable(cfg, catalog)
        sys.stdout.flush()
        write_json_table(table, sys.stdout.buffer)  # bytes a slice at a time: no str of the whole document
        sys.stdout.buffer.write(b"\n")  # as print() ended it
        sys.stdout.flush()
        return EXIT_OK
    states = catalog.current(args.run)
    if not past:
        alert_unreadable(cfg, catalog)
    if args.state:
        states = [s for s in states if s.state == args.state]
    states = select(states, since, args.limit)
    given = (("--run", args.run), ("--state", args.state), ("--since", args.since))
    filters = [f"{flag} {v}" for flag, v in given if v]
    print(render_table(states, filters))
    return EXIT_OK


def alert_unreadable(cfg: Config, catalog: Catalog) -> None:
    """Say on stderr which catalog objects could not be read (skipped: the rest is listed), and send a
    `catalog_unreadable` alert per run: deduplicated like every alert, never what makes the command fail."""
    if not catalog.unreadable:
        return
    # only now: the alert channels (slack_sdk among them) are a tenth of a `ls --run`'s start-up
    from ckptvault.alerts import kinds
    from ckptvault.alerts.sending import send_alerts

    for key, why in sorted(catalog.unreadable.items()):
        say(f"ckptvault: warning: skipped the unreadable catalog object {key}: {why}")
    alerts = kinds.catalog_unreadable_by_run(catalog.unreadable_by_run())
    try:
        send_alerts(cfg, catalog.store, alerts)
    except CkptvaultError as e:
        say(f"ckptvault: could not send the catalog_unreadable alert ({e})")


def cmd_catalog_stats(args: argparse.Namespace) -> int:
    from ckptvault import humanize
    from ckptvault.catalog import Catalog

    cfg, store = preflight_store(args, need_sources=False)
    catalog = Catalog(store, cfg.store.prefix)
    st = catalog.stats()
    alert_unreadable(cfg, catalog)
    stores = _store_costs(cfg, store, st.states)
    if args.json:
        emit_json(st.as_dict() | (stores.as_dict() if stores is not None else {}))
        return EXIT_OK
    print(f"{st.runs} runs, {st.checkpoints} checkpoint saves, {st.events} events")
    print(f"catalog objects: {st.event_files} event files, {st.snapshots} snapshots, {st.combined} combined, "
          f"{st.flat_files} in the flat layout, {st.set_aside} set aside "
          f"({humanize.size(st.catalog_bytes)})")  # fmt: skip
    print("by state: " + (", ".join(f"{k} {v}" for k, v in sorted(st.by_state.items())) or "-"))
    for cls, (n, b) in sorted(st.by_class.items()):
        stored = st.stored_by_class.get(cls, b)
        kept = f" ({humanize.size(stored)} stored)" if stored != b else ""  # compressed saves occupy less
        print(f"{cls:20} {n:8} saves  {humanize.size(b)}{kept}")
    # what wrote the saves in the store, as their checkpoints record it (docs/FORMAT.md, "What wrote a save")
    writers = [f"{w} {v}: {n}" for (w, v), (n, _) in sorted(st.by_writer.items())]
    print("by writer: " + (", ".join(writers) or "-") + f"; recording none: {st.writer_unrecorded}")
    if stores is not None:
        print("\n".join(stores.lines()))
    for key in sorted(st.unreadable):
        print(f"unreadable: {key}")
    return EXIT_OK


def _store_costs(cfg: Config, store: ObjectStore, states: list[CheckpointState]) -> StoreCosts | None:
    """Each store's bytes and $/month per class and the replicas' egress; None without replicas (no
    price is looked at then: `catalog stats` prints what it printed before replicas)."""
    import time

    from ckptvault.pricing import load_prices
    from ckptvault.tiering.store_cost import store_costs

    if not cfg.replicas and not any(s.replicas for s in states):
        return None
    kind = cfg.store.kind if cfg.store.kind != "auto" else store.kind()  # the primary's egress price
    return store_costs(states, cfg.store, cfg.policy, cfg.replicas, load_prices(cfg.policy.prices), kind, time.time())


def cmd_catalog_rebuild(args: argparse.Namespace) -> int:
    from ckptvault.catalog import Catalog

    cfg, store = preflight_store(args, need_sources=False)
    when = None
    source = store  # where the manifests are read: the bucket, or with --as-of its view at TIME
    if args.as_of is not None:  # before anything is read: an unversioned bucket is exit 2, nothing written
        from datetime import UTC, datetime

        view = past_view(store, args.as_of, cfg.store.prefix)
        source, when = view.store, f"{datetime.fromtimestamp(view.at, UTC):%Y-%m-%dT%H:%M:%SZ}"
    from ckptvault.catalog import events as event_builders
    from ckptvault.catalog import fold
    from ckptvault.catalog.saves import replay_supersedes
    from ckptvault.transfer.progress import ProgressBar

    # on stderr, and only on a terminal: --json keeps stdout one document
    events = Catalog(source, cfg.store.prefix).rebuild_from_manifests(
        lambda n: ProgressBar(n, "rebuild", unit="manifests")
    )
    # one verified (or invalid) event per manifest, then for a locked save what its HEAD shows
    # (`locked`, `held`): count the manifests
    found = sum(1 for e in events if e.event in ("verified", "invalid"))
    # Manifests say which saves exist, not which are current: replay the commits in the order written.
    replaced = [
        event_builders.superseded(x.state.run, x.state.step, x.state.save, x.reason, *x.by)
        for x in replay_supersedes(fold(events))
    ]
    events += replaced
    # Written into today's catalog, also with --as-of (a view of the past only reads): new event files
    # beside whatever it holds, never over them; the compaction then replaces its snapshots.
    catalog = Catalog(store, cfg.store.prefix)
    key = catalog.append(events) if args.write and events else None
    if key is not None:
        # compacted at once: the first `ls` after a rebuild reads snapshots, not every event it wrote
        catalog.compact_now(
            progress=lambda n: ProgressBar(n, "compact", unit="partitions"), workers=8, deletes=cfg.store.flows_delete
        )
    if args.json:
        emit_json({"saves_found": found, "superseded": len(replaced), "written": key is not None, "key": key,
                   "as_of": when})  # fmt: skip
    elif key is not None:
        then = "" if when is None else f" as they were at {when}"
        print(f"appended {len(events)} events rebuilt from manifests{then} to {key}")
    else:
        then = "" if when is None else f" as they were at {when}"
        if when is not None:  # what the catalog would hold: the saves of that moment, as `ls` lists them
            from ckptvault.catalog.listing import render_table

            print(render_table(fold(events)))
        print(
            f"{found} checkpoint saves found by their manifests{then}, {len(replaced)} of them superseded "
            "(pass --write to append them to the catalog)"
        )
    return EXIT_OK


def cmd_accept(args: argparse.Namespace) -> int:
    """Release a quarantined checkpoint after human review; the next ingest uploads it."""
    import getpass

    from ckptvault.catalog import Catalog, events

    cfg, store = preflight_store(args, need_sources=False)
    catalog = Catalog(store, cfg.store.prefix)
    from ckptvault.catalog import newest_saves

    current = {step: s for (_, step), s in newest_saves(catalog.current(args.run)).items()}
    s = current.get(args.step)
    if s is None or s.state != "invalid":
        shown = "not in the catalog" if s is None else f"in state {s.state!r}"
        raise UsageError(
            f"{args.run} step {args.step} is {shown}; only an invalid (quarantined) checkpoint can be accepted. "
            f"See `ckptvault ls --run {args.run} --state invalid`."
        )
    catalog.append([events.accepted(args.run, args.step, s.format, getpass.getuser(), args.reason, save=s.save)])
    print(f"accepted {args.run} step {args.step}; the next ingest pass uploads it")
    return EXIT_OK
