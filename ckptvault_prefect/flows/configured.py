"""`ingest` with a task runner that follows the run's config `[scale]` (ckptvault_prefect/runtime/configured.py):
the entrypoint for work-pool deployments that should scale out (`entrypoint:
ckptvault_prefect.flows.configured.ingest`; docs/OPERATIONS.md, "Which entry points honour `[scale]`")."""

from __future__ import annotations

from ckptvault_prefect.flows.ingest import ingest as plain_ingest
from ckptvault_prefect.runtime.configured import ConfiguredTaskRunner

ingest = plain_ingest.with_options(task_runner=ConfiguredTaskRunner())
