"""The node-local restore protocol (`restore --node-local`): each node's files onto that node's own
disk, every step run on that node's worker by the submitter (ckptvault/transfer/submitter.py, `node=`; the
per-node steps are ckptvault/restore/nodes.py).

Nothing is renamed into place on any node until every file on every node is verified; node 0 (the
metadata and the pointer file) goes last, and if a rename fails the nodes already done are put back,
so a job never resumes from a checkpoint missing a node. Whatever fails, every node's staging
directory is removed: only our partial copies, never the destination.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from ckptvault.checkpoint.manifest import Manifest
from ckptvault.config import Config
from ckptvault.restore.nodes import (
    PartialRestoreError,
    discard_on_node,
    finalize_on_node,
    others_seen,
    placement_for,
    placement_to_use,
    plans_by_node,
    stage_on_node,
    undo_on_node,
)
from ckptvault.restore.plan import ObjectPlan
from ckptvault.restore.resolve import RestoreError
from ckptvault.restore.steps import download_one, write_pointer
from ckptvault.store import ObjectStore
from ckptvault.transfer.placement import require_workers
from ckptvault.transfer.progress import ProgressBar
from ckptvault.transfer.submitter import Submitter, settle


def restore_on_nodes(
    submit: Submitter, cfg: Config, store: ObjectStore, manifest: Manifest, plans: list[ObjectPlan], dest: str,
    force: bool, bar: ProgressBar,
) -> tuple[str | None, str | None]:  # fmt: skip
    """Every node's files verified in its staging directory, then renamed into place. Returns the
    pointer file and the kept-aside destinations (--force)."""
    placement, note = placement_to_use(manifest, placement_for(cfg, manifest.run))
    if note:  # print, looked up now: a flow with log_prints logs it
        print(f"{manifest.run} step {manifest.step}: {note}")
    require_workers(placement, submit.node_workers(), manifest.run, manifest.step, "written")
    groups = plans_by_node(placement, plans)
    names = {i: placement.name(i) for i in groups}

    staged_on = _each(submit, names, lambda i: partial(stage_on_node, dest, names[i], force))
    staged = {i: p for i, p in staged_on.items() if isinstance(p, Path)}
    try:
        problems = [f"{names[i]}: {e}" for i, e in staged_on.items() if isinstance(e, BaseException)]
        if problems:
            raise RestoreError("the destination is not usable on every node; nothing was restored:\n"
                               + "\n".join(problems))  # fmt: skip
        paths = list(staged.values())
        seen = _each(submit, names, lambda i: partial(others_seen, staged[i], paths, names[i]))
        shared = [f"{names[i]} sees {', '.join(s)}" if isinstance(s, list) else f"{names[i]} could not check: {s}"
                  for i, s in seen.items() if not isinstance(s, list) or s]  # fmt: skip
        if shared:
            raise RestoreError(
                f"--node-local: the nodes share {dest} (or a node could not check), so each node's rename would "
                "replace the last one's; nothing was restored. Give each node its own disk, e.g. "
                "--dest '/local_nvme/${CKPTVAULT_NODE}/restored' (single quotes), or drop --node-local:\n"
                + "\n".join(shared)
            )
        futures = []
        for i, group in groups.items():
            if group:  # each file is written by the worker of the node that holds it
                calls = [partial(download_one, store, plan, staged[i], manifest, bar) for plan in group]
                futures += submit.map(calls, names[i])
        errors = settle(futures)
        if errors:
            raise RestoreError(
                f"{len(errors)} of {len(plans)} files failed; nothing was changed at {dest} on any node:\n"
                + "\n".join(errors)
            )
        # every node's ranks look for the framework's pointer file on their own disk
        written = _each(submit, names, lambda i: partial(write_pointer, staged[i], manifest))
        if failed_pointer := [f"{names[i]}: {e}" for i, e in written.items() if isinstance(e, BaseException)]:
            raise RestoreError("the pointer file could not be written; nothing was restored:\n"
                               + "\n".join(failed_pointer))  # fmt: skip
    except BaseException:
        _each(submit, {i: names[i] for i in staged}, lambda i: partial(discard_on_node, staged[i], names[i]))
        raise
    asides = _finalize(submit, names, staged, dest, force)
    pointer = written[0]
    return (pointer if isinstance(pointer, str) else None), ", ".join(asides) if asides else None


def _finalize(submit: Submitter, names: dict[int, str], staged: dict[int, Path], dest: str, force: bool) -> list[str]:
    """Each node's rename into place: the others first, node 0 last; if one fails, the ones done are
    put back."""

    def rename(nodes: list[int]) -> dict[int, Any]:
        return _each(submit, {i: names[i] for i in nodes},
                     lambda i: partial(finalize_on_node, staged[i], dest, names[i], force))  # fmt: skip

    moved = rename([i for i in staged if i != 0])
    if not any(isinstance(r, BaseException) for r in moved.values()):
        moved |= rename([0])
    failed = {i: e for i, e in moved.items() if isinstance(e, BaseException)}
    if not failed:
        return [str(a) for a in moved.values() if a]
    done = [i for i in moved if i not in failed]
    undone = _each(submit, {i: names[i] for i in done},
                   lambda i: partial(undo_on_node, staged[i], dest, names[i], moved[i]))  # fmt: skip
    stuck = {i: e for i, e in undone.items() if isinstance(e, BaseException)}
    why = "\n".join(f"{names[i]}: {e}" for i, e in failed.items())
    if stuck:
        raise PartialRestoreError(
            f"every file was verified, but the rename into {dest} failed on {', '.join(names[i] for i in failed)}, "
            f"and putting back the copies already in place failed on {', '.join(names[i] for i in stuck)}: those "
            "nodes hold this checkpoint's files at --dest, the others do not; do not resume from it:\n"
            + why
            + "\n"
            + "\n".join(f"{names[i]}: {e}" for i, e in stuck.items())
        )
    _each(submit, {i: names[i] for i in staged}, lambda i: partial(discard_on_node, staged[i], names[i]))
    raise RestoreError(
        f"every file was verified, but the rename into {dest} failed on {', '.join(names[i] for i in failed)}; "
        f"the nodes already done were put back, so nothing was changed on any node:\n{why}"
    )


def _each(submit: Submitter, names: dict[int, str], call: Callable[[int], partial[Any]]) -> dict[int, Any]:
    """One call per node, each on that node's worker, all submitted before any is awaited; every
    result or exception, by node."""
    futures = {i: submit.map([call(i)], name)[0] for i, name in names.items()}
    return {i: f.result(raise_on_failure=False) for i, f in futures.items()}
