"""Restoring a node-local checkpoint onto each node's own disk (`ckptvault restore --node-local`).

The run's `[[sources]]` entry says where each file lives (`locality = "node"`, its `node_pattern`:
ckptvault.ingest.nodes.Placement), so a restore puts each file back on the node that wrote it, at
`--dest` as that node sees it (`${CKPTVAULT_NODE}` in it replaced by the node's name). Each node's
worker checks its destination, stages into a directory beside it, downloads its files there, and
renames it into place only after every file on every node is verified: the same promise as a
single-directory restore, held per node. Node 0 also gets the files no pattern places (metadata,
configs) and the format's pointer file, as rank 0 writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ckptvault.config import NODE_PLACEHOLDER, Config, expand_node
from ckptvault.ingest.nodes import Placement
from ckptvault.restore.plan import ObjectPlan
from ckptvault.restore.resolve import RestoreError
from ckptvault.restore.steps import check_destination, discard, finalize, staging_dir


def placement_for(cfg: Config, run: str) -> Placement:
    """Where run `run`'s files live, from its node-local `[[sources]]` entry; RestoreError naming the fix
    when the config has none."""
    source = next((s for s in cfg.sources if s.run == run), None)
    if source is None or source.locality != "node":
        what = "has no [[sources]] entry" if source is None else 'has a [[sources]] entry without locality = "node"'
        raise RestoreError(
            f"--node-local: run {run!r} {what} in this config, so which node holds which file is unknown. "
            f'Use the config that ingests it (locality = "node", nodes, node_pattern), or drop --node-local to '
            "restore every file into one directory"
        )
    return Placement.of(source)


def plans_by_node(placement: Placement, plans: Sequence[ObjectPlan]) -> dict[int, list[ObjectPlan]]:
    """Each node's files, in the plans' order (largest first); node 0 always, for the pointer file."""
    out: dict[int, list[ObjectPlan]] = {0: []}
    for plan in plans:
        out.setdefault(placement.node_of(plan.path), []).append(plan)
    return dict(sorted(out.items()))


def node_dest(dest: str, node: str) -> Path:
    """`dest` as node `node` sees it."""
    expanded = expand_node(Path(dest).expanduser(), node)
    assert expanded is not None  # a node name is given
    return expanded.resolve()


def stage_on_node(dest: str, node: str, force: bool) -> Path:
    """On the node's worker: its destination checked (empty or new, or --force), a staging directory beside it."""
    target = node_dest(dest, node)
    check_destination(target, force)
    return staging_dir(target)


def finalize_on_node(staged: Path, dest: str, node: str, force: bool) -> str | None:
    """On the node's worker: the verified staging directory renamed into place; the old contents' new
    name with --force (kept, never deleted)."""
    aside = finalize(staged, node_dest(dest, node), force)
    return str(aside) if aside else None


def discard_on_node(staged: Path, node: str) -> None:
    """On the node's worker, after a failure on any node: its partial copy removed (only ours)."""
    discard(staged)


def shared_dest_hint(dest: str) -> str | None:
    """What to say when `dest` names a per-node path but --node-local is not given."""
    if NODE_PLACEHOLDER in dest:
        return (
            f"--dest {dest} names {NODE_PLACEHOLDER}, which only --node-local replaces (each node's files on "
            "that node's disk); add --node-local, or give a --dest without it"
        )
    return None
