"""Restoring a node-local checkpoint onto each node's own disk (`ckptvault restore --node-local`).

The placement recorded in the manifest at ingest (for older manifests, the run's `[[sources]]` entry:
`locality = "node"`, its `node_pattern`; ckptvault.transfer.placement.Placement) says where each file lives,
so a restore puts each file back on the node that wrote it, at
`--dest` as that node sees it (`${CKPTVAULT_NODE}` in it replaced by the node's name). Each node's
worker checks its destination, stages into a directory beside it, downloads its files there, and
renames it into place only after every file on every node is verified: the same promise as a
single-directory restore, held per node. Node 0 also gets the files no pattern places (metadata,
configs) and the format's pointer file, as rank 0 writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ckptvault.checkpoint.manifest import Manifest
from ckptvault.config import NODE_PLACEHOLDER, Config, expand_node
from ckptvault.restore.plan import ObjectPlan
from ckptvault.restore.resolve import RestoreError
from ckptvault.restore.steps import check_destination, discard, finalize, staging_dir
from ckptvault.transfer.placement import Placement


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


def placement_to_use(manifest: Manifest, configured: Placement) -> tuple[Placement, str | None]:
    """The placement recorded in the manifest at ingest when it has one (the config may have changed
    since: another node_pattern, nodes or ranks_per_node would send files to the wrong nodes), else the
    configured one (manifests written before the record existed); and a note when the two differ."""
    # Compat: a manifest from before `placement` is placed as the config says; may go: never (FORMAT.md)
    if manifest.placement is None:
        return configured, None
    recorded = Placement.from_record(manifest.placement)
    if recorded == configured:
        return recorded, None
    return recorded, (
        f"placing files as recorded at ingest (nodes = {recorded.nodes}, node_pattern = {recorded.pattern!r}, "
        f"ranks_per_node = {recorded.ranks_per_node}), not as the config says now (nodes = {configured.nodes}, "
        f"node_pattern = {configured.pattern!r}, ranks_per_node = {configured.ranks_per_node})"
    )


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


class PartialRestoreError(RestoreError):
    """Some nodes' copies are in place and could not be put back: the message names each node's state."""


def others_seen(own: Path, others: Sequence[Path], node: str) -> list[str]:
    """On the node's worker: the other nodes' staging directories it finds beside its own (their names
    are unique). Any means two nodes' destinations are one directory, where each node's rename would
    replace the last one's. (Seeing another node's staging at another path is fine: per-node
    directories on a shared file system, `${CKPTVAULT_NODE}` in --dest.)"""
    return [str(p) for p in others if p != own and (own.parent / p.name).exists()]


def undo_on_node(staged: Path, dest: str, node: str, aside: str | None) -> None:
    """On the node's worker, after another node's rename failed: its copy moved back to its staging
    name, and the old contents (--force) back to the destination."""
    target = node_dest(dest, node)
    target.rename(staged)
    if aside is not None:
        Path(aside).rename(target)


def discard_on_node(staged: Path, node: str) -> None:
    """On the node's worker, after a failure on any node: its partial copy removed (only ours)."""
    discard(staged)


def dest_problem(dest: str, node_local: bool, this_node: str | None) -> str | None:
    """What is wrong with `--dest` as typed, seen from this host (None: fine). With --node-local each
    worker resolves it on its own node, so it must be absolute, and a shell that expanded
    ${CKPTVAULT_NODE} inside double quotes has turned it into this host's node name, the same path on
    every node. Without it, ${CKPTVAULT_NODE} would become a directory of that literal name."""
    if not node_local:
        if NODE_PLACEHOLDER in dest:
            return (
                f"--dest {dest} names {NODE_PLACEHOLDER}, which only --node-local replaces (each node's files on "
                "that node's disk); add --node-local, or give a --dest without it"
            )
        return None
    if not dest.startswith("/"):
        return f"--node-local: --dest {dest} is resolved on each node, so give an absolute path (no ~, no ./)"
    if NODE_PLACEHOLDER not in dest and this_node and this_node in Path(dest).parts:
        return (
            f"--node-local: --dest {dest} names this host's node ({this_node}), the same path on every node; the "
            f"shell replaced {NODE_PLACEHOLDER} inside double quotes: put --dest in single quotes"
        )
    return None
