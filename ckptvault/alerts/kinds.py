"""Alert kinds and the one builder, in one place: `from ckptvault.alerts import kinds as alerts`, then
`alerts.build("ingest_failed", run=..., step=..., error=..., attempts=..., flow_run_url=...)`. The record
lives in ckptvault/alerts/alert.py, the wording in the table of ckptvault/alerts/wording.py; the names
are re-exported here so callers keep one import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from ckptvault.alerts.alert import ALL_RUNS as ALL_RUNS
from ckptvault.alerts.alert import KINDS as KINDS
from ckptvault.alerts.alert import MAX_DETAIL_CHARS as MAX_DETAIL_CHARS
from ckptvault.alerts.alert import MAX_DETAILS as MAX_DETAILS
from ckptvault.alerts.alert import Alert as Alert
from ckptvault.alerts.alert import Severity as Severity
from ckptvault.alerts.alert import escape as escape
from ckptvault.alerts.wording import SEVERITIES, TABLE, render
from ckptvault.errors import InvalidArgumentError


def build(kind: str, *, flow_run_url: str | None = None, **facts: object) -> Alert:
    """The alert of `kind` about `facts` (by name, as its entry in wording.TABLE takes them), linking
    `flow_run_url` when there is one. A fact missing or not the kind's raises TypeError, as a wrong
    argument to a function would: a caller's slip fails where it is made, not in a 3 a.m. message."""
    entry = TABLE.get(kind)
    if entry is None:
        raise InvalidArgumentError(f"unknown alert kind {kind!r}; expected one of {', '.join(KINDS)}")
    missing = [name for name in entry.takes if name not in facts]
    unknown = [name for name in facts if name not in entry.takes and name not in entry.optional]
    slips = ([f"missing {', '.join(missing)}"] if missing else []) + (
        [f"not one of its facts: {', '.join(unknown)}"] if unknown else []
    )
    if slips:
        raise TypeError(f"alert {kind}: " + "; ".join(slips))
    given = {**entry.optional, **facts}
    f = {**given, **(entry.derive(given) if entry.derive else {})}
    severity = render(entry.severity, f)
    if severity not in SEVERITIES:
        raise InvalidArgumentError(f"alert {kind}: severity {severity!r} is none of {', '.join(SEVERITIES)}")
    details = entry.details(f) if callable(entry.details) else [line.format_map(f) for line in entry.details]
    return Alert(
        kind=kind,
        run=cast(str, f.get("run", ALL_RUNS)),
        step=cast("int | None", f.get("step")),
        summary=render(entry.summary, f),
        details=details,
        next_step=render(entry.next_step, f),
        severity=severity,
        flow_run_url=flow_run_url,
        reason=render(entry.reason, f),
    )


def catalog_unreadable_by_run(
    by_run: Mapping[str | None, Mapping[str, str]], flow_run_url: str | None = None
) -> list[Alert]:
    """One `catalog_unreadable` alert per run whose partition holds unreadable objects (`None`, the flat
    layout: ALL_RUNS), in run order: what every command that reads the catalog sends (`Catalog.unreadable_by_run`)."""
    return [
        build("catalog_unreadable", run=run or ALL_RUNS, objects=objs, flow_run_url=flow_run_url)
        for run, objs in sorted(by_run.items(), key=str)
    ]
