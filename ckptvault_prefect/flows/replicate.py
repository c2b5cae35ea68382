"""The replicate flow: copy the committed saves each `[[replicas]]` store should hold and does not
(docs/replicas.md, docs/FORMAT.md "Replicas"). Wiring only, the calls of `ckptvault replicate`:
config -> the replicas' stores, checked -> the saves each wants -> one task run per replica, all at once
-> the artifact -> an alert per save not copied. Like ingest, a save that fails does not stop the
others; the run ends Failed once everything is recorded and alerted."""

from __future__ import annotations

from prefect import flow, unmapped

from ckptvault.catalog import Catalog
from ckptvault.replication import ReplicaPass, ReplicateIncomplete, ReplicateResult, select_replicas
from ckptvault_prefect.runtime import events as prefect_events
from ckptvault_prefect.runtime.hooks import HOOKS
from ckptvault_prefect.tasks.common import (
    current_states_task,
    ledger_task,
    load_config_task,
    open_store_task,
    publish_markdown_task,
)
from ckptvault_prefect.tasks.notify import flow_run_url, notify_task
from ckptvault_prefect.tasks.replicate import open_replica_task, replicate_task, wanted_task
from ckptvault_prefect.tasks.step import wait_all


@flow(name="replicate", log_prints=True, **HOOKS)
def replicate(replica: str | None = None, config_path: str | None = None) -> ReplicateResult:
    """Every replica, or only the one named `replica`. Returns what each copied; raises
    ReplicateIncomplete, carrying it, if a save was not copied (each alerted on, naming replica and
    save). No [[replicas]] configured: nothing to do, and the run completes (the deployment is
    scheduled for every config)."""
    cfg = load_config_task(config_path)
    chosen = select_replicas(cfg.replicas, replica)  # an unknown name fails the run, naming it
    if not chosen:
        print("no [[replicas]] configured: nothing to copy")
        return ReplicateResult()
    primary = open_store_task(cfg)
    stores = [open_replica_task(r, cfg.lock) for r in chosen]  # every replica checked before any copy
    catalog = Catalog(primary, cfg.store.prefix)
    states = current_states_task(catalog)
    saves = [wanted_task(states, r, cfg.policy) for r in chosen]
    futures = replicate_task.map(
        unmapped(primary), unmapped(cfg.store.prefix), stores, chosen, saves, unmapped(cfg.lock), unmapped(catalog)
    )
    wait_all(futures)
    outcomes: list[tuple[str, ReplicaPass | BaseException]] = [
        (r.name, f.result(raise_on_failure=False)) for r, f in zip(chosen, futures, strict=True)
    ]
    result = ReplicateResult.of(outcomes)
    prefect_events.replicated(result)  # each copy committed (recorded by the pass), for Prefect automations
    for _, line in result.lines():
        print(line)
    publish_markdown_task("replicate-report", result.to_markdown(), "what each replica was sent, and what failed")
    notify_task(cfg, primary, result.alerts(flow_run_url()))
    ledger_task(primary, cfg.store.prefix, None, "replicate" if result.ok else None, delete=cfg.store.flows_delete)
    if not result.ok:
        raise ReplicateIncomplete(result)
    return result
