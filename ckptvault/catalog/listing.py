"""`ckptvault ls`: the catalog's current state as a table or as JSON."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ckptvault import humanize
from ckptvault.catalog.model import CheckpointState, ReplicaCopy


def _iso(t: float | None) -> str | None:
    # time.gmtime, not datetime: the same text (seconds floored either way), a third of the cost, and
    # `ls --json` formats three per save
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
SINCE_EXAMPLES = "a date (2026-11-01), an ISO time (2026-11-01T12:00:00Z) or a duration back from now (7d, 12h, 30m)"


def parse_since(text: str, now: float) -> float:
    """`ls --since`: unix seconds from a date (midnight UTC), an ISO 8601 time (UTC when it names no
    offset) or a duration back from `now` (`<number><s|m|h|d|w>`). ValueError when it is none of them."""
    t = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", t)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        when = datetime.fromisoformat(t)
    except ValueError:
        raise ValueError(f"{text!r} is neither a time nor a duration") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def when(s: CheckpointState) -> float:
    """What `--since` and `--limit` go by: when the training job wrote the save, or, when no event said
    (a save seen only by a rebuild from old manifests), its first upload, else its last event."""
    if s.created_at is not None:
        return s.created_at
    return s.uploaded_at if s.uploaded_at is not None else s.updated_at


def select(states: Sequence[CheckpointState], since: float | None, limit: int | None) -> list[CheckpointState]:
    """Saves written at or after `since`, then the `limit` newest of them (by `when`, ties to the higher
    step), listed in the catalog's (run, step, save) order like every other listing."""
    out = [s for s in states if since is None or when(s) >= since]
    if limit is not None and len(out) > limit:
        keep = {s.key for s in sorted(out, key=lambda s: (when(s), s.step, s.save), reverse=True)[:limit]}
        out = [s for s in out if s.key in keep]
    return out


def as_record(s: CheckpointState) -> dict[str, Any]:
    return {
        "run": s.run,
        "step": s.step,
        "save": s.save,
        "format": s.format,
        "state": s.state,
        "last_event": s.last_event,
        "bytes": s.bytes,
        "stored_bytes": s.billed_bytes,  # in the store: fewer than `bytes` when compressed
        "files": s.files,
        "storage_class": s.storage_class,
        "created_at": _iso(s.created_at),
        "uploaded_at": _iso(s.uploaded_at),
        "verified": s.verified,
        "last_drill_ok": s.last_drill_ok,
        "last_drill_at": _iso(s.last_drill_at),
        "superseded_reason": s.superseded_reason or None,
        "locked_until": _iso(s.locked_until),  # as ckptvault set it; null: no Object Lock recorded
        "legal_hold": s.legal_hold,
        "copies": s.copies,  # the primary's (verified, not expired) and each replica's
        "replicas": replica_records(s.replicas),
        "rpo_ms": _ms(s.rpo_seconds),  # commit on the hot tier to the manifest's; null: not recorded
        # what `restore --only model` / `--only optimizer` would bring back; null: the layout cannot tell
        "model_bytes": s.model_bytes,
        "optimizer_bytes": s.optimizer_bytes,
        # what the checkpoint records of what wrote it (docs/FORMAT.md, "What wrote a save"); {}: nothing
        "written_by": s.written_by,
    }


def _ms(seconds: float | None) -> int | None:
    """Seconds as whole milliseconds (an integer prints the same from Python and Arrow), or None."""
    return None if seconds is None else round(seconds * 1000)


def replica_records(replicas: Sequence[ReplicaCopy]) -> list[dict[str, Any]]:
    """The copies on replicas as `ls --json` lists them (docs/replicas.md)."""
    return [
        {"store": r.store, "storage_class": r.storage_class, "verified_at": _iso(r.verified_at),
         "retain_until": _iso(r.retain_until)}
        for r in replicas
    ]  # fmt: skip


def render_json(states: Sequence[CheckpointState]) -> str:
    """One JSON list, a save per line. Not json.dumps(indent=...): with an indent the standard library
    encodes in pure Python, 10-20 s for 200,000 saves here, where its C encoder per record takes ~1 s."""
    if not states:
        return "[]"
    return "[\n" + ",\n".join(json.dumps(as_record(s)) for s in states) + "\n]"


def nothing_listed(filters: Sequence[str]) -> str:
    """What `ls` prints when no save is listed. With filters (`--run R` and the like, as typed) a
    mistyped run name must not read as an empty catalog."""
    if not filters:
        return "(no checkpoints in the catalog yet)"
    return f"(no checkpoint save matches {' '.join(filters)}; `ckptvault ls` without them lists every run)"


def render_table(states: Sequence[CheckpointState], filters: Sequence[str] = ()) -> str:
    if not states:
        return nothing_listed(filters)
    header: tuple[str, ...] = (
        "RUN", "STEP", "SAVE", "FORMAT", "STATE", "LAST EVENT", "SIZE", "STORED", "FILES", "CLASS", "UPLOADED",
    )  # fmt: skip
    rows: list[tuple[str, ...]] = [
        (
            s.run,
            str(s.step),
            str(s.save),
            s.format,
            s.state,
            s.last_event,
            humanize.size(s.bytes),
            humanize.size(s.billed_bytes) if s.stored_bytes else "=",  # "=": stored as it is
            str(s.files),
            s.storage_class or "-",
            _iso(s.uploaded_at) or "-",
        )
        for s in states
    ]
    if any(s.rpo_seconds is not None for s in states):
        # only where an ingest recorded one (docs/hooks.md): a catalog from before keeps its columns
        header = (*header, "RPO")
        rows = [(*r, rpo_text(s.rpo_seconds)) for r, s in zip(rows, states, strict=True)]
    if any(s.replicas for s in states):
        # only where replicas are configured: a listing without them keeps its columns
        header = (*header, "COPIES")
        rows = [(*r, _copies(s)) for r, s in zip(rows, states, strict=True)]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)


def rpo_text(seconds: float | None) -> str:
    """A save's RPO as the text `ls` shows it: tenths of a second while it is seconds (a hook's and
    `follow`'s), whole units beyond (the scheduled ingest's minutes); "-" where none was recorded."""
    if seconds is None:
        return "-"
    return f"{seconds:.1f} s" if seconds < 60 else humanize.duration(seconds)


def _copies(s: CheckpointState) -> str:
    """How many stores hold the save, and which: "2 (primary, ceph-dr)"."""
    names = (["primary"] if s.verified else []) + [r.store for r in s.replicas]
    return f"{s.copies} ({', '.join(names)})" if names else "0"
