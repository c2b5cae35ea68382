"""The ingest flow's body, importable without Prefect: discover, then one ingest pass (ckptvault/ingest/
ingest_pass.py: decide, gate, upload, commit, record), then publish, alert and compact. Wiring only:
the pass runs each of its library calls as the step that wraps it.

The `ingest` flow (ckptvault_prefect/flows/ingest.py) is this function under `@flow`; the command line
without a Prefect API calls it directly (ckptvault_cli/running.py, direct mode), and then no module
it imports imports Prefect: that import was 1-3 s of every such `ckptvault ingest`
(tests/unit/test_cli_imports.py holds it)."""

from __future__ import annotations

import time

from ckptvault.catalog import Catalog, CheckpointState
from ckptvault.checkpoint import written_by as reported
from ckptvault.clock import timing
from ckptvault.clock.timing import phase
from ckptvault.config import Config
from ckptvault.ingest import narrow
from ckptvault.ingest.discovery import Found
from ckptvault.ingest.ingest_pass import IngestPass
from ckptvault.ingest.steps import IngestIncomplete, Outcome, ledger_counts
from ckptvault.store import POLICY, ObjectStore
from ckptvault_prefect.runtime import events as prefect_events
from ckptvault_prefect.runtime.ingest import IngestSubmitter
from ckptvault_prefect.tasks.common import (
    compact_catalog_task,
    ledger_task,
    load_config_task,
    open_store_task,
    publish_markdown_task,
)
from ckptvault_prefect.tasks.ingest import (
    ensure_bucket_rules_task,
    find_checkpoints_task,
    find_step_task,
    find_steps_task,
    known_states_task,
    publish_outcomes_task,
    release_gate_child_task,
)
from ckptvault_prefect.tasks.notify import flow_run_url, notify_task


def ingest_body(
    config_path: str | None = None,
    run: str | None = None,
    step: int | None = None,
    flow_run_id: str = "",
    preflighted: tuple[Config, ObjectStore] | None = None,
    settle_wait: bool = True,
    steps: list[int] | None = None,
    written_by: str = "",
) -> list[Outcome]:
    """One pass over every configured source (or only `run`'s; with `step` too, only that step of it,
    ckptvault/ingest/narrow.py). Fails (after recording everything) if any finished checkpoint ended
    neither uploaded nor already present. `flow_run_id`: the Prefect flow run's, recorded in the
    catalog's events ("" in direct mode). `preflighted`: the config `config_path` names and its store,
    bucket already probed, from a caller in this process that did both (the command line in direct
    mode): not parsed and probed a second time. `settle_wait`: a named step waiting only for its settle
    time is waited for when that is soon (narrow.find_step_settled); `follow`, which looks again at the
    settle time itself, says False so one run's wait never holds up the others. `steps`: several steps
    of `run` in one pass (with `step` too, that one among them): a hook's queued saves, one discovery.
    `written_by`: what the training process that saved the named steps reported it ran (`KEY=VERSION`
    words, the hook's event payload), recorded in their manifests; words that do not read are reported
    and left out, never a failed ingest."""
    with phase(timing.PREFLIGHT):
        cfg = load_config_task(config_path) if preflighted is None else preflighted[0]
        named = narrow.named_steps(step, steps)
        if named and run is None:
            raise narrow.UnknownRunError("a step names no checkpoint without its run: give run as well as step")
        sources = narrow.narrow_sources(cfg.sources, run)
        reported_by, unread = reported.parse_leniently(written_by)
        if unread:
            print(unread)
        store = open_store_task(cfg) if preflighted is None else preflighted[1]
        ensure_bucket_rules_task(store, cfg.store)
    catalog = Catalog(store, cfg.store.prefix)
    known: dict[str, dict[int, CheckpointState]] = {}
    founds: list[Found] = []
    for source in sources:
        with phase(timing.CATALOG_READ):
            known[source.run] = known_states_task(catalog, source.run)
        with phase(timing.DISCOVERY):
            if not named:
                result = find_checkpoints_task(source)
            elif len(named) == 1:  # one step, as the trigger and follow name it: its task run named by it
                result = find_step_task(source, named[0], settle_wait)
            else:
                result = find_steps_task(source, named, settle_wait)
        for problem in result.problems:
            print(f"{source.run}: {problem}")
        founds += narrow.with_reported(result.found, named, reported_by)
    with IngestSubmitter() as submit:  # the transfer on plain threads unless on Dask (its docstring)
        ingest_pass = IngestPass(cfg, store, catalog, flow_run_id, known, submit)
        outcomes = ingest_pass.run(founds)
    with phase(timing.GATES):
        release_gate_child_task()
    prefect_events.recorded(ingest_pass.recorded)  # what the pass recorded in the catalog, for Prefect automations
    with phase(timing.ARTIFACTS):
        publish_outcomes_task(outcomes)
        if ingest_pass.reports:
            markdown = "\n\n".join(r.to_markdown() for r in ingest_pass.reports)
            publish_markdown_task("ingest-validation", markdown, "quality gates")
    with phase(timing.ALERTS):
        notify_task(cfg, store, ingest_pass.alerts(outcomes, flow_run_url(), POLICY.attempts))
    # after the alerts, which must not wait on it: this pass's events into its runs' snapshots, so the
    # next read of a run is one snapshot and a few files; time boxed. With [store] deletes = "tier-only"
    # this role may not delete: snapshots only, the tier flow merges and deletes
    with phase(timing.COMPACTION):
        compact_catalog_task(catalog, time.time(), [s.run for s in sources], deletes=cfg.store.flows_delete)
    ok = all(o.ok for o in outcomes)
    # the metrics' ledger (docs/metrics.md): failed uploads by error class, and a success when there are none
    ledger_task(
        store, cfg.store.prefix, ledger_counts(outcomes), "ingest" if ok else None, delete=cfg.store.flows_delete
    )
    if not ok:
        raise IngestIncomplete(outcomes)
    return outcomes
