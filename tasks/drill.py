"""Re-exports ckptvault_prefect/tasks/drill.py."""

from ckptvault_prefect.tasks.drill import *  # noqa: F403
