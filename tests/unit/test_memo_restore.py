"""What a restore reads once per command (ckptvault/command/memo.py, `remembered`): with a Prefect API the
command line reads the run's catalog history and surveys the copies (exit 2 on bad input before a flow
run exists), then its flow, in the same process, reads both again. Inside `memo.command()` the second
read (`from_manifests.read_run_once`, `copies.survey_once`) makes no store request; outside it, or for
another run, save, store or copy, or once too old, or after a failed read, the store is read."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog
from ckptvault.catalog.events import verified
from ckptvault.command import early_result, memo
from ckptvault.config import SourceConfig
from ckptvault.ingest import steps
from ckptvault.restore import copies, from_manifests
from ckptvault.restore.copies import Copy
from ckptvault.store import ObjectInfo, TransientStoreError
from ckptvault.store.memory import MemoryStore
from ckptvault_cli.synthetic import write_checkpoint

PREFIX = "vault"


class Counted(MemoryStore):
    """Counts each read request (LIST, GET, HEAD, ranged GET); `fail` makes each raise a transient error."""

    def __init__(self, bucket: str = "ckpts") -> None:
        super().__init__(bucket)
        self.requests: Counter[str] = Counter()
        self.fail = False

    def _request(self, what: str) -> None:
        self.requests[what] += 1
        if self.fail:
            raise TransientStoreError(f"{what}: connection reset")

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self._request("LIST")
        return super().list(prefix)

    def get_bytes(self, key: str) -> bytes:
        self._request("GET")
        return super().get_bytes(key)

    def head(self, key: str) -> ObjectInfo | None:
        self._request("HEAD")
        return super().head(key)

    def read_range(self, key: str, offset: int, length: int, *, size: int) -> bytes:
        self._request("GET range")
        return super().read_range(key, offset, length, size=size)

    def made(self) -> int:
        """The requests made since the last call."""
        n = sum(self.requests.values())
        self.requests.clear()
        return n


def _saved(tmp_path: Path, store: Counted, steps_saved: tuple[int, ...] = (100, 200)) -> Counted:
    """Saves of run `r` committed and in the catalog, as an ingest leaves them; the counts reset."""
    for step in steps_saved:
        write_checkpoint(tmp_path / "hot", "hf", step, 2**16, shards=2, seed=step)
    found = steps.find_checkpoints(SourceConfig(run="r", path=tmp_path / "hot", format="hf", settle_seconds=0)).found
    for f in found:
        entries = [steps.upload_one(store, j, f) for j in steps.plan_upload(store, PREFIX, f)]
        Catalog(store, PREFIX).append([verified(steps.commit_manifest(store, PREFIX, f, entries))])
    store.made()
    return store


@pytest.fixture
def store(tmp_path: Path) -> Counted:
    return _saved(tmp_path, Counted())


def test_the_flow_reads_the_history_the_command_line_read(store: Counted, monkeypatch: pytest.MonkeyPatch) -> None:
    first = from_manifests.read_run_once(Catalog(store, PREFIX), "r")
    assert store.made() > 0
    assert from_manifests.read_run_once(Catalog(store, PREFIX), "r") is not first
    assert store.made() > 0  # outside a command (a deployment's flow run): read each time
    with memo.command():
        cli = from_manifests.read_run_once(Catalog(store, PREFIX), "r")
        used_to = store.made()
        assert used_to > 0 and [s.step for s in cli.states()] == [100, 200]
        flow = from_manifests.read_run_once(Catalog(store, f"/{PREFIX}/"), "r")  # the flow's own Catalog
        assert flow is cli and store.made() == 0  # no request: the command line's snapshot
        from_manifests.read_run_once(Catalog(store, PREFIX), "q")  # another run: read
        assert store.made() > 0
        other = Counted()  # another store object, however alike: read
        for o in store.list(""):
            other.put_bytes(o.key, store.get_bytes(o.key))
        store.made()
        assert from_manifests.read_run_once(Catalog(other, PREFIX), "r") == cli and other.made() > 0
        monkeypatch.setattr(memo, "READ_MAX_AGE_S", 0.0)  # too old: read again
        assert from_manifests.read_run_once(Catalog(store, PREFIX), "r") is not cli and store.made() == used_to


def test_a_failed_history_read_is_not_remembered(store: Counted) -> None:
    with memo.command():
        store.fail = True
        with pytest.raises(TransientStoreError):
            from_manifests.read_run_once(Catalog(store, PREFIX), "r")
        store.fail = False
        store.made()
        from_manifests.read_run_once(Catalog(store, PREFIX), "r")
        assert store.made() > 0  # read, not the failure
        from_manifests.read_run_once(Catalog(store, PREFIX), "r")
        assert store.made() == 0


def test_a_history_with_unreadable_objects_is_remembered_too(store: Counted) -> None:
    bad = next(o.key for o in store.list(f"{PREFIX}/_catalog/") if o.key.endswith(".parquet"))
    store.put_bytes(bad, b"garbage")
    store.made()
    with memo.command():
        cli = from_manifests.read_run_once(Catalog(store, PREFIX), "r")
        assert bad in cli.unreadable and store.made() > 0
        # the flow alerts on this very history (the command line only warned): one alert
        assert from_manifests.read_run_once(Catalog(store, PREFIX), "r") is cli and store.made() == 0


def _two_copies(store: Counted) -> tuple[list[Copy], Counted]:
    replica = Counted("ckpts-dr")
    for o in store.list(f"{PREFIX}/"):
        replica.put_bytes("dr" + o.key[len(PREFIX) :], store.get_bytes(o.key))
    store.made()
    replica.made()
    return [Copy(copies.PRIMARY, store, PREFIX), Copy("dr", replica, "dr")], replica


def test_the_flow_surveys_nothing_the_command_line_surveyed(store: Counted, monkeypatch: pytest.MonkeyPatch) -> None:
    found, replica = _two_copies(store)

    def made() -> int:
        return store.made() + replica.made()

    copies.survey_once(found, "r", 100, 1)
    copies.survey_once(found, "r", 100, 1)
    assert made() > 0  # outside a command: surveyed each time
    with memo.command():
        cli = copies.survey_once(found, "r", 100, 1)
        used_to = made()
        assert used_to > 0 and [s.usable for s in cli] == [True, True]
        flow = copies.survey_once(list(found), "r", 100, 1)  # the flow's own list of the same copies
        assert flow == cli and flow is not cli and made() == 0  # the same statuses, in a list of its own
        copies.survey_once(found, "r", 200, 1)  # another step
        assert made() > 0
        copies.survey_once(found, "r", 100, 2)  # another save (not there: each copy says so)
        assert made() > 0
        copies.survey_once(found, "q", 100, 1)  # another run
        assert made() > 0
        copies.survey_once(found[:1], "r", 100, 1)  # other copies
        assert made() > 0
        down = [found[0], Copy("dr", None, "dr", "connection refused")]
        assert [s.reachable for s in copies.survey_once(down, "r", 100, 1)] == [True, False] and made() > 0
        monkeypatch.setattr(memo, "READ_MAX_AGE_S", 0.0)
        copies.survey_once(found, "r", 100, 1)
        assert made() == used_to  # too old: surveyed again


def test_a_failed_survey_is_not_remembered_and_an_early_one_is(store: Counted) -> None:
    only = [Copy(copies.PRIMARY, store, PREFIX)]
    with memo.command():
        store.fail = True  # one copy only: its transient error is raised (the task's retries take it)
        with pytest.raises(TransientStoreError):
            copies.survey_once(only, "r", 100, 1)
        assert copies.EarlySurvey(only, "r", "100", None).statuses(100, 1) is None
        store.fail = False
        store.made()
        early = copies.EarlySurvey(only, "r", "100", None).statuses(100, 1)  # `--step 100`, beside the catalog
        assert early is not None and store.made() > 0
        assert copies.survey_once(only, "r", 100, 1) == early and store.made() == 0  # the flow's survey


@pytest.mark.parametrize("step", ["latest", "100"])
def test_a_restore_with_its_flow_reads_the_history_and_surveys_once(
    step: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole command as with a Prefect API (the flow run in the command's process; its body run here
    in direct mode): the catalog's objects and the save's manifest are each read once, where the flow
    used to read them all again (the same command with READ_MAX_AGE_S 0)."""
    from ckptvault.checkpoint.manifest import checkpoint_prefix
    from ckptvault_cli import running
    from ckptvault_cli.main import main

    def flow_here(flow: Any, workers: int = 4, *, force_prefect: bool = False, **params: Any) -> Any:
        return running.run_direct(flow.fn, flow.name, workers, **params)

    monkeypatch.setattr(running, "direct", lambda: False)  # the command takes its flow-run path
    monkeypatch.setattr(running, "run_flow", flow_here)
    monkeypatch.delenv("CKPTVAULT_CONFIG", raising=False)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[store]\nbucket = 'ckpts'\nprefix = '{PREFIX}'\n")
    reads: dict[float, Counter[str]] = {}
    made: dict[float, int] = {}
    for max_age in (0.0, 60.0):
        stores = _saved(tmp_path / str(max_age), Counted(), (100,))
        monkeypatch.setattr("ckptvault.store.open_store", lambda cfg, s=stores: s)
        monkeypatch.setattr(memo, "READ_MAX_AGE_S", max_age)
        seen: Counter[str] = Counter()
        get = stores.get_bytes

        def counted_get(key: str, get: Any = get, seen: Counter[str] = seen) -> bytes:
            manifest = key.startswith(checkpoint_prefix(PREFIX, "r", 100)) and key.endswith(".json")
            seen["manifest" if manifest else "catalog" if key.startswith(f"{PREFIX}/_catalog/") else "other"] += 1
            return bytes(get(key))

        monkeypatch.setattr(stores, "get_bytes", counted_get)
        dest = tmp_path / f"back-{max_age}"
        # counted up to the result (ckptvault/command/early_result.py): the catalog's compaction after it reads too
        until_result: Counter[str] = Counter()
        with early_result.listening(lambda _, c=until_result, s=seen: c.update(s)):
            assert main(["--config", str(cfg), "restore", "r", "--step", step, "--dest", str(dest)]) == 0
        assert any(dest.iterdir()) and until_result
        reads[max_age], made[max_age] = until_result, stores.made()
    # every catalog object and the manifest read once; READ_MAX_AGE_S 0, as before: twice (the flow's reads)
    assert reads[60.0]["catalog"] >= 1 and reads[60.0]["manifest"] == 1
    assert (reads[0.0]["catalog"], reads[0.0]["manifest"]) == (2 * reads[60.0]["catalog"], 2)
    assert made[0.0] > made[60.0]
