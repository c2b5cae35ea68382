"""Re-exports ckptvault_prefect/tasks/step.py."""

from ckptvault_prefect.tasks.step import *  # noqa: F403
