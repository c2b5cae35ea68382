"""Re-exports ckptvault_prefect/tasks/tier.py."""

from ckptvault_prefect.tasks.tier import *  # noqa: F403
