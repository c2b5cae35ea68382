"""Prefect events of what the flows did to checkpoints, for Prefect automations to act on (docs/metrics.md,
"Prefect events"): `ckptvault.checkpoint.verified`, `.invalid`, `.superseded`, `.drill.failed`,
`.drill.passed`, `.restored`, `.transitioned`, `.expired` and `.replicated`, each about one save as its
resource, `ckptvault.checkpoint.<run>.<step>.<save>`, labelled with its run, step and save, and related
to its run (`ckptvault.run.<run>`, role `run`); and `ckptvault.run.stale`, about a run.

The library returns what happened (the catalog events an ingest pass recorded, drill results, a
restore's result); the flows call these functions once they have it, so an event says what the
catalog recorded or the flow finished, never what was merely attempted. Prefect adds the flow run,
flow and deployment as related resources itself. An event is a notification, not a record: one that
cannot be sent is logged and the flow goes on (the catalog and the alerts are the record).

In direct mode (the command line with no Prefect API, ckptvault_cli/running.py) nothing is emitted:
there is no server to receive events, and Prefect's emitter would start a temporary one (10-30 s); nor
is Prefect imported here for it (its import is 1-3 s of such a command's start).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ckptvault.alerts.alert import Alert
from ckptvault.catalog import Event as CatalogEvent
from ckptvault.replication import ReplicateResult
from ckptvault.restore.drill import DrillResult
from ckptvault.restore.result import RestoreResult
from ckptvault_prefect.tasks.step import in_direct_mode

if TYPE_CHECKING:
    from prefect.events import Event

log = logging.getLogger("ckptvault.events")

CHECKPOINT = "ckptvault.checkpoint"
VERIFIED = f"{CHECKPOINT}.verified"
INVALID = f"{CHECKPOINT}.invalid"
SUPERSEDED = f"{CHECKPOINT}.superseded"
DRILL_FAILED = f"{CHECKPOINT}.drill.failed"
RESTORED = f"{CHECKPOINT}.restored"
DRILL_PASSED = f"{CHECKPOINT}.drill.passed"
TRANSITIONED = f"{CHECKPOINT}.transitioned"
EXPIRED = f"{CHECKPOINT}.expired"
REPLICATED = f"{CHECKPOINT}.replicated"
RUN_STALE = "ckptvault.run.stale"
NAMES = (VERIFIED, INVALID, SUPERSEDED, DRILL_FAILED, RESTORED, DRILL_PASSED, TRANSITIONED, EXPIRED, REPLICATED,
         RUN_STALE)  # fmt: skip


def resource(run: str, step: int, save: int) -> dict[str, str]:
    """The save an event is about. The labels carry the parts, so an automation can match a run
    (`ckptvault.run`) without parsing the id (a run name may itself hold dots)."""
    return {
        "prefect.resource.id": f"{CHECKPOINT}.{run}.{step}.{save}",
        "prefect.resource.name": f"{run} step {step} save {save}",
        "ckptvault.run": run,
        "ckptvault.step": str(step),
        "ckptvault.save": str(save),
    }


def related(run: str) -> list[dict[str, str]]:
    return [{"prefect.resource.id": f"ckptvault.run.{run}", "prefect.resource.role": "run", "ckptvault.run": run}]


def emit(name: str, run: str, step: int, save: int, payload: Mapping[str, Any]) -> Event | None:
    """One event about save (run, step, save); the Event sent, or None (direct mode, or not sent)."""
    return _emit(name, resource(run, step, save), related(run), payload, f"{run} step {step} save {save}")


def run_resource(run: str) -> dict[str, str]:
    """A run an event is about (`ckptvault.run.stale`): the id saves' events relate to, and its label."""
    return {"prefect.resource.id": f"ckptvault.run.{run}", "prefect.resource.name": run, "ckptvault.run": run}


def _emit(
    name: str, res: dict[str, str], rel: list[dict[str, str]], payload: Mapping[str, Any], what: str
) -> Event | None:
    if in_direct_mode():
        return None
    from prefect.events import emit_event  # here: direct mode imports no Prefect

    try:
        return emit_event(name, resource=res, related=rel, payload=dict(payload))
    except Exception as e:  # a notification that failed must not fail the flow that did the work
        log.warning("could not emit the Prefect event %s for %s: %s", name, what, e)
        return None


def _sent(events: Iterable[Event | None]) -> list[Event]:
    return [e for e in events if e is not None]


def _detail(e: CatalogEvent) -> dict[str, Any]:
    try:
        got = json.loads(e.detail) if e.detail else {}
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}


def recorded(catalog_events: Iterable[CatalogEvent]) -> list[Event]:
    """The ingest pass's, from the catalog events it recorded (IngestPass.recorded): each save committed
    (`.verified`), each quarantined (`.invalid`: once, when the rejection is recorded, not on every pass
    that sees it again), each save a commit superseded (`.superseded`). Other kinds: nothing."""
    out: list[Event | None] = []
    for e in catalog_events:
        d = _detail(e)
        if e.event == "verified":
            payload = {"format": e.format, "bytes": e.bytes, "stored_bytes": e.stored_bytes or e.bytes,
                       "files": e.files, "storage_class": e.storage_class, "created_at": e.created_at}  # fmt: skip
            out.append(emit(VERIFIED, e.run, e.step, e.save, payload))
        elif e.event == "invalid":
            payload = {"format": e.format, "bytes": e.bytes, "files": e.files, "reasons": d.get("reasons", [])}
            out.append(emit(INVALID, e.run, e.step, e.save, payload))
        elif e.event == "superseded":
            payload = {"reason": d.get("reason", ""), "by_step": d.get("by_step"), "by_save": d.get("by_save")}
            out.append(emit(SUPERSEDED, e.run, e.step, e.save, payload))
        elif e.event == "transitioned":  # the tier flow's: a client copy done, or a scheduled move seen done
            payload = {"storage_class": e.storage_class, "mode": d.get("mode", ""), "reason": d.get("reason", "")}
            out.append(emit(TRANSITIONED, e.run, e.step, e.save, payload))
        elif e.event == "expired":
            payload = {"reason": d.get("reason", ""), "objects": d.get("objects")}
            out.append(emit(EXPIRED, e.run, e.step, e.save, payload))
    return _sent(out)


def replicated(result: ReplicateResult) -> list[Event]:
    """The replicate flow's: each save committed on a replica by this pass (`.replicated`), and each one a
    killed pass had committed there without recording it, recorded now (bytes 0: nothing sent now)."""
    return _sent(
        emit(REPLICATED, s.run, s.step, s.save, {"store": s.store, "key": s.key, "bytes": s.bytes,
                                                 "seconds": round(s.seconds, 3), "recovered": s in p.recorded})
        for p in result.passes
        for s in (*p.copied, *p.recorded)
    )  # fmt: skip


def stale(alerts: Sequence[Alert]) -> list[Event]:
    """The watch flow's: each run it found stale (`ckptvault.run.stale`), once per episode (and again on
    each pass until its alert is delivered: the watch re-raises it until then)."""
    return _sent(
        _emit(RUN_STALE, run_resource(a.run), [], {"summary": a.summary, "details": list(a.details), "step": a.step},
              f"run {a.run}")
        for a in alerts
        if a.kind == "run_stale" and a.run
    )  # fmt: skip


def drilled(results: Sequence[DrillResult]) -> list[Event]:
    """The drill's: each save whose drill failed (`.drill.failed`), with its problems and whether it is now
    suspect (not after a broken resume check: docs/drills.md, "Resume check"); each that passed (`.drill.passed`)."""
    return _sent(
        emit(DRILL_FAILED, r.run, r.step, r.save, {"problems": list(r.problems), "copy": r.store, "bytes": r.bytes,
                                                   "suspect": not r.save_ok})
        if not r.ok
        else emit(DRILL_PASSED, r.run, r.step, r.save, {"copy": r.store, "bytes": r.bytes,
                                                        "seconds": round(r.seconds, 3)})
        for r in results
    )  # fmt: skip


def restored(result: RestoreResult) -> list[Event]:
    """The restore's, once every byte is back and verified (`.restored`); a restore still thawing: none."""
    if result.status != "restored":
        return []
    payload = {"dest": result.dest, "bytes": result.bytes, "files": result.files, "copy": result.source,
               "fallbacks": len(result.fallbacks)}  # fmt: skip
    return _sent([emit(RESTORED, result.run, result.step, result.save, payload)])
