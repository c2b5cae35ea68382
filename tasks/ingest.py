"""Re-exports ckptvault_prefect/tasks/ingest.py."""

from ckptvault_prefect.tasks.ingest import *  # noqa: F403
