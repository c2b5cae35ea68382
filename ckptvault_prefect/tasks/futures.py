"""Waiting on mapped task runs (Prefect futures, or direct mode's finished calls)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckptvault_prefect.tasks.step import StepFuture, wait_all


def settle(futures: Sequence[StepFuture[Any]]) -> list[str]:
    """Wait for every download, then name every failure: a checker reports all problems, not the
    first, and nothing may be cleaned up while a sibling download is still writing."""
    wait_all(futures)
    errors = []
    for f in futures:
        out = f.result(raise_on_failure=False)
        if isinstance(out, BaseException):
            errors.append(str(out))
    return errors
