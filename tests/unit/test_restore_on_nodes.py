"""The node-local restore protocol (ckptvault/restore/node_local.py) on the in-memory store, each
node's disk a tmp directory and each call a plain call through the test submitter
(tests/unit/submitters.py): every node's files verified before any rename, node 0 renamed last, and a
failure on any node putting everything back, the old contents (--force) included."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptvault.checkpoint.manifest import Manifest
from ckptvault.config import Config, SourceConfig, StoreConfig
from ckptvault.ingest import steps
from ckptvault.restore import plan
from ckptvault.restore.node_local import restore_on_nodes
from ckptvault.restore.nodes import PartialRestoreError
from ckptvault.restore.resolve import RestoreError
from ckptvault.store.memory import MemoryStore
from ckptvault.transfer.placement import Placement
from ckptvault.transfer.progress import ProgressBar
from ckptvault_cli.synthetic import write_checkpoint
from tests.unit.submitters import Call, Plain

PREFIX = "t"
PATTERN = r"__(?P<rank>\d+)_\d+\.distcp$"
NODES = 3
WORKERS = [{f"node-{i}": 1.0} for i in range(NODES)]


@pytest.fixture
def ingested(tmp_path: Path) -> tuple[MemoryStore, Config, Manifest]:
    """A 3-rank DCP checkpoint of a node-local run, ingested as one directory, its placement recorded."""
    root = tmp_path / "hot"
    write_checkpoint(root, "dcp", 100, 3 * 2**16, shards=NODES, seed=1)
    source = SourceConfig(run="r", path=root, format="dcp", settle_seconds=0, locality="node", nodes=NODES,
                          node_pattern=PATTERN)  # fmt: skip
    cfg = Config(store=StoreConfig(bucket="ckpts", prefix=PREFIX), sources=[source])
    store = MemoryStore("ckpts")
    [found] = steps.find_checkpoints(SourceConfig(run="r", path=root, format="dcp", settle_seconds=0)).found
    entries = [steps.upload_one(store, j, found) for j in steps.plan_upload(store, PREFIX, found)]
    manifest = steps.commit_manifest(store, PREFIX, found, entries, placement=Placement(NODES, PATTERN).record())
    return store, cfg, manifest


def _restore(ingested: tuple[MemoryStore, Config, Manifest], dest: str, submit: Plain, force: bool = False) -> None:
    store, cfg, manifest = ingested
    plans = plan.plan_objects(store, PREFIX, manifest)
    bar = ProgressBar(manifest.total_bytes, "restore")
    restore_on_nodes(submit, cfg, store, manifest, plans, dest, force, bar)


def _node_of(call: Call) -> str:
    return next(a for a in call.args if isinstance(a, str) and a.startswith("node-"))


def _disk(tmp_path: Path) -> dict[str, list[str]]:
    """What each node's disk holds under tmp_path/node-I."""
    disks = {f"node-{i}": tmp_path / f"node-{i}" for i in range(NODES)}
    return {name: sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()) for name, d in disks.items()}


def test_each_node_gets_its_files_and_node_0_is_renamed_last(ingested: tuple[MemoryStore, Config, Manifest],
                                                             tmp_path: Path) -> None:  # fmt: skip
    submit = Plain(workers=WORKERS)
    _restore(ingested, f"{tmp_path}/${{CKPTVAULT_NODE}}/restored", submit)
    disk = _disk(tmp_path)
    assert disk["node-1"] == ["restored/step-100/__1_0.distcp"] and disk["node-2"] == ["restored/step-100/__2_0.distcp"]
    assert "restored/step-100/__0_0.distcp" in disk["node-0"] and "restored/step-100/.metadata" in disk["node-0"]
    renames = [_node_of(c) for c in submit.ran if c.name == "finalize_on_node"]
    assert sorted(renames) == ["node-0", "node-1", "node-2"] and renames[-1] == "node-0"
    first_rename = submit.names().index("finalize_on_node")
    assert max(i for i, n in enumerate(submit.names()) if n in ("download_one", "write_pointer")) < first_rename
    # every per-node step ran on the node it works for
    assert all(c.node == _node_of(c) for c in submit.ran if c.name.endswith("_on_node") or c.name == "others_seen")


def test_every_library_call_the_protocol_makes_has_its_task_in_the_flows_steps(
    ingested: tuple[MemoryStore, Config, Manifest], tmp_path: Path
) -> None:
    from ckptvault_prefect.tasks.restore import STEPS

    submit = Plain(workers=WORKERS, fail=lambda c: c.name == "finalize_on_node" and _node_of(c) == "node-2")
    with pytest.raises(RestoreError):
        _restore(ingested, f"{tmp_path}/${{CKPTVAULT_NODE}}/restored", submit)
    asked = {c.fn for c in submit.ran}
    assert len(asked) == 7 and asked <= STEPS.keys(), asked - STEPS.keys()  # stage .. undo, discard


def _with_old_contents(tmp_path: Path) -> None:
    for i in range(NODES):
        (tmp_path / f"node-{i}" / "restored").mkdir(parents=True)
        (tmp_path / f"node-{i}" / "restored" / "old.txt").write_text(f"old {i}")


OLD = {f"node-{i}": ["restored/old.txt"] for i in range(NODES)}


@pytest.mark.parametrize("failing", ["node-2", "node-0"])
def test_a_failed_rename_puts_every_node_back_as_it_was(
    ingested: tuple[MemoryStore, Config, Manifest], tmp_path: Path, failing: str
) -> None:
    _with_old_contents(tmp_path)
    submit = Plain(workers=WORKERS, fail=lambda c: c.name == "finalize_on_node" and _node_of(c) == failing)
    with pytest.raises(RestoreError, match="the nodes already done were put back") as e:
        _restore(ingested, f"{tmp_path}/${{CKPTVAULT_NODE}}/restored", submit, force=True)
    assert not isinstance(e.value, PartialRestoreError)
    assert _disk(tmp_path) == OLD  # the old contents back at --dest, no copy, no staging, nothing aside
    undone = sorted(_node_of(c) for c in submit.ran if c.name == "undo_on_node")
    renamed = {_node_of(c) for c in submit.ran if c.name == "finalize_on_node"}
    assert undone == sorted(renamed - {failing}) and undone  # what was renamed, put back
    assert sorted(_node_of(c) for c in submit.ran if c.name == "discard_on_node") == ["node-0", "node-1", "node-2"]


def test_a_put_back_that_fails_says_which_nodes_hold_the_copy(
    ingested: tuple[MemoryStore, Config, Manifest], tmp_path: Path
) -> None:
    submit = Plain(workers=WORKERS, fail=lambda c: (c.name == "finalize_on_node" and _node_of(c) == "node-2")
                   or c.name == "undo_on_node")  # fmt: skip
    with pytest.raises(PartialRestoreError, match="putting back the copies already in place failed on node-1"):
        _restore(ingested, f"{tmp_path}/${{CKPTVAULT_NODE}}/restored", submit)
    assert _disk(tmp_path)["node-1"] == ["restored/step-100/__1_0.distcp"]  # as the message says


def test_a_failed_download_on_one_node_changes_nothing_on_any_node(
    ingested: tuple[MemoryStore, Config, Manifest], tmp_path: Path
) -> None:
    _with_old_contents(tmp_path)
    submit = Plain(workers=WORKERS, inline=False, fail=lambda c: c.name == "download_one" and c.node == "node-1")
    with pytest.raises(RestoreError, match=r"1 of 4 files failed; nothing was changed at .* on any node"):
        _restore(ingested, f"{tmp_path}/${{CKPTVAULT_NODE}}/restored", submit, force=True)
    assert _disk(tmp_path) == OLD
    assert "finalize_on_node" not in submit.names()
    assert sorted(_node_of(c) for c in submit.ran if c.name == "discard_on_node") == ["node-0", "node-1", "node-2"]


def test_nodes_sharing_one_destination_are_refused_before_any_download(
    ingested: tuple[MemoryStore, Config, Manifest], tmp_path: Path
) -> None:
    submit = Plain(workers=WORKERS)
    with pytest.raises(RestoreError, match="the nodes share"):
        _restore(ingested, f"{tmp_path}/shared/restored", submit)
    assert "download_one" not in submit.names()
    assert not (tmp_path / "shared").exists() or list((tmp_path / "shared").iterdir()) == []


def test_without_a_worker_per_node_nothing_is_staged(ingested: tuple[MemoryStore, Config, Manifest],
                                                    tmp_path: Path) -> None:  # fmt: skip
    submit = Plain(workers=WORKERS[:2])
    with pytest.raises(Exception, match="no Dask worker for node-2"):
        _restore(ingested, f"{tmp_path}/${{CKPTVAULT_NODE}}/restored", submit)
    assert submit.ran == []
