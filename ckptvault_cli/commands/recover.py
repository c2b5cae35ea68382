"""`ckptvault recover --since TIME`: what changed in ckptvault's keys after TIME, and what undoing it would
do (ckptvault/history/recovery.py), from the bucket's versions; read-only."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ckptvault_cli.output import emit_json
from ckptvault_cli.preflight import EXIT_OK, past_view, preflight_store

if TYPE_CHECKING:
    from ckptvault.history.recovery import RecoveryPlan
    from ckptvault.store import ObjectVersion


def cmd_recover(args: argparse.Namespace) -> int:
    from ckptvault.history.recovery import survey

    cfg, store = preflight_store(args, need_sources=False)
    view = past_view(store, args.since, cfg.store.prefix, flag="--since")
    plan = survey(store, cfg.store.prefix, view.at, args.run)
    since = datetime.fromtimestamp(view.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if args.json:
        emit_json(_document(plan, since, args.run))
    else:
        print(_report(plan, since, f"s3://{store.bucket}/{cfg.store.prefix}".rstrip("/")))
    return EXIT_OK


def _version(v: ObjectVersion) -> dict[str, Any]:
    return {"version_id": v.version_id, "last_modified": v.last_modified, "delete_marker": v.delete_marker}


def _document(plan: RecoveryPlan, since: str, run: str | None) -> dict[str, Any]:
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
        "created": [{"key": c.key, "now": _version(c.now)} for c in plan.created],
        "left": [{"key": x.key, "role": x.role.value, "change": x.kind.value, "why": x.why} for x in plan.left],
        "applied": False,
    }


def _report(plan: RecoveryPlan, since: str, where: str) -> str:
    lines = [f"changes to {where} since {since}: the plan, nothing changed"]
    if plan.empty and not plan.created and not plan.left:
        return "\n".join([*lines, "  none: every key reads as it did then"])
    sections: list[tuple[str, list[str]]] = [
        ("delete markers to remove (the version current then reads again)",
         [f"{r.key}  ({r.role.value}; {len(r.markers)} marker{'s' if len(r.markers) > 1 else ''})"
          for r in plan.remove_markers]),
        ("versions to put back over newer data (copied, checked against the save's manifest)",
         [f"{p.key}  ({p.role.value}; version {p.version.version_id})" for p in plan.put_back]),
        ("new since, kept", [c.key for c in plan.created]),
        ("left as they are", [f"{x.key}: {x.kind.value}; {x.why}" for x in plan.left]),
    ]  # fmt: skip
    for title, items in sections:
        if items:
            lines.append(f"  {title}: {len(items)}")
            lines += [f"    {item}" for item in items]
    lines.append(
        "Carrying the plan out in the bucket is not yet in ckptvault; meanwhile `ckptvault restore RUN --as-of "
        f"{since} --dest DIR` and `ckptvault ls --as-of {since}` read every save as it was (docs/runbook.md)."
    )
    return "\n".join(lines)
