"""`ckptvault ls`: the catalog's current state as a table or as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ckptvault import humanize
from ckptvault.catalog import CheckpointState


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def as_record(s: CheckpointState) -> dict[str, Any]:
    return {
        "run": s.run,
        "step": s.step,
        "save": s.save,
        "format": s.format,
        "state": s.state,
        "last_event": s.last_event,
        "bytes": s.bytes,
        "files": s.files,
        "storage_class": s.storage_class,
        "created_at": _iso(s.created_at),
        "uploaded_at": _iso(s.uploaded_at),
        "verified": s.verified,
        "last_drill_ok": s.last_drill_ok,
        "last_drill_at": _iso(s.last_drill_at),
        "superseded_reason": s.superseded_reason or None,
    }


def render_json(states: Sequence[CheckpointState]) -> str:
    return json.dumps([as_record(s) for s in states], indent=1)


def render_table(states: Sequence[CheckpointState]) -> str:
    if not states:
        return "(no checkpoints in the catalog yet)"
    header = ("RUN", "STEP", "SAVE", "FORMAT", "STATE", "LAST EVENT", "SIZE", "FILES", "CLASS", "UPLOADED")
    rows = [
        (
            s.run,
            str(s.step),
            str(s.save),
            s.format,
            s.state,
            s.last_event,
            humanize.size(s.bytes),
            str(s.files),
            s.storage_class or "-",
            _iso(s.uploaded_at) or "-",
        )
        for s in states
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)
