"""Re-exports ckptvault_prefect/tasks/replicate.py."""

from ckptvault_prefect.tasks.replicate import *  # noqa: F403
