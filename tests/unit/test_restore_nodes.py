"""Restoring a node-local checkpoint onto each node's disk: which file goes where, and the per-node
stage and rename (ckptvault/restore/nodes.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptvault.checkpoint.manifest import Manifest, ManifestError, NodePlacement
from ckptvault.config import parse_config
from ckptvault.restore import nodes
from ckptvault.restore.plan import ObjectPlan
from ckptvault.restore.resolve import RestoreError
from ckptvault.transfer.placement import Placement

BASE = '[store]\nbucket = "ckpts"\n'
NODE_SOURCE = (
    '[[sources]]\nrun = "big"\npath = "/nvme/ckpt"\nformat = "dcp"\nlocality = "node"\nnodes = 2\n'
    "node_pattern = '__(?P<rank>\\d+)_\\d+\\.distcp$'\nranks_per_node = 2\n"
)


def _plan(path: str, size: int) -> ObjectPlan:
    return ObjectPlan(f"k/{path}", path, size, "AAAAAA==", 0.0, "STANDARD", True)


def test_the_placement_comes_from_the_runs_node_local_source() -> None:
    got = nodes.placement_for(parse_config(BASE + NODE_SOURCE), "big")
    assert got == Placement(2, r"__(?P<rank>\d+)_\d+\.distcp$", 2)


@pytest.mark.parametrize(
    ("extra", "says"),
    [("", "has no [[sources]] entry"), ('[[sources]]\nrun = "big"\npath = "/p"\nformat = "dcp"\n', "without locality")],
)
def test_a_run_without_a_node_local_source_is_refused_with_the_fix(extra: str, says: str) -> None:
    with pytest.raises(RestoreError) as e:
        nodes.placement_for(parse_config(BASE + extra), "big")
    assert says in str(e.value) and "drop --node-local" in str(e.value)


def test_each_file_goes_to_its_node_and_node_0_is_always_there() -> None:
    placement = Placement(3, r"__(?P<rank>\d+)_\d+\.distcp$", 2)
    plans = [_plan("__3_0.distcp", 30), _plan("__0_0.distcp", 20), _plan(".metadata", 1), _plan("__2_0.distcp", 10)]
    got = nodes.plans_by_node(placement, plans)
    assert {i: [p.path for p in g] for i, g in got.items()} == {
        0: ["__0_0.distcp", ".metadata"],
        1: ["__3_0.distcp", "__2_0.distcp"],  # order kept: largest first, as planned
    }
    assert nodes.plans_by_node(placement, [_plan("__2_0.distcp", 1)]) == {0: [], 1: [_plan("__2_0.distcp", 1)]}


def test_stage_then_finalize_on_a_node_puts_the_copy_at_that_nodes_destination(tmp_path: Path) -> None:
    dest = f"{tmp_path}/${{CKPTVAULT_NODE}}/restored"
    staged = nodes.stage_on_node(dest, "node-1", force=False)
    assert staged.parent == tmp_path / "node-1" and ".ckptvault-partial-" in staged.name
    (staged / "f").write_text("x")
    assert nodes.finalize_on_node(staged, dest, "node-1", force=False) is None
    assert (tmp_path / "node-1" / "restored" / "f").read_text() == "x"
    with pytest.raises(RestoreError, match="not empty"):  # checked on the node, before anything is staged
        nodes.stage_on_node(dest, "node-1", force=False)
    staged = nodes.stage_on_node(dest, "node-1", force=True)
    aside = nodes.finalize_on_node(staged, dest, "node-1", force=True)
    assert aside is not None and (Path(aside) / "f").read_text() == "x"  # kept aside, never deleted


def test_a_per_node_dest_without_node_local_is_named() -> None:
    assert nodes.dest_problem("/pfs/restored", False, "node-0") is None
    assert nodes.dest_problem("restored", False, None) is None  # relative is fine on one host
    hint = nodes.dest_problem("/nvme/${CKPTVAULT_NODE}/r", False, None)
    assert hint is not None and "add --node-local" in hint


def test_a_node_local_dest_must_be_absolute_and_not_expanded_by_the_shell() -> None:
    assert nodes.dest_problem("/nvme/${CKPTVAULT_NODE}/r", True, "node-0") is None
    assert nodes.dest_problem("/nvme/restored", True, "node-0") is None  # the same path, each node's own disk
    assert "absolute" in (nodes.dest_problem("~/r", True, None) or "")
    assert "absolute" in (nodes.dest_problem("restored", True, None) or "")
    # "/nvme/${CKPTVAULT_NODE}/r" in double quotes on node-0 reaches us as /nvme/node-0/r
    assert "single quotes" in (nodes.dest_problem("/nvme/node-0/r", True, "node-0") or "")


def test_the_nodes_sharing_a_disk_see_each_others_staging(tmp_path: Path) -> None:
    a, b = nodes.stage_on_node(f"{tmp_path}/r", "node-0", False), nodes.stage_on_node(f"{tmp_path}/r", "node-1", False)
    assert nodes.others_seen(a, [a, b], "node-0") == [str(b)]
    # per-node directories (here on one file system): each sees the other's staging, but not beside its own
    per_node = f"{tmp_path}/${{CKPTVAULT_NODE}}/r"
    c, d = nodes.stage_on_node(per_node, "node-0", False), nodes.stage_on_node(per_node, "node-1", False)
    assert d.exists() and nodes.others_seen(c, [c, d], "node-0") == [] and nodes.others_seen(d, [c, d], "node-1") == []


def test_undo_puts_the_copy_back_to_its_staging_name_and_the_old_contents_back(tmp_path: Path) -> None:
    dest = f"{tmp_path}/${{CKPTVAULT_NODE}}/r"
    (tmp_path / "node-1" / "r").mkdir(parents=True)
    (tmp_path / "node-1" / "r" / "old").write_text("mine")
    staged = nodes.stage_on_node(dest, "node-1", force=True)
    (staged / "new").write_text("restored")
    aside = nodes.finalize_on_node(staged, dest, "node-1", force=True)
    nodes.undo_on_node(staged, dest, "node-1", aside)
    assert (tmp_path / "node-1" / "r" / "old").read_text() == "mine" and (staged / "new").read_text() == "restored"
    assert aside is not None and not Path(aside).exists()


def test_a_failed_final_rename_puts_the_old_contents_back(tmp_path: Path) -> None:
    from ckptvault.restore import steps

    dest = tmp_path / "r"
    dest.mkdir()
    (dest / "old").write_text("mine")
    gone = tmp_path / ".r.ckptvault-partial-x"  # never made: the rename into place fails
    with pytest.raises(RestoreError, match="is as it was"):
        steps.finalize(gone, dest, force=True)
    assert (dest / "old").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["r"]  # no .replaced-* left behind
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RestoreError, match="is as it was"):
        steps.finalize(gone, empty, force=False)
    assert empty.is_dir()  # the empty destination it removed to rename into is back


def test_a_download_into_a_discarded_staging_directory_is_refused(tmp_path: Path) -> None:
    from ckptvault.checkpoint.manifest import Manifest
    from ckptvault.restore import steps
    from ckptvault.store.memory import MemoryStore

    manifest = Manifest(run="r", step=1, format="hf", files=(), created_at=1.0, uploaded_at=2.0, source="/x")
    with pytest.raises(RestoreError, match="is gone"):
        steps.download_one(MemoryStore("b"), _plan("f", 1), tmp_path / "discarded", manifest)
    assert not (tmp_path / "discarded").exists()  # not re-created


def _manifest(placement: NodePlacement | None) -> Manifest:
    return Manifest(run="big", step=1, format="dcp", files=(), created_at=1.0, uploaded_at=2.0, source="/x",
                    placement=placement)  # fmt: skip


def test_the_placement_recorded_at_ingest_wins_over_a_changed_config_and_says_so() -> None:
    configured = nodes.placement_for(parse_config(BASE + NODE_SOURCE), "big")
    recorded = NodePlacement(4, r"__(?P<rank>\d+)_\d+\.distcp$", 2)  # the job ran on 4 nodes then
    got, note = nodes.placement_to_use(_manifest(recorded), configured)
    assert got == Placement.from_record(recorded) and got.node_of("__5_0.distcp") == 2
    assert note is not None and "as recorded at ingest (nodes = 4" in note and f"nodes = {configured.nodes}" in note
    assert nodes.placement_to_use(_manifest(configured.record()), configured) == (configured, None)
    # a manifest written before placements were recorded: the config's, as before
    assert nodes.placement_to_use(_manifest(None), configured) == (configured, None)


def test_the_manifest_keeps_the_placement_and_other_manifests_are_unchanged() -> None:
    recorded = NodePlacement(2, r"__(?P<rank>\d+)_\d+\.distcp$", 8)
    m = _manifest(recorded)
    assert Manifest.from_json(m.to_json()).placement == recorded
    plain = _manifest(None)
    assert "placement" not in json.loads(plain.to_json()) and Manifest.from_json(plain.to_json()).placement is None
    for bad in ({"nodes": 0, "node_pattern": "x"}, {"nodes": 2}, "node-0", {"nodes": "2", "node_pattern": "x"}):
        d = json.loads(m.to_json())
        d["placement"] = bad
        with pytest.raises(ManifestError, match=r"placement|node_pattern"):
            Manifest.from_json(json.dumps(d).encode(), "m.json")
