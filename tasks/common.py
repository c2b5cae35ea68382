"""Re-exports ckptvault_prefect/tasks/common.py."""

from ckptvault_prefect.tasks.common import *  # noqa: F403
