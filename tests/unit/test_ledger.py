"""The metrics' ledger (ckptvault/observe/ledger.py, docs/FORMAT.md "The ledger") on the in-memory store: what each
record adds, the merge of concurrent writers, the fold of closed days into the base, writers without
deletes, unreadable objects, and the counts each flow's result gives."""

from __future__ import annotations

from ckptvault.ingest.steps import Outcome, ledger_counts
from ckptvault.observe import ledger
from ckptvault.observe.ledger import Entry, Ledger, counter_key, load, merge, record_ledger
from ckptvault.restore.drill import DrillReport, DrillResult
from ckptvault.restore.result import RestoreResult
from ckptvault.store import MemoryStore, TransientStoreError

DAY = 86400.0
T0 = 1_796_000_000.0  # a UTC day's 00:00 + some hours, 2026-11


def _objects(store: MemoryStore) -> list[str]:
    return sorted(o.key for o in store.list("vault/_state/ledger/"))


def test_records_add_up_and_fold_into_one_object() -> None:
    store = MemoryStore("b")
    assert load(store, "vault") == Ledger()  # a bucket from before the ledger: every counter 0
    record_ledger(store, "vault", ledger.alerts_sent(["run_stale", "run_stale", "drill_failed"]), delete=True, now=T0)
    record_ledger(store, "vault", {"drill_bytes": 100, "drill_seconds": 2.5}, "drill", delete=True, now=T0 + 60)
    record_ledger(store, "vault", None, "drill", delete=True, now=T0 + 120)
    got = load(store, "vault")
    assert got.totals() == {
        "alerts_sent|run_stale": 2.0, "alerts_sent|drill_failed": 1.0, "drill_bytes": 100.0, "drill_seconds": 2.5
    }  # fmt: skip
    assert got.last_success == {"drill": T0 + 120}
    assert len(_objects(store)) == 1  # each record with deletes folds what it read


def test_closed_days_fold_into_the_base_and_counts_stay_exact() -> None:
    store = MemoryStore("b")
    for d in range(5):
        record_ledger(store, "vault", {"restore_bytes": 10}, "restore", delete=True, now=T0 + d * DAY)
    got = load(store, "vault")
    assert got.totals() == {"restore_bytes": 50.0}
    assert got.through == ledger.day_of(T0 + 2 * DAY)  # days 0-2 are in the base, 3 and 4 still entries
    assert got.base == {"restore_bytes": 30.0} and len(got.entries) == 2


def test_concurrent_writers_without_deletes_lose_and_double_nothing() -> None:
    store = MemoryStore("b")
    record_ledger(store, "vault", {"drill_bytes": 1}, "drill", delete=True, now=T0)
    # two writers without deletes: each writes its own entry, reads nothing, deletes nothing
    record_ledger(store, "vault", {"drill_bytes": 2}, None, delete=False, now=T0 + 10)
    record_ledger(store, "vault", {"drill_bytes": 4}, "watch", delete=False, now=T0 + 20)
    assert len(_objects(store)) == 3
    assert load(store, "vault").totals() == {"drill_bytes": 7.0}
    # a writer that may delete (tier) three days later folds them all, the base included, into one
    record_ledger(store, "vault", None, "tier", delete=True, now=T0 + 3 * DAY)
    assert len(_objects(store)) == 1
    got = load(store, "vault")
    assert got.totals() == {"drill_bytes": 7.0} and got.base == {"drill_bytes": 7.0} and not got.entries
    assert got.last_success == {"drill": T0, "watch": T0 + 20, "tier": T0 + 3 * DAY}


def test_the_merge_is_order_free_and_idempotent() -> None:
    old = Ledger({"ingest": 5.0}, "", {}, {"x": Entry("x", "2026-11-01", {"drill_bytes": 3.0})})
    folded = Ledger(
        {"ingest": 9.0}, "2026-11-02", {"drill_bytes": 3.0}, {"y": Entry("y", "2026-11-03", {"drill_bytes": 1.0})}
    )
    late = Ledger({}, "", {}, {"y": Entry("y", "2026-11-03", {"drill_bytes": 1.0})})
    for parts in ([old, folded, late], [late, folded, old], [folded, old, old, late, folded]):
        m = merge(parts)
        assert m.totals() == {"drill_bytes": 4.0}  # x is in the base once; y counted once
        assert m.last_success == {"ingest": 9.0}
    assert merge([merge([old, folded]), late]) == merge([old, folded, late])
    assert Ledger.from_json(folded.to_json()) == folded


def test_an_unreadable_object_is_skipped_and_never_deleted() -> None:
    store = MemoryStore("b")
    bad = "vault/_state/ledger/00000000000000000001-" + "0" * 32 + ".json"
    store.put_bytes(bad, b"{not json")
    record_ledger(store, "vault", {"drill_bytes": 1}, delete=True, now=T0)
    assert bad in _objects(store)
    assert load(store, "vault").totals() == {"drill_bytes": 1.0}


def test_what_each_flow_counts() -> None:
    outcomes = [
        Outcome("r", 1, "hf", "uploaded", 10),
        Outcome("r", 2, "hf", "failed", 10, error="StoreTimeoutError"),
        Outcome("r", 3, "hf", "failed", 10, error="StoreTimeoutError"),
        Outcome("r", 4, "hf", "failed", 10),  # from before the error class was kept
    ]
    assert ledger_counts(outcomes) == {"upload_failures|StoreTimeoutError": 2.0, "upload_failures|Unknown": 1.0}
    cov = None
    report = DrillReport((DrillResult("r", 1, 1, True, 2.0, 100), DrillResult("r", 2, 1, False, 1.0, 50)), (), cov)  # type: ignore[arg-type]
    assert report.ledger_counts() == {"drill_bytes": 150.0, "drill_seconds": 3.0}
    done = RestoreResult("r", 1, 1, (), "/d", "", {}, "restored", bytes=4096)
    assert done.ledger_counts(2.0) == {"restore_bytes": 4096.0, "restore_seconds": 2.0}
    assert RestoreResult("r", 1, 1, (), "/d", "", {}, "thawing").ledger_counts(2.0) == {}
    assert counter_key("restore_failures", "NotFoundError") == "restore_failures|NotFoundError"


def test_alerts_delivered_are_counted_and_a_role_without_deletes_sends_none() -> None:
    from ckptvault.alerts import kinds as alerts
    from ckptvault.alerts.sending import send_alerts
    from ckptvault.config import Config, StoreConfig
    from tests.helpers import deny_deletes

    store = MemoryStore("bkt")
    tier = store.under("")
    attempted = deny_deletes(store)
    cfg = Config(store=StoreConfig(bucket="bkt", prefix="vault", deletes="tier-only"))
    hold = alerts.build("legal_hold", run="r", step=10, save=1, on=True, who="ops", why="incident 7", objects=3)
    assert send_alerts(cfg, store, [hold]) == 1  # the console channel delivers it
    assert send_alerts(cfg, store, []) == 0  # nothing delivered: nothing recorded
    record_ledger(store, "vault", {"drill_bytes": 5}, "drill", delete=False)
    assert attempted == [] and len(_objects(store)) == 2
    assert load(store, "vault").totals() == {"alerts_sent|legal_hold": 1.0, "drill_bytes": 5.0}
    record_ledger(tier, "vault", None, "tier", delete=True)  # the tier role folds them into one
    assert len(_objects(store)) == 1
    assert load(store, "vault").totals() == {"alerts_sent|legal_hold": 1.0, "drill_bytes": 5.0}


def test_a_failed_restore_is_counted_by_its_error_class(monkeypatch: object) -> None:
    """Direct mode (the command line without Prefect) ends a failed flow through hooks.alert_failed, as a
    Prefect flow run's failure hook does: a restore's failure is counted there; another flow's is not."""
    from types import SimpleNamespace
    from typing import Any

    import pytest

    from ckptvault.config import Config, StoreConfig
    from ckptvault.store import StoreError
    from ckptvault_cli import running
    from ckptvault_prefect.runtime import hooks

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    store = MemoryStore("b")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("CKPTVAULT_PREFECT", raising=False)
    monkeypatch.setattr(hooks, "load_config", lambda path: Config(store=StoreConfig(bucket="bkt", prefix="vault")))
    monkeypatch.setattr(hooks, "open_store", lambda store_cfg: store)
    sent: list[Any] = []
    monkeypatch.setattr(hooks, "send_alerts", lambda cfg, st, alerts, secret: sent.append(alerts))

    def failing(error: Exception) -> Any:
        def fn(**_: Any) -> Any:
            raise error

        return fn

    for name, error in (("restore", StoreError("get s3://b/k: timed out")), ("restore", KeyError("x")),
                        ("restore", StoreError("again")), ("ingest", StoreError("not a restore"))):  # fmt: skip
        assert running.run_flow(SimpleNamespace(name=name, fn=failing(error)), 1, config_path=None) is error
    assert load(store, "vault").totals() == {"restore_failures|StoreError": 2.0, "restore_failures|KeyError": 1.0}
    assert len(sent) == 4  # and each failure still alerted


def test_without_deletes_a_reader_gets_the_newest_object_and_what_it_does_not_cover() -> None:
    store = MemoryStore("b")
    for i in range(20):
        record_ledger(store, "vault", {"drill_bytes": 1}, "ingest", delete=False, now=T0 + i)
    assert len(_objects(store)) == 20  # nothing deleted
    gets: list[str] = []
    get = store.get_bytes

    def counted(key: str, *a: object, **k: object) -> bytes:
        gets.append(key)
        return get(key, *a, **k)  # type: ignore[arg-type]

    store.get_bytes = counted  # type: ignore[method-assign]
    got = ledger.read_stored(store, "vault")
    assert len(gets) == 1 and len(got.parts) == 1 and len(got.covered) == 19  # the newest covers the rest
    assert got.merged().totals() == {"drill_bytes": 20.0} and got.merged().last_success == {"ingest": T0 + 19}
    # an object written beside it that it does not cover (a concurrent writer's) is read as well
    stray = Ledger({}, "", {}, {"z": Entry("z", ledger.day_of(T0), {"drill_bytes": 5.0})})
    store.put_bytes("vault/_state/ledger/" + f"{1:020d}-" + "f" * 32 + ".json", stray.to_json())
    gets.clear()
    assert load(store, "vault").totals() == {"drill_bytes": 25.0} and len(gets) == 2


def test_a_record_that_cannot_read_the_ledger_folds_nothing_and_loses_no_count() -> None:
    store = MemoryStore("b")
    for d in range(4):
        record_ledger(store, "vault", {"restore_bytes": 25}, "restore", delete=True, now=T0 + d * DAY)
    assert load(store, "vault").totals() == {"restore_bytes": 100.0}
    listing = store.list

    def failing_list(prefix: str) -> object:
        raise TransientStoreError(f"LIST {prefix}: injected")

    store.list = failing_list  # type: ignore[method-assign]
    # days later, its read fails: its own entry is written beside the rest, unfolded
    record_ledger(store, "vault", {"restore_bytes": 1}, "restore", delete=True, now=T0 + 9 * DAY)
    store.list = listing  # type: ignore[method-assign]
    assert load(store, "vault").totals() == {"restore_bytes": 101.0}
    record_ledger(store, "vault", None, "tier", delete=True, now=T0 + 10 * DAY)  # a whole read folds all of it
    assert load(store, "vault").totals() == {"restore_bytes": 101.0} and len(_objects(store)) == 1
