"""Re-exports ckptvault_prefect/tasks/scrub.py."""

from ckptvault_prefect.tasks.scrub import *  # noqa: F403
