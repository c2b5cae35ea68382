"""`ckptvault recover --since TIME [--apply]`: what changed in ckptvault's keys after TIME, and what undoing
it would do (ckptvault/history/recovery.py), from the bucket's versions; with `--apply`, the undo carried
out (ckptvault/history/apply.py), each step printed as it is done."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ckptvault_cli.output import emit_json
from ckptvault_cli.preflight import EXIT_FAILED, EXIT_OK, UsageError, past_view, preflight_store

if TYPE_CHECKING:
    from ckptvault.config import Config
    from ckptvault.history.apply import Applied, Step
    from ckptvault.history.created import NewKey
    from ckptvault.history.recovery import RecoveryPlan
    from ckptvault.store import ObjectStore, ObjectVersion


def cmd_recover(args: argparse.Namespace) -> int:
    from ckptvault.history.apply import ContentCheck, apply_plan
    from ckptvault.history.created import check_created
    from ckptvault.history.recovery import survey
    from ckptvault.replication.scrub import PRIMARY

    cfg, store = preflight_store(args, need_sources=False)
    prefix = cfg.store.prefix
    if args.replica not in (None, PRIMARY):
        store, prefix = _replica(cfg, args.replica)
    view = past_view(store, args.since, prefix, flag="--since")
    # the same test of "reads as it did" with and without --apply, so a dry run after an apply says none
    plan = survey(store, prefix, view.at, args.run, same_content=ContentCheck(store))
    since = datetime.fromtimestamp(view.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    where = f"s3://{store.bucket}/{prefix}".rstrip("/")
    applied: Applied | None = None
    if args.apply:
        if not args.json:
            print(f"undoing the changes to {where} since {since}", flush=True)
        applied = apply_plan(store, plan, on_step=_quiet if args.json else _print_step)
    news = {n.key: n for n in check_created(store, plan.created, prefix)} if args.json or applied is None else {}
    if args.json:
        emit_json(_document(plan, since, args.run, applied, news))
    elif applied is None:
        print(_report(plan, since, where, news))
    else:
        print(_summary(plan, applied, since))
    return EXIT_FAILED if applied is not None and applied.failed else EXIT_OK


def _replica(cfg: Config, name: str) -> tuple[ObjectStore, str]:
    """`--replica NAME`: that copy's store and prefix; exit 2 naming the copies on a name of none."""
    from ckptvault.replication.replicas import ReplicaUnusable, open_replica
    from ckptvault.replication.scrub import PRIMARY

    found = next((r for r in cfg.replicas if r.name == name), None)
    if found is None:
        names = ", ".join([PRIMARY, *(r.name for r in cfg.replicas)])
        raise UsageError(f"--replica: no [[replicas]] entry is named {name!r} (copies: {names}); name one of them")
    try:
        return open_replica(found, cfg.lock), found.prefix
    except ReplicaUnusable as e:
        raise UsageError(f"--replica {name}: {e}") from None


def _quiet(s: Step) -> None:
    pass


def _print_step(s: Step) -> None:
    print(f"  {s.action}: {s.key}  ({s.detail})", flush=True)  # flushed: a kill leaves what was done said


def _summary(plan: RecoveryPlan, applied: Applied, since: str) -> str:
    lines = []
    if not applied.done and not applied.failed:
        lines.append("  nothing to do: every key of a committed save reads as it did then")
    if applied.failed:
        lines.append(f"  failed: {len(applied.failed)} (nothing of them changed; run it again once fixed)")
        lines += [f"    {f.key}: {f.why}" for f in applied.failed]
    if any(x.role.value == "catalog" for x in plan.left):
        lines.append(
            f"  the catalog was rewritten since: `ckptvault catalog rebuild --as-of {since} --write` makes it again "
            "from the manifests as they were"
        )
    if plan.created:
        n = len(plan.created)
        lines.append(f"  {n} key(s) new since {since} kept: `ckptvault recover --since {since}` lists them")
    lines.append("verify: `ckptvault ls`, then `ckptvault drill` (docs/runbook.md)")
    return "\n".join(lines)


def _version(v: ObjectVersion) -> dict[str, Any]:
    return {"version_id": v.version_id, "last_modified": v.last_modified, "delete_marker": v.delete_marker}


def _verdict(n: NewKey | None) -> str:
    if n is None or n.verifies is None:
        return n.why if n else ""
    return f"verifies: {n.why}" if n.verifies else f"DOES NOT VERIFY: {n.why}"


def _document(
    plan: RecoveryPlan, since: str, run: str | None, applied: Applied | None, news: dict[str, NewKey]
) -> dict[str, Any]:
    return {
        "since": since,
        "run": run,
        "remove_markers": [
            {
                "key": r.key,
                "role": r.role.value,
                "markers": [m.version_id for m in r.markers],
                "uncovers": _version(r.uncovers),
            }
            for r in plan.remove_markers
        ],
        "put_back": [
            {"key": p.key, "role": p.role.value, "version": _version(p.version), "over": _version(p.over)}
            for p in plan.put_back
        ],
        "created": [
            {"key": c.key, "now": _version(c.now), "verifies": news[c.key].verifies, "why": news[c.key].why}
            for c in plan.created
        ],
        "left": [{"key": x.key, "role": x.role.value, "change": x.kind.value, "why": x.why} for x in plan.left],
        "applied": applied is not None,
        "done": [{"action": d.action, "key": d.key, "detail": d.detail} for d in applied.done] if applied else [],
        "failed": [{"key": f.key, "why": f.why} for f in applied.failed] if applied else [],
    }


def _report(plan: RecoveryPlan, since: str, where: str, news: dict[str, NewKey]) -> str:
    lines = [f"changes to {where} since {since}: the plan, nothing changed"]
    if plan.empty and not plan.created and not plan.left:
        return "\n".join([*lines, "  none: every key reads as it did then"])
    sections: list[tuple[str, list[str]]] = [
        ("delete markers to remove (the version current then reads again)",
         [f"{r.key}  ({r.role.value}; {len(r.markers)} marker{'s' if len(r.markers) > 1 else ''})"
          for r in plan.remove_markers]),
        ("versions to put back over newer data (copied, checked against the save's manifest)",
         [f"{p.key}  ({p.role.value}; version {p.version.version_id})" for p in plan.put_back]),
        ("new since, kept (each verified against its save's manifest where it has one)",
         [f"{c.key}: {_verdict(news.get(c.key))}" for c in plan.created]),
        ("left as they are", [f"{x.key}: {x.kind.value}; {x.why}" for x in plan.left]),
    ]  # fmt: skip
    for title, items in sections:
        if items:
            lines.append(f"  {title}: {len(items)}")
            lines += [f"    {item}" for item in items]
    if not plan.empty:
        lines.append(
            f"`ckptvault recover --since {since} --apply` carries it out; meanwhile `ckptvault restore RUN --as-of "
            f"{since} --dest DIR` and `ckptvault ls --as-of {since}` read every save as it was (docs/runbook.md)."
        )
    return "\n".join(lines)
