"""ckptvault_prefect/runtime/events.py, the Prefect events the flows emit (docs/metrics.md, "Prefect events"),
captured by Prefect's own asserting events client (what prefect.testing.fixtures' asserting_events_worker
installs): the names, the save as resource, its run as label and related resource, the payloads; only
what happened (a committed save, a recorded rejection, a failed drill, a finished restore); nothing in
direct mode, where emitting would start a temporary Prefect server; a failed emission never fails a flow;
and the example automations (infra/prefect/ckptvault-automations.yaml) valid and matching those events.
tests/flows/test_prefect_events.py reads them back from a real Prefect API after the flows ran."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import prefect.client.orchestration
import pytest
import yaml
from prefect.events import Event
from prefect.events.clients import AssertingEventsClient
from prefect.events.schemas.automations import AutomationCore, EventTrigger
from prefect.events.schemas.events import Resource
from prefect.events.worker import EventsWorker

from ckptvault.catalog import Event as CatalogEvent
from ckptvault.catalog import events as catalog_events
from ckptvault.restore.drill import DrillResult
from ckptvault.restore.result import RestoreResult
from ckptvault_prefect.runtime import events
from ckptvault_prefect.tasks.step import direct_mode

AUTOMATIONS = Path(__file__).resolve().parents[2] / "infra" / "prefect" / "ckptvault-automations.yaml"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], list[Event]]]:
    """What was emitted: every EventsWorker is one whose client records events (as Prefect's
    asserting_events_worker fixture does); calling the result drains the worker and returns them. The
    worker also opens an API client, to name a flow run's resources when one is running (none here):
    with no API configured that would start a temporary Prefect server, so it gets one that is never
    asked anything."""
    monkeypatch.setattr(prefect.client.orchestration, "get_client", lambda *a, **k: _Unused())
    worker = EventsWorker.instance(AssertingEventsClient)
    monkeypatch.setattr(EventsWorker, "instance", lambda *_: worker)
    drained = False

    def got() -> list[Event]:
        nonlocal drained
        worker.drain()
        drained = True
        assert isinstance(worker._client, AssertingEventsClient)
        return list(worker._client.events)

    yield got
    if not drained:
        worker.drain()


class _Unused:
    """An API client for a worker outside any flow run, where it is opened and closed, never called."""

    async def __aenter__(self) -> _Unused:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def _named(got: list[Event]) -> list[tuple[str, str]]:
    return [(e.event, e.resource.id) for e in got]


def test_an_ingest_pass_emits_what_it_recorded(sent: Callable[[], list[Event]]) -> None:
    recorded = [
        catalog_events.rejected("r", 300, "hf", 1000, 2, 50.0, ["size_band: half the previous size"], "fr", save=1),
        catalog_events.rejected("r", 400, "hf", 1000, 2, 60.0, ["a gate warned"], "fr", kind="warned", save=1),
        CatalogEvent("r", 400, "verified", 70.0, format="hf", bytes=4000, files=2, storage_class="STANDARD",
                     created_at=65.0, save=1),
        catalog_events.superseded("r", 200, 1, "step 200 was saved again as save 2", 200, 2, "fr"),
        catalog_events.accepted("r", 300, "hf", "me", "reviewed"),
    ]  # fmt: skip
    returned = events.recorded(recorded)
    got = sent()
    assert _named(got) == [
        ("ckptvault.checkpoint.invalid", "ckptvault.checkpoint.r.300.1"),
        ("ckptvault.checkpoint.verified", "ckptvault.checkpoint.r.400.1"),
        ("ckptvault.checkpoint.superseded", "ckptvault.checkpoint.r.200.1"),
    ]  # the warning and the acceptance are not among the five
    assert [e.id for e in returned] == [e.id for e in got]
    invalid, verified, superseded = got
    assert dict(verified.resource) == {
        "prefect.resource.id": "ckptvault.checkpoint.r.400.1", "prefect.resource.name": "r step 400 save 1",
        "ckptvault.run": "r", "ckptvault.step": "400", "ckptvault.save": "1",
    }  # fmt: skip
    assert [(r.id, r.role, r["ckptvault.run"]) for r in verified.related] == [("ckptvault.run.r", "run", "r")]
    assert verified.payload == {"format": "hf", "bytes": 4000, "stored_bytes": 4000, "files": 2,
                                "storage_class": "STANDARD", "created_at": 65.0}  # fmt: skip
    assert invalid.payload["reasons"] == ["size_band: half the previous size"]
    assert superseded.payload == {"reason": "step 200 was saved again as save 2", "by_step": 200, "by_save": 2}


def test_a_drill_emits_its_failures_and_a_restore_its_end(sent: Callable[[], list[Event]]) -> None:
    results = [
        DrillResult("a", 100, 1, True, 1.0, 10),
        DrillResult("b", 200, 2, False, 1.0, 20, problems=("model.safetensors: CRC32C mismatch",), store="cold"),
    ]
    events.drilled(results)
    done = RestoreResult("a", 100, 1, (), "/restore/a", "", {}, "restored", bytes=10, files=3, source="primary")
    events.restored(done)
    events.restored(RestoreResult("a", 100, 1, (), "/restore/b", "", {}, "thawing", frozen=3))  # not yet: none
    got = sent()
    assert _named(got) == [
        ("ckptvault.checkpoint.drill.passed", "ckptvault.checkpoint.a.100.1"),
        ("ckptvault.checkpoint.drill.failed", "ckptvault.checkpoint.b.200.2"),
        ("ckptvault.checkpoint.restored", "ckptvault.checkpoint.a.100.1"),
    ]
    assert got[0].payload == {"copy": "primary", "bytes": 10, "seconds": 1.0}
    assert got[1].payload == {"problems": ["model.safetensors: CRC32C mismatch"], "copy": "cold", "bytes": 20,
                              "suspect": True}  # fmt: skip
    assert got[1].resource["ckptvault.run"] == "b"
    assert got[2].payload == {"dest": "/restore/a", "bytes": 10, "files": 3, "copy": "primary", "fallbacks": 0}
    assert {e.event for e in got} <= set(events.NAMES)


def test_tier_replicate_and_watch_emit_what_they_did(sent: Callable[[], list[Event]]) -> None:
    from ckptvault.alerts import kinds as alerts
    from ckptvault.checkpoint.manifest import Manifest
    from ckptvault.replication import ReplicaPass, ReplicatedSave, ReplicateResult

    manifest = Manifest(run="r", step=100, format="hf", files=(), created_at=1.0, uploaded_at=2.0,
                        source="/ckpt/checkpoint-100", save=2)  # fmt: skip
    tiered = [
        catalog_events.transitioned(manifest, "GLACIER", "older than 30 days", "client", "fr"),
        catalog_events.expired("r", 50, "older than 90 days", 3, "fr"),
        catalog_events.evicted_local("r", 50, "hot copy evicted", "/ckpt/checkpoint-50", "fr"),  # not an event
    ]
    events.recorded(tiered)
    copied = ReplicatedSave("dr", "r", 100, 2, "dr/r/step-0000000100.save-2/_MANIFEST.json", 4096, 1.5, 3, 0)
    found = ReplicatedSave("dr", "r", 90, 1, "dr/r/step-0000000090/_MANIFEST.json", 0, 0.0, 0, 2)
    events.replicated(ReplicateResult((ReplicaPass("dr", copied=[copied], recorded=[found]),)))
    stale = alerts.build(
        "run_stale", run="llama.7b", newest_at=1000.0, stale_after_hours=6, now=1000.0 + 7 * 3600, step=500
    )
    events.stale([stale, alerts.build("run_recovered", run="other", stale_since=1.0, newest_at=2.0)])
    got = sent()
    assert _named(got) == [
        ("ckptvault.checkpoint.transitioned", "ckptvault.checkpoint.r.100.2"),
        ("ckptvault.checkpoint.expired", "ckptvault.checkpoint.r.50.1"),
        ("ckptvault.checkpoint.replicated", "ckptvault.checkpoint.r.100.2"),
        ("ckptvault.checkpoint.replicated", "ckptvault.checkpoint.r.90.1"),
        ("ckptvault.run.stale", "ckptvault.run.llama.7b"),
    ]
    assert got[0].payload == {"storage_class": "GLACIER", "mode": "client", "reason": "older than 30 days"}
    assert got[1].payload == {"reason": "older than 90 days", "objects": 3}
    assert got[2].payload == {"store": "dr", "key": copied.key, "bytes": 4096, "seconds": 1.5, "recovered": False}
    assert got[3].payload["recovered"] is True
    assert got[4].resource["ckptvault.run"] == "llama.7b" and got[4].payload["step"] == 500
    assert got[4].payload["summary"] == stale.summary
    assert {e.event for e in got} <= set(events.NAMES)


def test_nothing_is_emitted_in_direct_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_worker(*_: Any) -> Any:  # the worker would start a temporary Prefect server with no API set
        raise AssertionError("an events worker was asked for in direct mode")

    monkeypatch.setattr(EventsWorker, "instance", no_worker)
    with direct_mode():
        assert events.drilled([DrillResult("b", 200, 1, False, 1.0, 20)]) == []
        assert events.recorded([CatalogEvent("r", 1, "verified", 1.0)]) == []


def test_an_event_that_cannot_be_sent_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_: Any) -> Any:
        raise RuntimeError("the events socket is closed")

    monkeypatch.setattr(EventsWorker, "instance", broken)
    assert events.drilled([DrillResult("b", 200, 1, False, 1.0, 20)]) == []  # returned, not raised
    assert "ckptvault.checkpoint.drill.failed" in caplog.text and "the events socket is closed" in caplog.text


def test_the_example_automations_are_valid_and_match_the_events_sent() -> None:
    doc = yaml.safe_load(AUTOMATIONS.read_text())
    automations = [AutomationCore.model_validate(a) for a in doc["automations"]]  # Prefect's own schema
    by_name = {a.name: a for a in automations}
    assert len(by_name) == len(automations) >= 2
    for a in automations:
        trigger = a.trigger
        assert isinstance(trigger, EventTrigger) and trigger.expect and trigger.expect <= set(events.NAMES), a.name
    drill = by_name["ckptvault: a restore drill failed"].trigger
    evaluate = by_name["ckptvault: evaluate each archived checkpoint"].trigger
    assert isinstance(drill, EventTrigger) and isinstance(evaluate, EventTrigger)
    assert drill.expect == {events.DRILL_FAILED}
    assert drill.match.matches(Resource(events.resource("any-run", 200, 1)))
    assert evaluate.expect == {events.VERIFIED}
    assert evaluate.match.matches(Resource(events.resource("llama-7b", 1000, 1)))
    assert not evaluate.match.matches(Resource(events.resource("gpt-small", 1000, 1)))  # not its run
    stale = by_name["ckptvault: a run stopped checkpointing"].trigger
    assert isinstance(stale, EventTrigger) and stale.expect == {events.RUN_STALE}
    assert stale.match.matches(Resource(events.run_resource("llama.7b")))
