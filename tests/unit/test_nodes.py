"""Node-local sources (locality = "node"): the config keys, the placement of a file on its node (a
pure function), the missing-worker check, what one node lists, and how the listings make one
checkpoint (ready only when every node has sent files and all are settled)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptvault.checkpoint.local_files import LocalFile
from ckptvault.config import ConfigError, parse_config
from ckptvault.formats.base import Candidate
from ckptvault.ingest.discovery import Found
from ckptvault.ingest.nodes import (
    Gathered,
    NodeListing,
    checkpoint_rel,
    jobs_by_node,
    list_node,
    merge,
    node_path,
    validate_gathered,
)
from ckptvault.ingest.steps import FileJob
from ckptvault.transfer.placement import NodeError, Placement, missing_workers, require_workers

BASE = '[store]\nbucket = "ckpts"\n[[sources]]\nrun = "llm"\npath = "/nvme/ckpt"\nformat = "dcp"\n'
DCP = r"__(?P<rank>\d+)_\d+\.distcp$"


def test_a_node_local_source_reads_its_keys() -> None:
    cfg = parse_config(BASE + f'locality = "node"\nnodes = 4\nnode_pattern = \'{DCP}\'\nranks_per_node = 8\n')
    [s] = cfg.sources
    assert (s.locality, s.nodes, s.node_pattern, s.ranks_per_node) == ("node", 4, DCP, 8)
    assert Placement.of(s) == Placement(4, DCP, 8)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ('locality = "node"\nnodes = 2\n', "needs nodes = N and node_pattern"),
        ('locality = "node"\nnode_pattern = "(?P<node>\\\\d)"\n', "needs nodes = N and node_pattern"),
        ("nodes = 2\n", 'only with locality = "node"'),
        ('locality = "node"\nnodes = 2\nnode_pattern = "rank_(\\\\d+)"\n', "exactly one named group"),
        ('locality = "node"\nnodes = 2\nnode_pattern = "(?P<rank>["\n', "not a regular expression"),
    ],
)
def test_a_bad_node_local_source_names_the_key_and_the_fix(extra: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(BASE + extra)
    assert says in str(e.value)


@pytest.mark.parametrize(
    ("pattern", "per_node", "rel", "node"),
    [
        (DCP, 8, "__0_0.distcp", 0),
        (DCP, 8, "__7_0.distcp", 0),
        (DCP, 8, "__8_0.distcp", 1),
        (DCP, 8, "model/__23_1.distcp", 2),
        (DCP, 8, ".metadata", 0),  # not matched: node 0's, where rank 0 writes it
        # DeepSpeed ZeRO: one optimizer file per data-parallel rank
        (r"zero_pp_rank_(?P<rank>\d+)_", 2, "global_step4/zero_pp_rank_3_mp_rank_00_optim_states.pt", 1),
        (r"zero_pp_rank_(?P<rank>\d+)_", 2, "global_step4/mp_rank_00_model_states.pt", 0),
        # a directory per node: the group names the node itself
        (r"^host(?P<node>\d+)/", 1, "host2/shard.bin", 2),
    ],
)
def test_placement_maps_a_file_to_its_node(pattern: str, per_node: int, rel: str, node: int) -> None:
    p = Placement(3, pattern, per_node)
    assert p.node_of(rel) == node
    assert p.name(p.node_of(rel)) == f"node-{node}"


def test_a_rank_beyond_the_nodes_is_an_error_naming_the_file() -> None:
    with pytest.raises(NodeError, match=r"__24_0.distcp: node_pattern places it on node 3, but .* nodes = 3"):
        Placement(3, DCP, 8).node_of("__24_0.distcp")


@pytest.mark.parametrize("pattern", [r"(?:__(?P<rank>\d+)_)?", r"__(?P<rank>\w+)_0"])
def test_a_rank_group_that_matches_no_number_is_an_error_naming_the_file_and_the_fix(pattern: str) -> None:
    with pytest.raises(NodeError, match=r"__x_0.distcp: node_pattern .* not a number; make the group match digits"):
        Placement(2, pattern, 1).node_of("__x_0.distcp")


def test_missing_workers_names_the_nodes_no_worker_serves() -> None:
    p = Placement(3, DCP, 8)
    assert missing_workers(p, [{"node-0": 1}, {"node-2": 1}, {"GPU": 1}]) == ["node-1"]
    assert missing_workers(p, [{"node-0": 1, "node-1": 1}, {"node-2": 1}]) == []
    assert missing_workers(p, []) == ["node-0", "node-1", "node-2"]


def test_node_path_replaces_the_placeholder_with_this_node(monkeypatch: pytest.MonkeyPatch) -> None:
    assert node_path(Path("/nvme/ckpt")) == Path("/nvme/ckpt")  # no placeholder: the same on every node
    assert node_path(Path("/x/${CKPTVAULT_NODE}/ckpt"), "node-2") == Path("/x/node-2/ckpt")
    monkeypatch.setenv("CKPTVAULT_NODE", "node-1")
    assert node_path(Path("/x/${CKPTVAULT_NODE}/ckpt")) == Path("/x/node-1/ckpt")
    monkeypatch.delenv("CKPTVAULT_NODE")
    with pytest.raises(NodeError, match="CKPTVAULT_NODE is not set"):
        node_path(Path("/x/${CKPTVAULT_NODE}/ckpt"))


def _write(path: Path, data: bytes = b"x" * 64) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_a_node_lists_only_the_files_placed_on_it(tmp_path: Path) -> None:
    p = Placement(2, DCP, 2)
    node1 = tmp_path / "node-1" / "ckpt" / "step-5"
    for name in ("__2_0.distcp", "__3_0.distcp", "__0_0.distcp"):  # __0_0: a stray copy of node 0's
        _write(node1 / name)
    listing = list_node(tmp_path / "${CKPTVAULT_NODE}" / "ckpt", "step-5", 1, p)
    assert [f.rel for f in listing.files] == ["__2_0.distcp", "__3_0.distcp"]
    assert all(str(f.path).startswith(str(node1)) for f in listing.files)
    assert listing.elsewhere == ("__0_0.distcp",) and listing.problems == ()
    assert list_node(tmp_path / "${CKPTVAULT_NODE}" / "ckpt", "step-5", 0, p).files == ()  # node 0: nothing there


def test_a_node_checks_the_headers_of_its_files(tmp_path: Path) -> None:
    _write(tmp_path / "node-1" / "s" / "__2_0.distcp", b"")
    listing = list_node(tmp_path / "${CKPTVAULT_NODE}", "s", 1, Placement(2, DCP, 2))
    assert listing.problems == ("node-1: __2_0.distcp: zero-byte file; every checkpoint file should hold data",)


def _found(tmp_path: Path, files: tuple[LocalFile, ...], mtime: float) -> Found:
    return Found("llm", Candidate(5, tmp_path, "dcp", True, ""), files, True, "", mtime)


def _listing(node: int, rels: list[str], mtime: float) -> NodeListing:
    return NodeListing(node, tuple(LocalFile(r, f"/n{node}/{r}", 10, mtime) for r in rels), mtime, (), ())


def test_merge_waits_for_a_node_that_has_sent_nothing_and_names_it(tmp_path: Path) -> None:
    p = Placement(3, DCP, 1)
    mine = _listing(0, [".metadata", "__0_0.distcp"], 100.0)
    got = merge(_found(tmp_path, mine.files, 100.0), p, [mine, _listing(1, ["__1_0.distcp"], 100.0),
                                                          _listing(2, [], 0.0)], 60, 1000.0)  # fmt: skip
    assert not got.found.ready and got.found.reason == "waiting for node-2: none of its files are there yet"


def test_merge_makes_one_checkpoint_of_every_nodes_files_and_settles_on_the_newest(tmp_path: Path) -> None:
    p = Placement(2, DCP, 1)
    mine = _listing(0, [".metadata", "__0_0.distcp"], 100.0)
    late = _listing(1, ["__1_0.distcp"], 980.0)  # node 1 wrote last, 20 s ago
    got = merge(_found(tmp_path, mine.files, 100.0), p, [mine, late], 60, 1000.0)
    assert [f.rel for f in got.found.files] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert got.found.newest_mtime == 980.0
    assert not got.found.ready and "changed 20.0 s ago" in got.found.reason
    settled = merge(_found(tmp_path, mine.files, 100.0), p, [mine, late], 60, 1100.0)
    assert settled.found.ready and settled.found.total_bytes == 30


def test_jobs_are_grouped_by_the_node_that_uploads_them() -> None:
    p = Placement(2, DCP, 1)
    jobs = [FileJob(LocalFile(r, os.path.join("/d", r), 1, 0.0), "k/" + r, True) for r in
            (".metadata", "__1_0.distcp", "__0_0.distcp")]  # fmt: skip
    by = jobs_by_node(p, jobs)
    got = {n: [j.file.rel for j in js] for n, js in by.items()}
    assert got == {0: [".metadata", "__0_0.distcp"], 1: ["__1_0.distcp"]}


def test_require_workers_refuses_no_dask_and_names_a_node_without_a_worker() -> None:
    p = Placement(3, DCP, 8)
    with pytest.raises(NodeError, match=r'locality = "node" .* set \[scale\] dask_address'):
        require_workers(p, None, "llm", 100)
    with pytest.raises(NodeError, match=r"llm step 100: no Dask worker for node-1, node-2, so their files"):
        require_workers(p, [{"node-0": 1}], "llm", 100)
    require_workers(p, [{"node-0": 1}, {"node-1": 1, "node-2": 1}], "llm", 100)  # every node served: no error


def test_checkpoint_rel_is_the_checkpoints_place_under_the_source_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTVAULT_NODE", "node-0")
    assert checkpoint_rel(Path("/x/${CKPTVAULT_NODE}/ckpt"), Path("/x/node-0/ckpt/step-5")) == "step-5"
    assert checkpoint_rel(Path("/nvme/ckpt"), Path("/nvme/ckpt")) == ""  # a source that is one checkpoint


def _gathered(tmp_path: Path, fmt: str, rels: list[str]) -> Gathered:
    files = tuple(LocalFile(r, tmp_path / r, 10, 100.0) for r in sorted(rels))
    return Gathered(Found("llm", Candidate(fmt, 5, tmp_path, True, ""), files, True, "", 100.0), (), ())


ZERO = [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(4)]


@pytest.mark.parametrize(
    ("fmt", "pattern", "rels", "missing", "node"),
    [
        # DeepSpeed ZeRO, ranks 0-1 on node 0 (with the model states), 2-3 on node 1: rank 2's file lost
        ("deepspeed", r"zero_pp_rank_(?P<rank>\d+)_", ["mp_rank_00_model_states.pt", *ZERO[:2], ZERO[3]],
         ZERO[2], "node-1"),
        # Megatron legacy, tensor ranks 0-1 on node 0, 2-3 on node 1: rank 2's directory absent
        ("megatron", r"mp_rank_(?P<rank>\d+)/", [f"mp_rank_{r:02d}/model_optim_rng.pt" for r in (0, 1, 3)],
         "mp_rank_02/", "node-1"),
        # ... or there, without its torch file
        ("megatron", r"mp_rank_(?P<rank>\d+)/",
         [*(f"mp_rank_{r:02d}/model_optim_rng.pt" for r in (0, 1, 3)), "mp_rank_02/notes.txt"],
         "mp_rank_02/model_optim_rng.pt", "node-1"),
        # DCP: rank 2's shard gone from node 1, rank 3's there
        ("dcp", DCP, [".metadata", "__0_0.distcp", "__1_0.distcp", "__3_0.distcp"], "__2_*.distcp", "node-1"),
    ],
)  # fmt: skip
def test_a_rank_file_missing_on_another_node_makes_the_checkpoint_invalid_naming_it_and_its_node(
    tmp_path: Path, fmt: str, pattern: str, rels: list[str], missing: str, node: str
) -> None:
    """Discovery, on node 0, sees node 0's files only: the layout's rank rule must run over all of them."""
    p = Placement(2, pattern, 2)
    problems = validate_gathered(_gathered(tmp_path, fmt, rels), p)
    assert len(problems) == 1 and problems[0].startswith(f"{missing}: missing on {node}"), problems
    # the same checkpoint with that file there is whole
    present = missing.replace("*", "0").rstrip("/") + ("/model_optim_rng.pt" if missing.endswith("/") else "")
    whole = [r for r in rels if r != "mp_rank_02/notes.txt"] + [present]
    assert validate_gathered(_gathered(tmp_path, fmt, whole), p) == []


def test_a_deepspeed_tag_without_model_states_over_every_node_is_invalid(tmp_path: Path) -> None:
    p = Placement(2, r"zero_pp_rank_(?P<rank>\d+)_", 2)
    problems = validate_gathered(_gathered(tmp_path, "deepspeed", ZERO), p)
    assert problems == ["no mp_rank_XX_model_states.pt yet (DeepSpeed's model states), over every node's files: "
                        "put the file back on its node (checked again next pass) or delete the checkpoint there"]
