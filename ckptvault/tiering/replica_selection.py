"""Which committed saves each replica holds (`[[replicas]] takes`; docs/FORMAT.md, "Replicas"): a pure
decision over the catalog's states, beside the retention policy whose milestones it reuses.

A save no longer wanted (it fell out of a run's newest N) is not returned, and that is all: what a
replica already holds goes only by the replica's own retention. Deletes never travel."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ckptvault.catalog.model import CheckpointState
from ckptvault.config import PolicyConfig, ReplicaConfig
from ckptvault.tiering.policy import milestones


def wanted(
    states: Sequence[CheckpointState], replica: ReplicaConfig, policy: PolicyConfig, now: float | None = None
) -> list[CheckpointState]:
    """The saves `replica` should hold, sorted by (run, step, save). Only saves the primary holds
    committed (verified, not expired) can be copied. `all`: every one, superseded saves included (a
    restart's abandoned branch is still a checkpoint someone may want); `milestones`: the current save
    of each step the policy keeps forever; `newest N`: each run's N newest current saves.

    With the replica's own retention (`expire_after_days`), a save committed on the primary longer ago
    than that is not wanted (`now`: unix s, default the clock): its copy is past the replica's retention,
    so copying it would only feed the replica's lifecycle rule (copied, expired, copied again), and
    neither the tier plan nor the lag alert waits for it."""
    committed = [s for s in states if s.verified and s.state != "expired"]
    if replica.expire_after_days is not None:
        t = time.time() if now is None else now
        limit = replica.expire_after_days * 86400.0
        committed = [s for s in committed if t - (s.uploaded_at if s.uploaded_at is not None else s.updated_at) < limit]
    if replica.takes == "all":
        return sorted(committed, key=lambda s: s.key)
    current = [s for s in committed if not s.superseded]
    if replica.takes == "milestones":
        keep = milestones(states, policy)
        return sorted((s for s in current if (s.run, s.step) in keep), key=lambda s: s.key)
    n = replica.newest
    assert n is not None, replica.takes  # the config accepts nothing else
    by_run: dict[str, list[CheckpointState]] = {}
    for s in sorted(current, key=lambda s: (s.step, s.save), reverse=True):
        by_run.setdefault(s.run, []).append(s)
    return sorted((s for ss in by_run.values() for s in ss[:n]), key=lambda s: s.key)


def unreplicated(
    states: Sequence[CheckpointState],
    replicas: Sequence[ReplicaConfig],
    policy: PolicyConfig,
    now: float | None = None,
) -> dict[tuple[str, int, int], tuple[str, ...]]:
    """Save -> the replicas (in config order) that should hold it (`wanted`) and have no copy of it in the
    catalog (no `replicated` event naming them): what the tier plan waits for (`policy.plan`'s
    `unreplicated`) and the watch's lag alert counts."""
    out: dict[tuple[str, int, int], tuple[str, ...]] = {}
    for r in replicas:
        for s in wanted(states, r, policy, now):
            if not any(c.store == r.name for c in s.replicas):
                out[s.key] = (*out.get(s.key, ()), r.name)
    return out
