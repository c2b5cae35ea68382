"""Node-local checkpoints (`locality = "node"`): which node holds each file, and what one node holds.

Megatron, DCP and DeepSpeed write one file per rank, and large jobs write them to each node's local
NVMe, which only that node can read. Such a source names its nodes (`nodes = N`: node-0 .. node-N-1)
and a `node_pattern` that places a file from its path: a regular expression searched in the file's
path inside the checkpoint, whose group `rank` gives node = rank // ranks_per_node, or whose group
`node` gives the node itself. A file the pattern does not match (`.metadata`, configs, `latest`) is
node 0's: every framework writes those from rank 0.

How a pass reads such a source (docs/OPERATIONS.md, "Node-local shards"): the flow runs on node 0 and
finds the checkpoints there, by the layout's rules, as for any source; then every node's Dask worker
lists the same checkpoint directory on its own disk (`list_node`), keeping the files placed on it and
checking their headers there; `merge` makes one checkpoint of the listings. It is ready only when
every node has sent files and none changed for settle_seconds: the commit waits for the last node.

`CKPTVAULT_NODE` in a source path is replaced by the node name of the process that reads it: the
path is the same string on every node, and nodes whose mounts differ by name can still share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, TypeVar

from ckptvault.checkpoint.local_files import LocalFile
from ckptvault.config import NODE_ENV, NODE_PLACEHOLDER, expand_node
from ckptvault.formats import dcp, deepspeed, megatron
from ckptvault.ingest.discovery import Found, _quiet_reason, walk
from ckptvault.ingest.structure import INDEX_SUFFIX, _check_file, check_names
from ckptvault.transfer.placement import NodeError, Placement


def listing_timed_out(placement: Placement, node: int, run: str, step: int, seconds: float) -> NodeError:
    return NodeError(
        f"{run} step {step}: {placement.name(node)} did not list its files within {seconds:g} s "
        "([scale] node_timeout_seconds); is its worker alive?"
    )


def checkpoint_rel(source_path: Path, ckpt_path: Path) -> str:
    """Where a checkpoint the flow found (on its node) lies under the source path: the same on every node."""
    rel = ckpt_path.relative_to(node_path(source_path)).as_posix()
    return "" if rel == "." else rel


def node_path(path: Path, node: str | None = None) -> Path:
    """`path` as this node sees it: CKPTVAULT_NODE replaced by `node` (default: this process's)."""
    out = expand_node(path, node)
    if out is None:
        raise NodeError(
            f"{path}: names {NODE_PLACEHOLDER}, but {NODE_ENV} is not set in this process; set it to the "
            "node's name (node-0, node-1, ...) where the flow and each Dask worker run"
        )
    return out


@dataclass(frozen=True)
class NodeListing:
    """What one node holds of one checkpoint."""

    node: int
    files: tuple[LocalFile, ...]  # the files placed on this node, sorted by rel
    newest_mtime: float
    problems: tuple[str, ...]  # structural (headers) or unreadable: each names the file and the node
    elsewhere: tuple[str, ...]  # files here that the pattern places on another node: not archived from here


def list_node(source_path: Path, ckpt_rel: str, node: int, placement: Placement) -> NodeListing:
    """Run on the node itself: the checkpoint `ckpt_rel` (relative to the source path) on its own disk.

    Each file's header is checked here, where it can be read. An index file's check that its shards
    exist needs every node's names: node 0's index files are checked by the flow, on node 0, with
    every node's names (`readable_index_files`); those on other nodes are not checked."""
    name = placement.name(node)
    # this task is pinned to the worker that serves `name`: that is who we are, whatever the env says
    root = node_path(source_path, name)
    top = root / ckpt_rel if ckpt_rel else root
    walk_problems: list[str] = []
    if not top.exists():
        return NodeListing(node, (), 0.0, (), ())
    if top.is_file():
        st = top.stat()
        files = [LocalFile(top.name, top, st.st_size, st.st_mtime)]
        newest = st.st_mtime
    else:
        files, newest, error = walk(top, walk_problems)
        if error:
            walk_problems.append(f"{name}: {error}")
    mine = tuple(f for f in files if placement.node_of(f.rel) == node)
    present = {f.rel for f in mine}
    problems = [
        f"{name}: {p}" for f in mine if not f.rel.endswith(INDEX_SUFFIX) for p in _check_file(f, present)
    ]
    elsewhere = tuple(f.rel for f in files if placement.node_of(f.rel) != node)
    return NodeListing(node, mine, newest, tuple(walk_problems + problems), elsewhere)


@dataclass(frozen=True)
class Gathered:
    """A node-local checkpoint made whole from its nodes' listings."""

    found: Found  # every node's files; ready only when every node has sent some and all are settled
    problems: tuple[str, ...]  # the nodes' structural problems: the checkpoint is invalid
    notes: tuple[str, ...]  # said, not fatal: copies of a file on a node that does not hold it


def merge(found: Found, placement: Placement, listings: list[NodeListing], settle_seconds: float,
          now: float) -> Gathered:  # fmt: skip
    """One checkpoint from every node's listing of it; `found` is the flow's own discovery of it."""
    by_node = {x.node: x for x in listings}
    assert sorted(by_node) == list(range(placement.nodes)), sorted(by_node)
    files = tuple(sorted(f for x in listings for f in x.files))
    empty = [placement.name(x.node) for x in sorted(listings, key=lambda x: x.node) if not x.files]
    newest = max([found.newest_mtime, *(x.newest_mtime for x in listings if x.files)])
    reason = ""
    if empty:
        reason = f"waiting for {', '.join(empty)}: none of {'their' if len(empty) > 1 else 'its'} files are there yet"
    else:
        reason = _quiet_reason(newest, settle_seconds, now)
    notes = tuple(
        f"{placement.name(x.node)}: {rel} is there too, but node_pattern places it on "
        f"{placement.name(placement.node_of(rel))}; archived from there only"
        for x in listings
        for rel in x.elsewhere
    )
    merged = replace(found, files=files, ready=found.ready and not reason, reason=found.reason or reason,
                     newest_mtime=newest)  # fmt: skip
    return Gathered(merged, tuple(p for x in listings for p in x.problems), notes)


class _Job(Protocol):
    @property
    def file(self) -> LocalFile: ...


J = TypeVar("J", bound=_Job)


def jobs_by_node(placement: Placement, jobs: Sequence[J]) -> dict[int, list[J]]:
    """The upload jobs each node runs, by node index (every node present, maybe with none)."""
    out: dict[int, list[J]] = {i: [] for i in range(placement.nodes)}
    for job in jobs:
        out[placement.node_of(job.file.rel)].append(job)
    return out


def readable_index_files(placement: Placement, files: tuple[LocalFile, ...]) -> list[LocalFile]:
    """The index files the flow (on node 0) can read, to check their shards against every node's names."""
    return [f for f in files if f.rel.endswith(INDEX_SUFFIX) and placement.node_of(f.rel) == 0]


_RANK_FIX = "put the file back on its node (checked again next pass) or delete the checkpoint there"


def rank_gaps(placement: Placement, fmt: str, rels: Sequence[str]) -> list[str]:
    """The layout's rank-completeness rule over every node's names, each missing file named with the
    node that should hold it. Discovery runs these rules on the flow's node, which sees node 0's
    files only: a rank file missing on another node, while that node has others, shows only here.
    By now every node has sent files and they have settled, so a gap is a rank that did not save or a
    node that lost the file: the checkpoint is invalid (not waiting), and valid again once it appears."""
    top = {r for r in rels if "/" not in r}
    what = ""
    gaps: list[str] = []
    if fmt == deepspeed.LAYOUT_NAME:
        what, gaps = deepspeed.rank_file_gaps(top)
    elif fmt == megatron.MegatronLayout.name:
        with_pt = {r.split("/")[0] for r in rels if r.count("/") == 1 and r.endswith(".pt")}
        what, gaps = megatron.rank_grid_gaps({r.split("/")[0] for r in rels}, with_pt.__contains__)
    if what and not gaps:
        return [f"{what}, over every node's files: {_RANK_FIX}"]
    gaps += dcp.rank_gaps(rels)  # every layout that writes .distcp shards (DCP, Megatron torch_dist, NeMo)
    # a DCP gap is `__R_*.distcp`: place it by a concrete name of that rank
    return [
        f"{g}: missing on {placement.name(placement.node_of(g.replace('*', '0')))}"
        f"{f' ({what})' if what else ''}: its rank did not save it, or that node lost it; {_RANK_FIX}"
        for g in gaps
    ]


def validate_gathered(gathered: Gathered, placement: Placement) -> list[str]:
    """Every structural problem of a node-local checkpoint: the nodes' own (headers, checked where
    each file is) and those over the whole checkpoint's names, on the flow's node: the layout's
    rank-completeness rules included (`rank_gaps`)."""
    f = gathered.found
    names = check_names(f.format, f.path, f.files, readable_index_files(placement, f.files))
    return names + rank_gaps(placement, f.format, [x.rel for x in f.files]) + list(gathered.problems)
