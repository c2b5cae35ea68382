"""The second half of a restore (ckptvault/restore/complete.py), as the command line without a Prefect
API and the restore flow both run it, on the in-memory store: the bytes are in place before the
catalog event and the alert; a failed file records nothing; and the plain-threads submitter of the
command line (ckptvault/submitter.py `Threads`) retries exactly the steps the flow's io tasks retry."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from ckptvault import ledger
from ckptvault.catalog import Catalog
from ckptvault.config import Config, SourceConfig, StoreConfig
from ckptvault.ingest import steps
from ckptvault.manifest import Manifest
from ckptvault.pricing import load_prices
from ckptvault.restore import complete, copies
from ckptvault.restore import steps as lib
from ckptvault.restore.copies import Copy
from ckptvault.restore.resolve import Resolution, RestoreError
from ckptvault.store import TransferConfig, TransientStoreError
from ckptvault.store.memory import MemoryStore
from ckptvault.submitter import RETRIES, Threads
from ckptvault_cli.synthetic import write_checkpoint
from tests.unit.submitters import Plain

MiB = 2**20
PREFIX = "t"


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture
def saved(tmp_path: Path) -> tuple[MemoryStore, Manifest, Path]:
    store = MemoryStore("ckpts", transfer=TransferConfig(part_size=5 * MiB, multipart_threshold=5 * MiB))
    src = write_checkpoint(tmp_path / "hot", "hf", 100, 12 * MiB, shards=2, seed=1)
    [found] = steps.find_checkpoints(SourceConfig(run="r", path=tmp_path / "hot", format="hf", settle_seconds=0)).found
    entries = [steps.upload_one(store, j, found) for j in steps.plan_upload(store, PREFIX, found)]
    return store, steps.commit_manifest(store, PREFIX, found, entries), src


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


def test_a_file_no_copy_can_give_records_nothing_and_changes_nothing(
    saved: tuple[MemoryStore, Manifest, Path], tmp_path: Path
) -> None:
    store, _, _ = saved
    submit = Plain(fail=lambda c: c.name in ("download_guarded", "fetch_range_guarded"))
    with pytest.raises(RestoreError, match="could be read from no copy"):
        _complete(store, tmp_path / "dest", submit)
    assert "record" not in submit.names() and "alert" not in submit.names()
    assert not (tmp_path / "dest").exists()


def test_the_command_lines_threads_retry_what_the_flows_io_tasks_retry() -> None:
    from ckptvault_prefect.tasks.restore import STEPS  # how the flow runs each call

    retried = {fn for fn, step in STEPS.items() if step.retries}
    assert retried == set(complete.IO_STEPS)


def test_threads_retry_transient_errors_of_io_steps_only_and_map_waits_for_every_call() -> None:
    naps: list[float] = []
    calls = {"io": 0, "local": 0}

    def io() -> str:
        calls["io"] += 1
        if calls["io"] <= RETRIES:
            raise TransientStoreError("503")
        return "ok"

    def local() -> str:
        calls["local"] += 1
        raise TransientStoreError("503")

    submit = Threads([io], sleep=naps.append)
    assert submit(io) == "ok" and calls["io"] == RETRIES + 1 and len(naps) == RETRIES
    with pytest.raises(TransientStoreError):
        submit(local)
    assert calls["local"] == 1  # not store I/O: not retried

    seen: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> int:
        with lock:
            seen.append(threading.current_thread().name)
        if i == 3:
            raise ValueError("three")
        return i * 2

    from functools import partial

    out = submit.map([partial(one, i) for i in range(6)])
    assert len(seen) == 6  # every call finished before map returned
    assert [o.result(raise_on_failure=False) for o in out][:3] == [0, 2, 4]
    assert isinstance(out[3].result(raise_on_failure=False), ValueError)
    with pytest.raises(ValueError, match="node's worker"):
        submit.map([partial(one, 1)], node="node-0")
