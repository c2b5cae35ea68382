"""The tier flow: the retention policy as a cost-aware plan, shown first, applied on request. Wiring only."""

from __future__ import annotations

import time
from dataclasses import replace

from prefect import flow
from prefect.runtime import flow_run

from ckptvault.alerts import kinds as alerts
from ckptvault.catalog import Catalog, Event, events
from ckptvault.pricing import load_prices
from ckptvault.tiering.apply import Observation, Scheduled
from ckptvault.tiering.cost import class_map
from ckptvault.tiering.eviction import EvictionCheck
from ckptvault.tiering.milestone_lock import would_extend
from ckptvault.tiering.orders import EvictLocal, Expire, ScheduleTransition, orders, rules_to_install, tier_names
from ckptvault.tiering.policy import Action
from ckptvault.tiering.report import (
    applied_by_run,
    render_applied,
    render_markdown,
    render_text,
)
from ckptvault.tiering.result import Postponed, TierResult
from ckptvault_prefect.runtime import events as prefect_events
from ckptvault_prefect.runtime.hooks import HOOKS
from ckptvault_prefect.tasks.common import (
    compact_catalog_task,
    current_states_task,
    ledger_task,
    load_config_task,
    load_manifest_task,
    open_store_task,
    publish_markdown_task,
    record_task,
)
from ckptvault_prefect.tasks.notify import flow_run_url, fold_alert_state_task, notify_task
from ckptvault_prefect.tasks.tier import (
    evict_local_task,
    expire_task,
    extend_milestone_locks_task,
    install_lifecycle_task,
    observe_scheduled_task,
    plan_task,
    tag_for_server_task,
    transition_task,
)


@flow(name="tier", log_prints=True, **HOOKS)
def tier(apply: bool = False, now: float | None = None, config_path: str | None = None) -> TierResult:
    cfg = load_config_task(config_path)
    store = open_store_task(cfg)
    catalog = Catalog(store, cfg.store.prefix)
    prefix = cfg.store.prefix
    states = current_states_task(catalog)
    if catalog.unreadable:
        # the plan leaves out what could not be read; the watch and `ls` name it too (deduplicated)
        for key, why in sorted(catalog.unreadable.items()):
            print(f"warning: skipped the unreadable catalog object {key}: {why}")
        notify_task(cfg, store, alerts.catalog_unreadable_by_run(catalog.unreadable_by_run(), flow_run_url()))
    run_id = str(flow_run.id or "")
    said: list[Event] = []  # what this run recorded: its moves and expiries become Prefect events at the end

    def record(recorded: list[Event]) -> None:
        record_task(catalog, recorded)
        said.extend(recorded)

    observed: list[Observation] = []
    if apply:
        # where the bucket lifecycle has moved scheduled checkpoints since: the plan starts from there
        observed = [o for o in observe_scheduled_task(store, prefix, states) if o.arrived]
        if observed:
            record([o.event(run_id) for o in observed])
            states = current_states_task(catalog)
    kind = cfg.store.kind if cfg.store.kind != "auto" else store.kind()
    t = now if now is not None else time.time()
    # a save a replica should hold and does not is neither expired nor archived: the plan says it waits
    prices = load_prices(cfg.policy.prices)
    plan = plan_task(states, cfg.policy, prices, kind, t, cfg.node_local_runs(), cfg.replicas)
    would_lock = would_extend(states, cfg.policy, cfg.lock)  # the catalog's view; the apply HEADs each
    print(render_text(plan, would_lock))
    publish_markdown_task("tier-plan", render_markdown(plan, would_lock), "what the policy would do, and what it costs")
    planned = TierResult.planned(plan, tuple(would_lock))
    if not apply:
        return planned
    mode = cfg.policy.apply_mode
    classes = class_map(kind, cfg.policy.classes)
    if rules := rules_to_install(prefix, classes, cfg.policy):
        install_lifecycle_task(store, rules, cfg.store.manages_lifecycle)
    skipped: list[EvictionCheck] = []
    scheduled: list[Scheduled] = []
    done: list[Action] = []
    postponed: list[Postponed] = list(plan.postponed)  # the catalog's; the HEADs below may find more
    for order in orders(plan, states, cfg.policy, prefix, classes):
        a = order.action
        if isinstance(order, Expire):
            r = expire_task(store, prefix, a.run, a.step, a.save)
            if r.kind == "postponed":  # locked: nothing deleted, nothing recorded; the next run tries again
                print(f"{a.run} step {a.step} save {a.save}: {r.detail}")
                postponed.append(Postponed(a.run, a.step, a.save, r.detail))
                continue
            record([events.expired(a.run, a.step, a.reason, r.objects, run_id, save=a.save)])
            done.append(a)
            continue
        # the store re-check of this checkpoint's eviction found objects missing: moving them would fail
        if any(c.store and c.key == (a.run, a.step, a.save) for c in skipped):
            continue
        manifest = load_manifest_task(store, prefix, a.run, a.step, a.save)
        if isinstance(order, EvictLocal):
            ev = evict_local_task(store, prefix, manifest)
            if not ev.evicted:
                skipped.append(ev.check)
                record([ev.check.skipped_event(a.reason, run_id)])
                continue
            record([events.evicted_local(a.run, a.step, a.reason, ev.check.root, run_id, save=a.save)])
        elif isinstance(order, ScheduleTransition):
            sched = tag_for_server_task(store, prefix, manifest, order.tier, order.milestone, order.rule)
            scheduled.append(sched)
            record([sched.event(manifest, a.reason, run_id)])
        else:
            transition_task(store, prefix, manifest, order.action.to_class or "", order.tier, order.milestone)
            record([events.transitioned(manifest, a.to_class or "", a.reason, mode, run_id)])
        done.append(a)
    # milestones locked for longer than every save: raised after the moves (a copy keeps its lock)
    locked = extend_milestone_locks_task(store, prefix, states, cfg.policy, cfg.lock)
    for ext in locked:
        print(ext.said())
    record([x.event(run_id) for x in locked])
    applied = render_applied(skipped, scheduled, observed)
    publish_markdown_task("tier-applied", applied, "what the apply did, left to the bucket lifecycle, or skipped")
    # one file per event recorded adds up: merge every partition's and refresh its snapshot, time boxed
    # (a dry run writes nothing, compaction included)
    prefect_events.recorded(said)  # each save moved to a colder class or expired, for Prefect automations
    compacted = compact_catalog_task(catalog, time.time())
    report = replace(planned, applied=True, evict_skipped=tuple(skipped), scheduled=tuple(scheduled),
                     observed=tuple(observed), catalog_files_compacted=compacted,
                     expire_postponed=tuple(postponed), lock_extended=tuple(locked))  # fmt: skip
    digest = applied_by_run(plan, states, tier_names(classes, cfg.policy), done)
    url = flow_run_url()
    sent = [
        alerts.build("evict_skipped", run=c.run, step=c.step, save=c.save, local=list(map(str, c.local)),
                     store=list(map(str, c.store)), flow_run_url=url)
        for c in skipped
    ]  # fmt: skip
    sent += [
        alerts.build("tier_applied", run=d.run, moved=d.moved, bytes_moved=d.bytes,
                     saved_usd_per_month=d.saved_per_month, scheduled=d.scheduled, flow_run_url=url)
        for d in digest
    ]  # fmt: skip
    notify_task(cfg, store, sent)
    # the tier role may delete: fold the alert-state objects flows without deletes left (a no-op when
    # there is one); the catalog's leftovers went with the compaction above
    fold_alert_state_task(cfg, store)
    # the tier role may delete: this record also folds the ledger objects flows without deletes left
    ledger_task(store, prefix, None, "tier", delete=True)
    return report
