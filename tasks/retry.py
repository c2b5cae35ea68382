"""The one retry policy of every I/O task: back off and retry transient store errors only.

A checksum mismatch, a missing bucket or a precondition failure is an answer, not a glitch:
retrying it wastes time and hides the problem, so those fail at once.
"""

from __future__ import annotations

from typing import Any

from prefect.tasks import exponential_backoff

from ckptvault.store import TransientStoreError

RETRIES = 3
RETRY_DELAYS = exponential_backoff(backoff_factor=2)
RETRY_JITTER = 0.5


def only_transient(task: Any, task_run: Any, state: Any) -> bool:
    try:
        state.result()
    except TransientStoreError:
        return True
    except Exception:
        return False
    return False
