"""The second half of a restore (ckptvault/restore/complete.py), as the command line without a Prefect
API and the restore flow both run it, on the in-memory store: the bytes are in place before the
catalog event and the alert; a failed file records nothing; and neither the plain-threads submitter of the
command line (ckptvault/transfer/submitter.py `Threads`) nor the flow's tasks retry a step: the store
they are given retries its calls (ckptvault/store/retrying.py), the same under both."""

from __future__ import annotations

import signal
import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog
from ckptvault.catalog import events as events_lib
from ckptvault.checkpoint.manifest import Manifest
from ckptvault.command import early_result
from ckptvault.config import Config, SourceConfig, StoreConfig
from ckptvault.ingest import steps
from ckptvault.observe import ledger
from ckptvault.pricing import load_prices
from ckptvault.restore import complete, copies, fallback
from ckptvault.restore import steps as lib
from ckptvault.restore.copies import Copy
from ckptvault.restore.resolve import Resolution, RestoreError
from ckptvault.store import RetryingStore, RetryPolicy, TransferConfig, TransientStoreError
from ckptvault.store.memory import MemoryStore
from ckptvault.transfer.submitter import Threads
from ckptvault_cli.synthetic import write_checkpoint
from tests.unit.submitters import Plain

MiB = 2**20
PREFIX = "t"


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _save(store: MemoryStore, tmp_path: Path) -> tuple[MemoryStore, Manifest, Path]:
    src = write_checkpoint(tmp_path / "hot", "hf", 100, 12 * MiB, shards=2, seed=1)
    [found] = steps.find_checkpoints(SourceConfig(run="r", path=tmp_path / "hot", format="hf", settle_seconds=0)).found
    entries = [steps.upload_one(store, j, found) for j in steps.plan_upload(store, PREFIX, found)]
    return store, steps.commit_manifest(store, PREFIX, found, entries), src


@pytest.fixture
def saved(tmp_path: Path) -> tuple[MemoryStore, Manifest, Path]:
    return _save(
        MemoryStore("ckpts", transfer=TransferConfig(part_size=5 * MiB, multipart_threshold=5 * MiB)), tmp_path
    )


def _chosen(store: MemoryStore, target: Path) -> complete.Chosen:
    statuses = copies.survey([Copy(copies.PRIMARY, store, PREFIX)], "r", 100, 1)
    first = statuses[0]
    assert first.manifest is not None
    est = lib.estimate(first.manifest, first.plans, load_prices(None), "Standard", "in-region", None)
    return complete.Chosen("r", Resolution("r", 100, 1), target, tuple(statuses), tuple(statuses), est)


def _complete(store: MemoryStore, target: Path, submit: Any) -> Any:
    cfg = Config(store=StoreConfig(bucket="ckpts", prefix=PREFIX))
    return complete.complete(submit, cfg, Catalog(store, PREFIX), _chosen(store, target), tier="Standard",
                             wait_s=0.0, force=False, secret=None, started=0.0)  # fmt: skip


def test_the_bytes_are_in_place_before_the_catalog_event_and_the_alert(
    saved: tuple[MemoryStore, Manifest, Path], tmp_path: Path
) -> None:
    store, manifest, src = saved
    sent: list[Any] = []
    submit = Plain(instead={"alert": lambda cfg, st, alerts, secret: sent.extend(alerts) or len(alerts)})
    result = _complete(store, tmp_path / "dest", submit)
    assert result.status == "restored" and result.bytes == manifest.total_bytes
    assert _tree(tmp_path / "dest" / "checkpoint-100") == _tree(src)
    names = submit.names()
    assert names.index("finalize") < names.index("record") < names.index("alert") < names.index("note_ledger")
    assert [e.event for e in Catalog(store, PREFIX).events("r")][-1:] == ["restored"]
    assert [a.kind for a in sent] == ["restore_completed"]
    # the metrics' ledger, in both modes (the flow and the command line run this one function)
    counted = ledger.load(store, PREFIX)
    assert "restore" in counted.last_success
    assert counted.totals()["restore_bytes"] == manifest.total_bytes


def test_the_result_is_announced_once_durable_and_recorded_before_the_alert_and_the_run_is_compacted(
    saved: tuple[MemoryStore, Manifest, Path], tmp_path: Path
) -> None:
    submit = Plain()
    seen: list[tuple[Any, list[str], dict[str, bytes], list[str]]] = []

    def listener(result: Any) -> None:  # what a warm command line's user is told, and when
        events = [e.event for e in Catalog(store, PREFIX).events("r")]
        seen.append((result, list(submit.names()), _tree(tmp_path / "dest" / "checkpoint-100"), events))

    store, manifest, src = saved
    catalog = Catalog(store, PREFIX)  # the save's commit and an earlier restore: two event files
    catalog.append([events_lib.verified(manifest)])
    catalog.append([events_lib.restored(manifest, "/elsewhere", "", 1.0)])
    before = len(catalog._list("r")[1]["r"].events)
    with early_result.listening(listener):
        result = _complete(store, tmp_path / "dest", submit)
    [(told, calls, tree, events)] = seen
    assert told == result and told.status == "restored"
    assert tree == _tree(src) and events[-1] == "restored"  # in place and recorded when told
    assert "record" in calls and "alert" not in calls and "note_ledger" not in calls
    assert submit.names()[-1] == "compact_run"  # after the alert and the ledger
    # the restore's event merged with the ingest's, under a snapshot: the run's next read is one file and
    # the snapshot, not one file more per restore
    after = Catalog(store, PREFIX)._list("r")[1]["r"]
    assert before == 2 and len(after.events) == 1 and after.snapshots
    assert [e.event for e in Catalog(store, PREFIX).events("r")][-1] == "restored"
    early_result.announce(result)  # nobody listening any more: nothing happens
    assert len(seen) == 1


def test_a_listener_that_fails_does_not_fail_the_restore(
    saved: tuple[MemoryStore, Manifest, Path], tmp_path: Path
) -> None:
    store, _, src = saved

    def broken(result: Any) -> None:
        raise RuntimeError("a console that went away")

    with early_result.listening(broken):
        result = _complete(store, tmp_path / "dest", Plain())
    assert result.status == "restored" and _tree(tmp_path / "dest" / "checkpoint-100") == _tree(src)


def test_a_run_whose_catalog_did_not_read_in_full_is_not_compacted_after(
    saved: tuple[MemoryStore, Manifest, Path], tmp_path: Path
) -> None:
    store, _, _ = saved
    submit = Plain()
    cfg = Config(store=StoreConfig(bucket="ckpts", prefix=PREFIX))
    result = complete.complete(submit, cfg, Catalog(store, PREFIX), _chosen(store, tmp_path / "dest"), tier="Standard",
                               wait_s=0.0, force=False, secret=None, started=0.0, catalog_whole=False)  # fmt: skip
    assert result.status == "restored" and "record" in submit.names()
    assert "compact_run" not in submit.names()  # its unreadable objects stay where the alert said


def test_nothing_after_the_result_fails_the_restore(saved: tuple[MemoryStore, Manifest, Path], tmp_path: Path) -> None:
    store, _, src = saved

    def broken(*args: Any) -> None:  # not a store error: a bug, a pyarrow error in the fold
        raise ValueError("injected after the result")

    submit = Plain(instead={"alert": broken, "compact_run": broken})
    result = _complete(store, tmp_path / "dest", submit)
    assert result.status == "restored" and not result.message
    assert _tree(tmp_path / "dest" / "checkpoint-100") == _tree(src)
    assert {"alert", "note_ledger", "compact_run"} <= set(submit.names())


class _AskedStore(MemoryStore):
    """The in-memory store, noting on which thread its capabilities are asked, failing the first ask
    when told to (a store that answers on the second try)."""

    def __init__(self) -> None:
        super().__init__("ckpts", transfer=TransferConfig(part_size=5 * MiB, multipart_threshold=5 * MiB))
        self.asked: list[str] = []
        self.fail_first = False

    def capabilities(self) -> Any:
        self.asked.append(threading.current_thread().name)
        if self.fail_first and len(self.asked) == 1:
            raise TransientStoreError("injected: the probe's first try")
        return super().capabilities()


@pytest.mark.parametrize("fail_first", [False, True])
def test_the_primarys_capabilities_are_asked_beside_the_transfer_and_a_failed_ask_fails_nothing(
    tmp_path: Path, fail_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _AskedStore()
    _, _, src = _save(store, tmp_path)
    store.asked.clear()
    store.fail_first = fail_first
    escaped: list[BaseException | None] = []  # what a thread let out (pytest would only warn of it)
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.exc_value))
    asked_at_record: list[list[str]] = []

    def record(catalog: Catalog, evs: Any) -> Any:
        asked_at_record.append(list(store.asked))
        return complete.record(catalog, evs)

    result = _complete(store, tmp_path / "dest", Plain(instead={"record": record}))
    assert result.status == "restored" and _tree(tmp_path / "dest" / "checkpoint-100") == _tree(src)
    # asked on a thread of its own before the catalog's write needs the answer; a failed ask fails
    # nothing (the S3 store's write asks again, and reports its own error if it fails there too)
    [before] = asked_at_record
    assert before[:1] == ["ckptvault-asked-beside"]
    assert [e.event for e in Catalog(store, PREFIX).events("r")][-1:] == ["restored"]
    assert escaped == []  # a failed ask stays on its thread, said at debug level


def test_a_file_no_copy_can_give_records_nothing_and_changes_nothing(
    saved: tuple[MemoryStore, Manifest, Path], tmp_path: Path
) -> None:
    store, _, _ = saved
    submit = Plain(fail=lambda c: c.name in ("download_guarded", "fetch_range_guarded"))
    with pytest.raises(RestoreError, match="could be read from no copy"):
        _complete(store, tmp_path / "dest", submit)
    assert "record" not in submit.names() and "alert" not in submit.names()
    assert not (tmp_path / "dest").exists()


def test_the_command_lines_threads_and_the_flows_tasks_retry_no_step_of_their_own() -> None:
    from ckptvault_prefect.tasks.restore import STEPS  # how the flow runs each call

    # a task retry around a step would make each of its store calls' attempts again
    assert {step.task.retries for step in STEPS.values()} == {0}


def test_a_restore_on_threads_retries_the_stores_transient_errors_and_nothing_else(
    saved: tuple[MemoryStore, Manifest, Path], tmp_path: Path
) -> None:
    store, _, src = saved
    naps: list[float] = []
    calls = {"download": 0, "local": 0}
    lock = threading.Lock()

    def first_attempt_fails(real: Any) -> Any:
        tried: set[tuple[str, int]] = set()

        def call(key: str, dest: Path, **kwargs: Any) -> Any:
            with lock:
                calls["download"] += 1
                first = (key, kwargs.get("offset", 0)) not in tried
                tried.add((key, kwargs.get("offset", 0)))
            if first:  # each file's or range's first attempt
                raise TransientStoreError(f"GET {key}: injected 503")
            return real(key, dest, **kwargs)

        return call

    store.download_file = first_attempt_fails(store.download_file)  # type: ignore[method-assign]
    store.download_range = first_attempt_fails(store.download_range)  # type: ignore[method-assign]
    retried = RetryingStore(store, RetryPolicy(retries=3, delays=(0.0,), jitter=0.0), sleep=naps.append)
    with Threads(workers=2) as submit:
        result = _complete(retried, tmp_path / "dest", submit)  # type: ignore[arg-type]
        assert result.status == "restored" and _tree(tmp_path / "dest" / "checkpoint-100") == _tree(src)
        assert naps and calls["download"] == 2 * len(naps)  # each failed once, then retried by the store

        def local() -> str:
            calls["local"] += 1
            raise TransientStoreError("503")

        with pytest.raises(TransientStoreError):
            submit(local)
        assert calls["local"] == 1  # not through the store: not retried
        [mapped] = submit.map([partial(local)])
        assert isinstance(mapped.result(raise_on_failure=False), TransientStoreError) and calls["local"] == 2
        with pytest.raises(ValueError, match="node's worker"):
            submit.map([partial(local)], node="node-0")


def _pool_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("ckptvault-threads")]


def test_a_maps_calls_run_while_the_next_maps_calls_do_and_no_thread_outlives_the_submitter() -> None:
    # a big file's ranges, then the whole files: the first map's call can only finish once the second
    # map's call has run, so a map that waited for its calls before returning would never see it set
    ranges_done = threading.Event()
    with Threads(workers=2) as submit:
        ranges = submit.map([partial(ranges_done.wait, 30.0)])
        whole = submit.map([partial(ranges_done.set)])
        assert ranges[0].result() is True
        assert whole[0].result() is None
        assert _pool_threads()
    assert not _pool_threads()


def test_an_exception_in_one_call_reaches_that_calls_result_only() -> None:
    def one(i: int) -> int:
        if i == 3:
            raise ValueError("three")
        return i * 2

    with Threads() as submit:
        out = submit.map([partial(one, i) for i in range(6)])
        got = [o.result(raise_on_failure=False) for o in out]
        assert got[:3] + got[4:] == [0, 2, 4, 8, 10] and isinstance(got[3], ValueError)
        with pytest.raises(ValueError, match="three"):
            out[3].result()


def test_ctrl_c_while_waiting_starts_nothing_new_and_renames_nothing_into_place(
    saved: tuple[MemoryStore, Manifest, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _, _ = saved
    interrupted = threading.Event()
    started: list[str] = []

    def on_sigint(signum: int, frame: object) -> None:
        interrupted.set()
        raise KeyboardInterrupt

    def ctrl_c_on_first(fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            started.append(fn.__name__)
            if len(started) == 1:  # Ctrl-C in the restore's (main) thread, waiting on this call's result
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
                assert interrupted.wait(30.0)
            return fn(*args, **kwargs)

        return call

    for name in ("download_guarded", "fetch_range_guarded"):
        monkeypatch.setattr(fallback, name, ctrl_c_on_first(getattr(fallback, name)))
    before = signal.signal(signal.SIGINT, on_sigint)
    try:
        # one thread: every call but the first is still queued when Ctrl-C comes
        with Threads(workers=1) as submit, pytest.raises(KeyboardInterrupt):
            _complete(store, tmp_path / "dest", submit)
    finally:
        signal.signal(signal.SIGINT, before)
    assert interrupted.is_set() and len(started) == 1  # the queued calls never started
    assert not (tmp_path / "dest").exists()  # nothing renamed into place
    assert not [p for p in tmp_path.iterdir() if ".ckptvault-partial-" in p.name]  # the staging dir removed
    assert "restored" not in [e.event for e in Catalog(store, PREFIX).events("r")]
    assert not _pool_threads()


def test_a_catalog_that_cannot_be_told_leaves_a_restore_said_unrecorded_not_failed(
    saved: tuple[MemoryStore, Manifest, Path], tmp_path: Path
) -> None:
    store, _, src = saved

    def no_catalog(catalog: Catalog, evs: Any) -> None:
        raise TransientStoreError("PUT catalog: injected, after every retry")

    submit = Plain(instead={"record": no_catalog})
    result = _complete(store, tmp_path / "dest", submit)
    # the bytes are in place and durable: a restore, with why the catalog does not know of it
    assert result.status == "restored" and _tree(tmp_path / "dest" / "checkpoint-100") == _tree(src)
    assert result.message.startswith("restored, but not recorded in the catalog nor alerted: PUT catalog")
    assert result.as_dict()["message"] == result.message
    assert "restored" not in [e.event for e in Catalog(store, PREFIX).events("r")]
    assert "alert" not in submit.names()  # nothing alerted of a restore the catalog does not hold


def test_the_command_lines_failed_restore_is_counted_by_its_error_class_alerted_or_not(
    saved: tuple[MemoryStore, Manifest, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptvault.errors import AlreadyAlerted
    from ckptvault.restore.complete import alert_failed

    store, _, _ = saved
    cfg = Config(store=StoreConfig(bucket="ckpts", prefix=PREFIX))
    plan = _chosen(store, tmp_path / "dest")
    sent: list[Any] = []
    monkeypatch.setattr("ckptvault.alerts.sending.send_alerts", lambda cfg, st, alerts, secret: sent.extend(alerts))
    said: list[str] = []
    alert_failed(cfg, Catalog(store, PREFIX), plan, RestoreError("no copy could give x"), None, said.append)
    alert_failed(cfg, Catalog(store, PREFIX), plan, AlreadyAlerted("said already"), None, said.append)
    assert ledger.load(store, PREFIX).totals() == {
        "restore_failures|RestoreError": 1.0, "restore_failures|AlreadyAlerted": 1.0
    }  # fmt: skip
    assert [a.kind for a in sent] == ["flow_failed"]  # the one already alerted is not alerted twice
    assert said == []  # sent: nothing to say on the console
