"""The Prometheus metrics from the catalog (ckptvault/observe/metrics.py, docs/metrics.md), on the in-memory store:
the exposition text parsed back with prometheus_client's own parser and its values checked against the
catalog's events, `catalog stats` and the per-state definitions on `CheckpointState`."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ckptvault.catalog import Catalog, Event, events
from ckptvault.observe.metrics import MetricsOptions, MetricsServerError, registry_for, serve_metrics
from ckptvault.pricing import load_prices
from ckptvault.store import MemoryStore

NOW = 1_000_000.0
DAY = 86400.0
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _saved(run: str, step: int, created: float, verified: float, nbytes: int, stored: int = 0, cls: str = "STANDARD",
           files: int = 2, save: int = 1) -> list[Event]:  # fmt: skip
    return [
        Event(run, step, "verified", verified, bytes=nbytes, files=files, storage_class=cls, stored_bytes=stored,
              created_at=created, save=save),
    ]  # fmt: skip


def _replicated(run: str, step: int, store: str) -> Event:
    return events.replicated(run, step, 1, store=store, key=f"{run}/{step}", nbytes=1, seconds=1.0,
                             storage_class="STANDARD")  # fmt: skip


def _scrape(cat: Catalog, options: MetricsOptions | None = None) -> Samples:
    text = generate_latest(registry_for(lambda: cat, options or MetricsOptions(), clock=lambda: NOW)).decode()
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def cat() -> Catalog:
    c = Catalog(MemoryStore("b"), "vault")
    c.append([
        # run a: two good saves, the newest verified at NOW - 600 (created 300 s earlier), drilled ok
        *_saved("a", 100, NOW - 2 * DAY - 100, NOW - 2 * DAY, 1000),
        *_saved("a", 200, NOW - 900, NOW - 600, 4000, stored=2500),
        Event("a", 100, "drilled", NOW - DAY, ok=True),
        # run b: archived in GLACIER, its newest drill failed (suspect), an older one superseded
        *_saved("b", 10, NOW - 10 * DAY - 50, NOW - 10 * DAY, 8000, cls="GLACIER", files=3),
        *_saved("b", 20, NOW - 9 * DAY - 7200, NOW - 9 * DAY, 9000, cls="GLACIER", files=3),
        Event("b", 10, "superseded", NOW - 9 * DAY),
        Event("b", 20, "drilled", NOW - 3 * DAY, ok=True),
        Event("b", 20, "drilled", NOW - 2 * DAY, ok=False),
        # run c: one save rejected, one pending, one expired: nothing good, never drilled
        Event("c", 1, "invalid", NOW - 500),
        Event("c", 2, "discovered", NOW - 400),
        *_saved("c", 3, NOW - 40 * DAY, NOW - 40 * DAY + 60, 500),
        Event("c", 3, "expired", NOW - DAY),
    ])  # fmt: skip
    return c


def test_per_run_gauges_follow_the_catalog(cat: Catalog) -> None:
    m = _scrape(cat)
    assert m[("ckptvault_catalog_up", ())] == 1.0
    assert m[("ckptvault_runs", ())] == 3.0
    assert m[("ckptvault_run_newest_verified_timestamp_seconds", (("run", "a"),))] == NOW - 600
    assert m[("ckptvault_run_newest_verified_created_timestamp_seconds", (("run", "a"),))] == NOW - 900
    assert m[("ckptvault_run_newest_archive_lag_seconds", (("run", "a"),))] == 300.0
    # b's only good-looking save is suspect, the other superseded: no newest good save at all
    assert ("ckptvault_run_newest_verified_timestamp_seconds", (("run", "b"),)) not in m
    assert ("ckptvault_run_newest_verified_timestamp_seconds", (("run", "c"),)) not in m
    assert m[("ckptvault_run_last_drill_timestamp_seconds", (("run", "a"),))] == NOW - DAY
    assert m[("ckptvault_run_last_drill_success", (("run", "a"),))] == 1.0
    assert m[("ckptvault_run_last_drill_timestamp_seconds", (("run", "b"),))] == NOW - 2 * DAY
    assert m[("ckptvault_run_last_drill_success", (("run", "b"),))] == 0.0
    # b's pass three days ago was overwritten in the state by the failure: the last success known is none
    assert ("ckptvault_run_drill_last_success_timestamp_seconds", (("run", "b"),)) not in m
    assert m[("ckptvault_run_drill_last_success_timestamp_seconds", (("run", "a"),))] == NOW - DAY
    assert ("ckptvault_run_last_drill_success", (("run", "c"),)) not in m
    assert m[("ckptvault_run_suspect_saves", (("run", "b"),))] == 1.0
    assert m[("ckptvault_run_suspect_saves", (("run", "a"),))] == 0.0
    assert not [k for k in m if any(label in ("step", "key", "save") for label, _ in k[1])]


def test_states_and_classes_equal_the_fold_and_catalog_stats(cat: Catalog) -> None:
    cat.compact(time.time() + 10, runs=["a"])  # one run from its snapshot, the others from events
    m = _scrape(cat, MetricsOptions(prices=load_prices()))
    states = cat.current()
    for state in ("pending", "invalid", "accepted", "verified", "suspect", "superseded", "expired"):
        want = sum(1 for s in states if s.state == state)
        assert m[("ckptvault_saves", (("state", state),))] == want, state
    assert m[("ckptvault_saves", (("state", "suspect"),))] == 1.0
    st = cat.stats()
    assert {k[1][0][1]: v for k, v in m.items() if k[0] == "ckptvault_class_bytes"} == {
        c: float(b) for c, (_, b) in st.by_class.items()
    }
    assert {k[1][0][1]: v for k, v in m.items() if k[0] == "ckptvault_class_stored_bytes"} == {
        c: float(b) for c, b in st.stored_by_class.items()
    }
    assert m[("ckptvault_class_saves", (("class", "GLACIER"),))] == 2.0
    prices = load_prices()
    want_glacier = prices.monthly_cost(8000, "GLACIER", 3) + prices.monthly_cost(9000, "GLACIER", 3)
    assert m[("ckptvault_class_monthly_cost_usd", (("class", "GLACIER"),))] == pytest.approx(want_glacier)
    want_std = prices.monthly_cost(1000, "STANDARD", 2) + prices.monthly_cost(2500, "STANDARD", 2)
    assert m[("ckptvault_class_monthly_cost_usd", (("class", "STANDARD"),))] == pytest.approx(want_std)


def test_lag_histogram_and_drill_coverage(cat: Catalog) -> None:
    m = _scrape(cat, MetricsOptions(cover_days=2.5))
    # in the store: a's two (100 s, 300 s) and b's two (50 s, 7200 s); c's expired one is not
    assert m[("ckptvault_archive_lag_seconds_count", ())] == 4.0
    assert m[("ckptvault_archive_lag_seconds_sum", ())] == 7650.0
    assert m[("ckptvault_archive_lag_seconds_bucket", (("le", "300.0"),))] == 3.0
    assert m[("ckptvault_archive_lag_seconds_bucket", (("le", "3600.0"),))] == 3.0
    assert m[("ckptvault_archive_lag_seconds_bucket", (("le", "7200.0"),))] == 4.0
    # drillable: a/100, a/200, b/20 (suspect); within 2.5 days: a/100 (1 d), b/20 (2 d); a/200 never
    assert m[("ckptvault_drillable_saves", ())] == 3.0
    assert m[("ckptvault_drill_never_drilled_saves", ())] == 1.0
    assert m[("ckptvault_drill_coverage_ratio", ())] == pytest.approx(2 / 3)
    narrow = _scrape(cat, MetricsOptions(cover_days=1.5))
    assert narrow[("ckptvault_drill_coverage_ratio", ())] == pytest.approx(1 / 3)
    assert ("ckptvault_class_monthly_cost_usd", (("class", "STANDARD"),)) not in m  # no prices given


def test_replica_saves_per_store(cat: Catalog) -> None:
    cat.append([_replicated("a", 100, "dr"), _replicated("a", 200, "dr"), _replicated("a", 200, "offsite")])
    m = _scrape(cat)
    assert m[("ckptvault_replica_saves", (("store", "dr"),))] == 2.0
    assert m[("ckptvault_replica_saves", (("store", "offsite"),))] == 1.0


def test_an_empty_catalog_and_an_unreadable_one() -> None:
    m = _scrape(Catalog(MemoryStore("b"), "vault"))
    assert m[("ckptvault_catalog_up", ())] == 1.0
    assert m[("ckptvault_runs", ())] == 0.0
    assert m[("ckptvault_drill_coverage_ratio", ())] == 1.0
    assert m[("ckptvault_archive_lag_seconds_count", ())] == 0.0

    class Broken(MemoryStore):
        def list(self, prefix: str, *a: object, **k: object):  # type: ignore[no-untyped-def, override]
            from ckptvault.store.errors import StoreError

            raise StoreError("the store is down")

    m = _scrape(Catalog(Broken("b"), "vault"))
    assert m == {("ckptvault_catalog_up", ()): 0.0}


def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def test_the_server_computes_every_scrape_from_the_catalog(cat: Catalog) -> None:
    server, _ = serve_metrics("127.0.0.1", 0, lambda: cat, MetricsOptions())
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        status, ctype, text = _get(url)
        assert status == 200 and ctype.startswith("text/plain")
        m = {
            (s.name, tuple(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples
        }
        assert m[("ckptvault_run_newest_verified_timestamp_seconds", (("run", "a"),))] == NOW - 600
        assert m[("ckptvault_runs", ())] == 3.0
        # a save committed after the first scrape is in the next one: nothing cached, nothing pushed
        cat.append(_saved("d", 1, time.time() - 60, time.time(), 10))
        text = _get(url)[2]
        m = {
            (s.name, tuple(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples
        }
        assert m[("ckptvault_runs", ())] == 4.0
        assert ("ckptvault_run_newest_verified_timestamp_seconds", (("run", "d"),)) in m

        with pytest.raises(
            MetricsServerError, match=rf"\[metrics\] cannot listen on 127.0.0.1 port {server.server_port}"
        ):
            serve_metrics("127.0.0.1", server.server_port, lambda: cat, MetricsOptions())
    finally:
        server.shutdown()
        server.server_close()


def test_thresholds_from_the_config_are_exported_for_the_rules(cat: Catalog) -> None:
    m = _scrape(cat, MetricsOptions(stale_after={"a": 6 * 3600.0}, budget_usd_per_month=250.0))
    assert m[("ckptvault_run_stale_after_seconds", (("run", "a"),))] == 21600.0
    assert ("ckptvault_run_stale_after_seconds", (("run", "b"),)) not in m  # b is not watched
    assert m[("ckptvault_budget_usd_per_month", ())] == 250.0
    assert ("ckptvault_budget_usd_per_month", ()) not in _scrape(cat)


def test_counters_from_the_catalog_and_the_ledger(cat: Catalog) -> None:
    from ckptvault.observe import ledger

    m = _scrape(cat)
    # every save ever committed, expired and superseded ones included (c's only save expired)
    assert m[("ckptvault_ingest_bytes_total", (("run", "a"),))] == 5000.0
    assert m[("ckptvault_ingest_bytes_total", (("run", "b"),))] == 17000.0
    assert m[("ckptvault_ingest_bytes_total", (("run", "c"),))] == 500.0
    # a bucket from before the ledger: the unlabelled counters are 0, no flow has a last success
    assert m[("ckptvault_restore_bytes_total", ())] == 0.0
    assert not any(name == "ckptvault_flow_last_success_timestamp_seconds" for name, _ in m)

    ledger.record_ledger(cat.store, "vault", ledger.alerts_sent(["run_stale", "run_stale"]), delete=True, now=NOW)
    ledger.record_ledger(cat.store, "vault", {"drill_bytes": 150, "drill_seconds": 3}, "drill", delete=True, now=NOW)
    ledger.record_ledger(cat.store, "vault", {"upload_failures|StoreTimeoutError": 1}, None, delete=False, now=NOW)
    ledger.record_ledger(cat.store, "vault", {"restore_bytes": 4096, "restore_seconds": 2}, "restore", delete=False,
                         now=NOW + 5)  # fmt: skip
    m = _scrape(cat)
    assert m[("ckptvault_alerts_sent_total", (("kind", "run_stale"),))] == 2.0
    assert m[("ckptvault_drill_bytes_total", ())] == 150.0
    assert m[("ckptvault_drill_seconds_total", ())] == 3.0
    assert m[("ckptvault_restore_bytes_total", ())] == 4096.0
    assert m[("ckptvault_upload_failures_total", (("error_class", "StoreTimeoutError"),))] == 1.0
    assert m[("ckptvault_flow_last_success_timestamp_seconds", (("flow", "drill"),))] == NOW
    assert m[("ckptvault_flow_last_success_timestamp_seconds", (("flow", "restore"),))] == NOW + 5


def test_each_runs_newest_good_save_exports_its_rpo(cat: Catalog) -> None:
    assert not [k for k in _scrape(cat) if k[0] == "ckptvault_run_newest_rpo_seconds"]  # none recorded yet
    cat.append([
        Event("a", 300, "verified", NOW - 60, bytes=10, created_at=NOW - 70, detail='{"rpo_seconds": 4.5}'),
        Event("b", 30, "verified", NOW - 50, bytes=10, created_at=NOW - 900, detail='{"rpo_seconds": 812.25}'),
        # c's newest good save is an older step committed later: the newest is by commit, not by step
        Event("c", 5, "verified", NOW - 40, bytes=10, created_at=NOW - 50, detail='{"rpo_seconds": 9.0}'),
        Event("c", 4, "verified", NOW - 30, bytes=10, created_at=NOW - 60, detail='{"rpo_seconds": 30.0}'),
    ])  # fmt: skip
    want = {"a": 4.5, "b": 812.25, "c": 30.0}
    m = _scrape(cat)
    assert {k[1][0][1]: v for k, v in m.items() if k[0] == "ckptvault_run_newest_rpo_seconds"} == want
    cat.compact(time.time() + 10, runs=["a", "b"])  # read back from the snapshots' column alike
    m = _scrape(cat)
    assert {k[1][0][1]: v for k, v in m.items() if k[0] == "ckptvault_run_newest_rpo_seconds"} == want
    # a newer save whose ingest recorded none (a `catalog rebuild`): the run's gauge is absent, not stale
    cat.append([Event("a", 400, "verified", NOW - 10, bytes=10, created_at=NOW - 20)])
    assert ("ckptvault_run_newest_rpo_seconds", (("run", "a"),)) not in _scrape(cat)


def _wrote(run: str, step: int, at: float, nbytes: int, written_by: dict[str, str] | None) -> Event:
    detail = json.dumps({"written_by": written_by}) if written_by else ""
    return Event(run, step, "verified", at, bytes=nbytes, files=1, storage_class="STANDARD", created_at=at - 1,
                 detail=detail)  # fmt: skip


def test_saves_by_writer_equal_catalog_stats_from_events_and_snapshots() -> None:
    """ckptvault_saves_by_writer{writer,version} and `catalog stats --json`'s by_writer count the saves in the
    store by the versions their verified event records (a save under each pair it records; an expired one
    not at all; one that records none only in writer_unrecorded), whether the run is read from its events
    or from a compacted snapshot (written_by as a JSON text column)."""
    c = Catalog(MemoryStore("b"), "vault")
    c.append([
        _wrote("h", 1, NOW - 500, 100, {"transformers": "4.57.1"}),
        _wrote("h", 2, NOW - 400, 200, {"transformers": "4.57.1"}),
        _wrote("h", 3, NOW - 300, 300, {"transformers": "5.0.0"}),
        _wrote("h", 0, NOW - 900, 50, {"transformers": "4.40.0"}),
        Event("h", 0, "expired", NOW - 100),
        _wrote("m", 7, NOW - 200, 1000, {"megatron-core.torch_dist": "1", "torch.dcp": "2.0.0"}),
        _wrote("o", 1, NOW - 100, 10, None),
    ])  # fmt: skip
    want = {("transformers", "4.57.1"): 2.0, ("transformers", "5.0.0"): 1.0,
            ("megatron-core.torch_dist", "1"): 1.0, ("torch.dcp", "2.0.0"): 1.0}  # fmt: skip
    records = [
        {"writer": "megatron-core.torch_dist", "version": "1", "checkpoints": 1, "bytes": 1000},
        {"writer": "torch.dcp", "version": "2.0.0", "checkpoints": 1, "bytes": 1000},
        {"writer": "transformers", "version": "4.57.1", "checkpoints": 2, "bytes": 300},
        {"writer": "transformers", "version": "5.0.0", "checkpoints": 1, "bytes": 300},
    ]
    for compacted in (False, True):
        if compacted:
            c.compact(time.time() + 10, runs=["h", "m"])
        m = _scrape(c)
        labels = {k[1]: v for k, v in m.items() if k[0] == "ckptvault_saves_by_writer"}
        got = {(dict(k)["writer"], dict(k)["version"]): v for k, v in labels.items()}
        assert got == want, compacted
        st = c.stats().as_dict()
        assert st["by_writer"] == records and st["writer_unrecorded"] == 1, compacted
