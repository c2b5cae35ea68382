"""What a restore picks from when the run's catalog cannot be read: the run's manifests in the store,
the source of truth (docs/FORMAT.md: the catalog can always be rebuilt from them).

A restore must not wait for a person to repair a catalog object at 3 a.m. When any object that may hold
the run's events (its partition's, the flat layout's) could not be read, the events that could are
joined by one `verified` event per committed save, rebuilt from the run's manifests, and the supersedes a
commit in that order would have recorded; the rest of a restore reads manifests, not the catalog.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptvault.catalog import Catalog, CheckpointState, Event, fold
from ckptvault.catalog import events as event_builders
from ckptvault.catalog.saves import replay_supersedes
from ckptvault.command import memo
from ckptvault.restore.estimate import restore_throughput


@dataclass(frozen=True)
class RunHistory:
    """A run's events as a restore reads them, once (`read_run`): the checkpoint is resolved from them
    and the estimate's throughput measured on them, without a second read of the catalog."""

    events: tuple[Event, ...]
    unreadable: dict[str, str]  # catalog objects of the run that could not be read: key -> why
    # the catalog's current state of the run (its snapshot and the events since), when it read in full
    current: tuple[CheckpointState, ...] | None = None

    def states(self) -> list[CheckpointState]:
        # the snapshot's rows where the catalog read in full: the same states as folding every event
        # again in Python (0.1-0.35 s for a 1,000-event run; bench/README.md), which the fallback does
        return list(self.current) if self.current is not None else fold(self.events)

    def throughput(self) -> float | None:
        """MiB/s of the run's newest measured restore or drill (None: none yet)."""
        return restore_throughput(self.events)


def read_run(catalog: Catalog, run: str) -> RunHistory:
    with catalog.read_once():  # the state and the events list the same partition and read its event files
        states = catalog.current(run)
        got, unreadable = _events(catalog, run)
    return RunHistory(tuple(got), unreadable, None if unreadable else tuple(states))


def read_run_once(catalog: Catalog, run: str) -> RunHistory:
    """`read_run`, once per command (ckptvault/command/memo.py, `remembered`): with a Prefect API, `ckptvault
    restore` reads the run to exit 2 on bad input before a flow run exists, then its flow, in the same
    process ~0.2 s later, reads it again to resolve the step and save the command line already resolved
    and passes it: that second read is the first's snapshot, for the same store object, prefix and run,
    within memo.READ_MAX_AGE_S. A history with unreadable objects is remembered too: the command line only
    warns of them, the flow alerts (direct mode, which runs no flow, alerts itself), so still once.
    Outside a command (a deployment's flow run) every call reads."""
    return memo.remembered(("run-history", memo.Same(catalog.store), catalog.prefix, run),
                           lambda: read_run(catalog, run))  # fmt: skip


def read_replica(catalog: Catalog, run: str) -> RunHistory:
    """A run's saves from a replica's manifests alone (a replica holds no catalog: docs/FORMAT.md,
    "Replicas", "Reading"): for a restore when the primary, and so its catalog, cannot be reached. One
    LIST of the run's prefix and a GET of each manifest, as `catalog rebuild` does; the supersedes a
    commit in that order would have recorded replayed."""
    rebuilt = [e for e in catalog.rebuild_from_manifests(run=run, lock_heads=False) if e.run == run]
    rebuilt.sort(key=lambda e: e.at)
    replaced = [
        event_builders.superseded(x.state.run, x.state.step, x.state.save, x.reason, *x.by)
        for x in replay_supersedes([s for s in fold(rebuilt) if not s.superseded])
    ]
    return RunHistory(tuple(sorted([*rebuilt, *replaced], key=lambda e: e.at)), {})


def run_events(catalog: Catalog, run: str) -> tuple[list[Event], dict[str, str]]:
    """The run's events in time order and the catalog objects of the run that could not be read
    (key -> why); when there are any, with what the run's manifests say added."""
    # the current state too: it reads the snapshot, so what is found unreadable (and alerted) is the
    # same set as `ls` finds, and the alert deduplicates
    catalog.current(run)
    return _events(catalog, run)


def _events(catalog: Catalog, run: str) -> tuple[list[Event], dict[str, str]]:
    got = catalog.events(run)
    bad = catalog.unreadable_of(run)
    if not bad:
        return got, {}
    # which saves exist is all a restore needs: no HEAD of the locked manifests
    rebuilt = [e for e in catalog.rebuild_from_manifests(run=run, lock_heads=False) if e.run == run]
    joined = sorted([*got, *rebuilt], key=lambda e: e.at)  # stable: the catalog's order for ties
    replaced = [
        event_builders.superseded(x.state.run, x.state.step, x.state.save, x.reason, *x.by)
        for x in replay_supersedes([s for s in fold(joined) if not s.superseded])
    ]
    return sorted([*joined, *replaced], key=lambda e: e.at), bad


def fallback_warning(run: str, bad: dict[str, str]) -> str:
    keys = sorted(bad)
    shown = "; ".join(bad[k] if bad[k].startswith(k) else f"{k} ({bad[k]})" for k in keys[:3])
    if len(keys) > 3:
        shown += f"; and {len(keys) - 3} more"
    return (
        f"the catalog of run {run} could not be read in full: {shown}. Restoring from the run's manifests in "
        "the store, the source of truth; every file is still checked against its manifest's CRC32C"
    )
