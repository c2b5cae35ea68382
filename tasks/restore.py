"""Re-exports ckptvault_prefect/tasks/restore.py."""

from ckptvault_prefect.tasks.restore import *  # noqa: F403
