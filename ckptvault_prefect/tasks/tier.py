"""Prefect tasks of the tier flow: one library call each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckptvault.catalog import CheckpointState
from ckptvault.config import PolicyConfig
from ckptvault.manifest import Manifest
from ckptvault.store import ObjectStore
from ckptvault.tiering import apply as tiering
from ckptvault.tiering import eviction, policy
from ckptvault.tiering.cost import PriceTable
from ckptvault_prefect.tasks.retry import io_task, local_task


@local_task("plan")
def plan_task(
    states: Sequence[CheckpointState], cfg: PolicyConfig, prices: PriceTable, store_kind: str, now: float
) -> policy.Plan:
    return policy.plan(states, cfg, prices, store_kind, now)


@io_task("transition", task_run_name="transition-{manifest.run}-{manifest.step}")
def transition_task(
    store: ObjectStore, prefix: str, manifest: Manifest, to_class: str, tier: str, milestone: bool
) -> tiering.StepResult:
    return tiering.transition(store, prefix, manifest, to_class, tier, milestone)


@io_task("tag-for-lifecycle", task_run_name="tag-{manifest.run}-{manifest.step}-{manifest.save}")
def tag_for_server_task(
    store: ObjectStore, prefix: str, manifest: Manifest, tier: str, milestone: bool, rule: dict[str, Any]
) -> tiering.Scheduled:
    return tiering.tag_for_server(store, prefix, manifest, tier, milestone, rule)


@io_task("observe-scheduled")
def observe_scheduled_task(
    store: ObjectStore, prefix: str, states: Sequence[CheckpointState]
) -> list[tiering.Observation]:
    return tiering.observe_scheduled(store, prefix, states)


@io_task("expire", task_run_name="expire-{run}-{step}")
def expire_task(store: ObjectStore, prefix: str, run: str, step: int, save: int = 1) -> tiering.StepResult:
    return tiering.expire(store, prefix, run, step, save)


@io_task("evict-local", task_run_name="evict-{manifest.run}-{manifest.step}-{manifest.save}")
def evict_local_task(store: ObjectStore, prefix: str, manifest: Manifest) -> eviction.Eviction:
    return eviction.evict_local(store, prefix, manifest)


@io_task("install-lifecycle")
def install_lifecycle_task(store: ObjectStore, rules: list[dict[str, Any]]) -> int:
    return tiering.install_lifecycle(store, rules)
