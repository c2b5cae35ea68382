"""`ckptvault serve`: all seven deployments served from one process, for one machine with no work pool.

Schedules, parameters, descriptions, concurrency limits and event triggers are read from prefect.yaml next to this
module (shipped in the wheel), so the served deployments and the work-pool deployments (`prefect
deploy --all`) cannot drift apart; only the
flows themselves are bound here. The process needs a Prefect API: PREFECT_API_URL of a running server
(`infra/local/prefect.sh up`), or none, and then it starts a temporary one of its own (10-30 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from prefect import Flow
from prefect.events import DeploymentTriggerTypes
from prefect.exceptions import TerminationSignal
from prefect.runner import Runner
from prefect.schedules import Cron, Interval, Schedule
from prefect.settings import get_current_settings
from prefect.settings.profiles import load_current_profile
from prefect.task_runners import TaskRunner
from pydantic import TypeAdapter

from ckptvault_prefect.flows.drill import drill
from ckptvault_prefect.flows.ingest import ingest
from ckptvault_prefect.flows.replicate import replicate
from ckptvault_prefect.flows.restore import restore
from ckptvault_prefect.flows.scrub import scrub
from ckptvault_prefect.flows.tier import tier
from ckptvault_prefect.flows.watch import watch
from ckptvault_prefect.runtime import warm_start

PREFECT_YAML = Path(__file__).with_name("prefect.yaml")
_TRIGGERS: TypeAdapter[DeploymentTriggerTypes] = TypeAdapter(DeploymentTriggerTypes)

# prefect.yaml's entrypoints, bound to the flow objects (imported, so a typo fails at import, not at run).
FLOWS: dict[str, Flow[..., Any]] = {
    "ckptvault_prefect.flows.ingest.ingest": ingest,
    "ckptvault_prefect.flows.tier.tier": tier,
    "ckptvault_prefect.flows.replicate.replicate": replicate,
    "ckptvault_prefect.flows.scrub.scrub": scrub,
    "ckptvault_prefect.flows.drill.drill": drill,
    "ckptvault_prefect.flows.watch.watch": watch,
    "ckptvault_prefect.flows.restore.restore": restore,
}


def deployment_specs(path: Path = PREFECT_YAML) -> list[dict[str, Any]]:
    """The `deployments:` entries of prefect.yaml, as written there."""
    doc = yaml.safe_load(path.read_text())
    specs: list[dict[str, Any]] = doc["deployments"]
    return specs


def _schedule(spec: dict[str, Any]) -> Schedule:
    if "interval" in spec:
        return Interval(timedelta(seconds=float(spec["interval"])), timezone=spec.get("timezone"))
    if "cron" in spec:
        return Cron(str(spec["cron"]), timezone=spec.get("timezone"))
    raise ValueError(f"{PREFECT_YAML}: only interval and cron schedules are supported here, not {spec}")


def _options(spec: dict[str, Any], config_path: str | None) -> dict[str, Any]:
    """What a prefect.yaml entry says about its deployment, as to_deployment/add_flow keywords."""
    params = dict(spec.get("parameters") or {})
    if config_path:
        params["config_path"] = config_path
    return {
        "name": spec["name"],
        "description": spec.get("description"),
        "tags": spec.get("tags"),
        "schedules": [_schedule(s) for s in spec.get("schedules") or []],
        "parameters": params,
        "concurrency_limit": spec.get("concurrency_limit"),
        # the event triggers, validated as `prefect deploy` does (its _initialize_deployment_triggers)
        "triggers": [_TRIGGERS.validate_python(dict(t)) for t in spec.get("triggers") or []],
    }


def served_flows(
    config_path: str | None = None, ingest_runner: TaskRunner[Any] | None = None
) -> list[tuple[Flow[..., Any], dict[str, Any]]]:
    """Each prefect.yaml entry's flow and its deployment keywords; `ingest_runner`, when given, is the
    ingest flow's task runner (ckptvault_prefect.runtime.runners.task_runner_for of the config's [scale])."""
    out: list[tuple[Flow[..., Any], dict[str, Any]]] = []
    for spec in deployment_specs():
        flow = FLOWS[spec["entrypoint"]]
        if flow is ingest and ingest_runner is not None:
            flow = ingest.with_options(task_runner=ingest_runner)
        out.append((flow, _options(spec, config_path)))
    return out


# How often the serving process asks the API for flow runs to start. Prefect's default (10 s,
# PREFECT_RUNNER_POLL_FREQUENCY) alone would put up to 10 s between a hook's event and its ingest's
# start, the whole of issue [T]'s margin (upload + 10 s); a poll is one small API query. An interval the
# operator chose (the environment, the active profile, or any other of Prefect's sources saying
# something other than 10) wins.
SERVE_POLL_SECONDS = 1.0
POLL_ENV = "PREFECT_RUNNER_POLL_FREQUENCY"
PREFECT_DEFAULT_POLL_SECONDS = 10.0


def poll_seconds(
    environ: Mapping[str, str] | None = None, configured: float | None = None, in_profile: bool | None = None
) -> float | None:
    """The runner's poll interval for `ckptvault serve`: None (Prefect's own setting) when the operator
    chose one, else SERVE_POLL_SECONDS. `configured` (Prefect's current value) and `in_profile` (the
    active profile names it) are read from Prefect when not given."""
    env = os.environ if environ is None else environ
    if configured is None:
        configured = float(get_current_settings().runner.poll_frequency)
    if in_profile is None:
        in_profile = any(getattr(k, "name", k) == POLL_ENV for k in load_current_profile().settings)
    chosen = bool(env.get(POLL_ENV, "").strip()) or in_profile or configured != PREFECT_DEFAULT_POLL_SECONDS
    return None if chosen else SERVE_POLL_SECONDS


def build_deployments(config_path: str | None = None) -> list[Any]:
    """One RunnerDeployment per prefect.yaml entry; `config_path`, when given, becomes every deployment's
    default config_path parameter (otherwise flow runs read $CKPTVAULT_CONFIG of this process)."""
    return [flow.to_deployment(**options) for flow, options in served_flows(config_path)]


def serve_all(config_path: str | None = None, ingest_runner: TaskRunner[Any] | None = None) -> None:
    """Register the seven deployments and run their flow runs from this process until interrupted.

    Ctrl-C (SIGINT) or SIGTERM ends it; Prefect then pauses the schedules (pause_on_shutdown), so no
    scheduled runs pile up as Late while nothing serves them. The next `ckptvault serve` re-registers the
    deployments and resumes the schedules.

    Every flow is added as the object (Runner.add_flow), not as an entrypoint: its runs are that object
    run in a child process (Prefect's DirectSubprocessStarter), not `python -m prefect.engine`
    importing it again. So `ingest_runner` (a Dask task runner, from [scale]) is the one ingest's runs
    get, and the children are forked from a warm process that has already imported Prefect's engine and
    the flows (ckptvault_prefect/runtime/warm_start.py): a hook-triggered ingest starts in a fraction
    of a second instead of ~2 s of imports.
    """
    warm = warm_start.install()
    print(
        "flow runs start from a warm process (Prefect and the flows imported once)" if warm
        else "flow runs start cold (a new interpreter each)"
    )  # fmt: skip
    runner = Runner(pause_on_shutdown=True, query_seconds=poll_seconds())
    for flow, options in served_flows(config_path, ingest_runner):
        runner.add_flow(flow, **options)
    # as prefect.serve: the runner has paused the schedules on its way out
    with contextlib.suppress(KeyboardInterrupt, TerminationSignal):
        asyncio.run(runner.start())
