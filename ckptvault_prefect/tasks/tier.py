"""Prefect tasks of the tier flow: one library call each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckptvault.catalog import CheckpointState
from ckptvault.checkpoint.manifest import Manifest
from ckptvault.config import PolicyConfig, ReplicaConfig
from ckptvault.pricing import PriceTable
from ckptvault.store import ObjectStore
from ckptvault.tiering import apply as tiering
from ckptvault.tiering import eviction, milestone_lock, policy, replica_selection
from ckptvault_prefect.tasks.retry import io_task, local_task


@local_task("plan")
def plan_task(
    states: Sequence[CheckpointState],
    cfg: PolicyConfig,
    prices: PriceTable,
    store_kind: str,
    now: float,
    node_local: frozenset[str] = frozenset(),
    replicas: Sequence[ReplicaConfig] = (),
) -> policy.Plan:
    waits = replica_selection.unreplicated(states, replicas, cfg, now)
    return policy.plan(states, cfg, prices, store_kind, now, node_local, waits)


transition_task = io_task("transition", task_run_name="transition-{manifest.run}-{manifest.step}")(tiering.transition)


@io_task("tag-for-lifecycle", task_run_name="tag-{manifest.run}-{manifest.step}-{manifest.save}")
def tag_for_server_task(
    store: ObjectStore, prefix: str, manifest: Manifest, tier: str, milestone: bool, rule: dict[str, Any]
) -> tiering.Scheduled:
    return tiering.tag_for_server(store, prefix, manifest, tier, milestone, rule)


observe_scheduled_task = io_task("observe-scheduled")(tiering.observe_scheduled)


expire_task = io_task("expire", task_run_name="expire-{run}-{step}")(tiering.expire)


evict_local_task = io_task("evict-local", task_run_name="evict-{manifest.run}-{manifest.step}-{manifest.save}")(
    eviction.evict_local
)


install_lifecycle_task = io_task("install-lifecycle")(tiering.install_lifecycle)


extend_milestone_locks_task = io_task("extend-milestone-locks")(milestone_lock.extend_all)
