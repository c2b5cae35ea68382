"""`ckptvault serve`: all five deployments served from one process, for one machine with no work pool.

Schedules, parameters, descriptions and concurrency limits are read from prefect.yaml next to this
module (shipped in the wheel), so the served deployments and the work-pool deployments (`prefect
deploy --all`) cannot drift apart; only the
flows themselves are bound here. The process needs a Prefect API: PREFECT_API_URL of a running server
(`infra/local/prefect.sh up`), or none, and then it starts a temporary one of its own (10-30 s).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from prefect import Flow, serve
from prefect.schedules import Cron, Interval, Schedule

from ckptvault_prefect.flows.drill import drill
from ckptvault_prefect.flows.ingest import ingest
from ckptvault_prefect.flows.restore import restore
from ckptvault_prefect.flows.tier import tier
from ckptvault_prefect.flows.watch import watch

PREFECT_YAML = Path(__file__).with_name("prefect.yaml")

# prefect.yaml's entrypoints, bound to the flow objects (imported, so a typo fails at import, not at run).
FLOWS: dict[str, Flow[..., Any]] = {
    "ckptvault_prefect.flows.ingest.ingest": ingest,
    "ckptvault_prefect.flows.tier.tier": tier,
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


def build_deployments(config_path: str | None = None) -> list[Any]:
    """One RunnerDeployment per prefect.yaml entry; `config_path`, when given, becomes every deployment's
    default config_path parameter (otherwise flow runs read $CKPTVAULT_CONFIG of this process)."""
    out: list[Any] = []
    for spec in deployment_specs():
        flow = FLOWS[spec["entrypoint"]]
        params = dict(spec.get("parameters") or {})
        if config_path:
            params["config_path"] = config_path
        out.append(
            flow.to_deployment(
                name=spec["name"],
                description=spec.get("description"),
                tags=spec.get("tags"),
                schedules=[_schedule(s) for s in spec.get("schedules") or []],
                parameters=params,
                concurrency_limit=spec.get("concurrency_limit"),
            )
        )
    return out


def serve_all(config_path: str | None = None) -> None:
    """Register the five deployments and run their flow runs in this process until interrupted.

    Ctrl-C (SIGINT) or SIGTERM ends it; Prefect then pauses the schedules (pause_on_shutdown), so no
    scheduled runs pile up as Late while nothing serves them. The next `ckptvault serve` re-registers the
    deployments and resumes the schedules.
    """
    serve(*build_deployments(config_path))
