"""Re-exports ckptvault_prefect/tasks/watch.py."""

from ckptvault_prefect.tasks.watch import *  # noqa: F403
