"""The ingest flow: its body (ckptvault_prefect/flows/ingest_body.py, importable without Prefect) as a
Prefect flow run, with the flow run's id in the catalog's events and the failure hooks' alert."""

from __future__ import annotations

from prefect import flow
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from ckptvault.ingest.steps import Outcome
from ckptvault_prefect.flows.ingest_body import ingest_body
from ckptvault_prefect.runtime.hooks import HOOKS


@flow(name="ingest", task_runner=ThreadPoolTaskRunner(max_workers=2), log_prints=True, **HOOKS)  # type: ignore[arg-type]
def ingest(
    config_path: str | None = None,
    run: str | None = None,
    step: int | None = None,
    settle_wait: bool = True,
    steps: list[int] | None = None,
    written_by: str = "",
) -> list[Outcome]:
    """One pass over every configured source (or only `run`'s; with `step` too, only that step of it,
    as the deployment's trigger asks; with `steps`, only those, ckptvault/ingest/narrow.py). Fails
    (after recording everything) if any finished checkpoint ended neither uploaded nor already present.
    `settle_wait`, `written_by`: see ingest_body."""
    return ingest_body(
        config_path, run, step, flow_run_id=str(flow_run.id or ""), settle_wait=settle_wait, steps=steps,
        written_by=written_by,
    )  # fmt: skip
