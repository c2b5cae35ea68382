"""What the watch needs from the catalog: each run's newest checkpoint, and the monthly spend."""

from __future__ import annotations

from collections.abc import Sequence

from ckptvault.catalog import CheckpointState
from ckptvault.cost import PriceTable


def latest_by_run(states: Sequence[CheckpointState]) -> tuple[dict[str, float | None], dict[str, int]]:
    """Newest created_at and its step per run, over checkpoints that reached the store or were seen."""
    at: dict[str, float | None] = {}
    step: dict[str, int] = {}
    for s in states:
        t = s.created_at
        if t is None:
            at.setdefault(s.run, None)
            continue
        if at.get(s.run) is None or t > (at[s.run] or 0.0):
            at[s.run] = t
            step[s.run] = s.step
    return at, step


def monthly_spend(states: Sequence[CheckpointState], prices: PriceTable) -> float:
    """USD/month of what the catalog says is stored (verified and not expired), by storage class."""
    total = 0.0
    for s in states:
        if s.verified:
            total += prices.monthly_cost(s.bytes, s.storage_class or "STANDARD", max(s.files, 1))
    return total
