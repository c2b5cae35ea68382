"""Re-exports ckptvault_prefect/tasks/futures.py."""

from ckptvault_prefect.tasks.futures import *  # noqa: F403
