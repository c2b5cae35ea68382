"""Re-exports ckptvault_prefect/tasks/notify.py."""

from ckptvault_prefect.tasks.notify import *  # noqa: F403
