"""Re-exports ckptvault_prefect/tasks/retry.py."""

from ckptvault_prefect.tasks.retry import *  # noqa: F403
