"""`ckptvault serve`: all five deployments served from one process, for one machine with no work pool.
Schedules and parameters only; the same ones as prefect.yaml."""

from __future__ import annotations

from typing import Any

from prefect import serve

from flows.drill import drill
from flows.ingest import ingest
from flows.restore import restore
from flows.tier import tier
from flows.watch import watch


def serve_all(config_path: str | None = None) -> None:
    params = {"config_path": config_path} if config_path else {}
    deployments: list[Any] = [
        ingest.to_deployment(name="ingest", interval=600, parameters=params, concurrency_limit=1),
        tier.to_deployment(name="tier", cron="30 3 * * *", parameters={**params, "apply": True}, concurrency_limit=1),
        drill.to_deployment(name="drill", cron="0 5 * * 0", parameters=params, concurrency_limit=1),
        watch.to_deployment(name="watch", interval=3600, parameters=params, concurrency_limit=1),
        restore.to_deployment(
            name="restore",
            parameters={**params, "step": "latest", "tier": "Standard", "wait_hours": 0.25, "reschedule": True},
        ),
    ]
    serve(*deployments)
