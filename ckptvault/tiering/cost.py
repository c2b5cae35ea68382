"""The cost of a tiering plan: which storage class each tier maps to, and what each run's checkpoints
cost per month before and after a plan, priced by the class price table (ckptvault/pricing.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ckptvault.pricing import GB, PriceError, PriceTable

TIERS = ("hot", "warm", "cold", "archive")

# Tier -> storage class name, per store kind. A tier missing here must be set in `[policy.classes]`.
DEFAULT_CLASSES: dict[str, dict[str, str]] = {
    "aws": {"hot": "STANDARD", "warm": "STANDARD_IA", "cold": "GLACIER", "archive": "DEEP_ARCHIVE"},
    # Ceph has no Glacier: its classes are placement targets the operator names; COLD is the usual one.
    "ceph": {"hot": "STANDARD", "cold": "COLD"},
    # MinIO keeps only STANDARD/REDUCED_REDUNDANCY labels; tiering goes through remote tiers it names.
    "minio": {"hot": "STANDARD"},
}
# SeaweedFS keeps AWS storage-class labels; moto emulates AWS.
DEFAULT_CLASSES["seaweedfs"] = DEFAULT_CLASSES["aws"]
DEFAULT_CLASSES["moto"] = DEFAULT_CLASSES["aws"]


def class_map(store_kind: str, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """Tier -> class name for a store kind, with the user's `[policy.classes]` on top."""
    if store_kind not in DEFAULT_CLASSES:
        known = ", ".join(sorted(DEFAULT_CLASSES))
        raise PriceError(
            f"store kind {store_kind!r} has no storage-class defaults (known: {known}); "
            "resolve `auto` to the detected kind before planning"
        )
    out = dict(DEFAULT_CLASSES[store_kind])
    for tier, name in (overrides or {}).items():
        if tier not in TIERS:
            raise PriceError(f"[policy.classes] {tier} = {name!r}: unknown tier; use one of {', '.join(TIERS)}")
        out[tier] = name
    return out


# --- the cost of a plan -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Holding:
    """One checkpoint's place in the store before and after a plan (None: not in the store)."""

    run: str
    nbytes: int
    objects: int
    before: str | None
    after: str | None
    fee_usd: float = 0.0
    # When `after` takes effect, for a move the bucket lifecycle has scheduled but not yet made (None:
    # with the plan). Until then the checkpoint is billed in `before`.
    takes_effect: float | None = None
    stored_bytes: int = 0  # what the store bills (compressed); 0: nbytes. The hot tier holds nbytes.

    @property
    def billed(self) -> int:
        return self.stored_bytes or self.nbytes


@dataclass(frozen=True)
class CostSummary:
    """Monthly cost now (each checkpoint in the class its objects were last seen in: a move the bucket
    lifecycle has scheduled is billed in the old class until it happens) and after the plan (scheduled
    moves counted as done, `pending_monthly_saving` of it from their dates on)."""

    monthly_before: dict[str, dict[str, float]]  # run -> class -> USD/month
    monthly_after: dict[str, dict[str, float]]
    one_time_fees_usd: float  # requests and early-deletion charges of the plan's actions
    hot_fs_monthly_usd: float  # keeping every checkpoint of `before` on the parallel file system
    pending_monthly_saving: float = 0.0  # of monthly_saving: moves scheduled in the bucket lifecycle
    # run -> class -> (original bytes, stored bytes) of the checkpoints in it now
    bytes_before: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    # USD/month compression saves now: the same checkpoints in the same classes at their original size
    compression_monthly_saving: float = 0.0
    saves_before: dict[str, int] = field(default_factory=dict)  # class -> checkpoint saves in it now

    @property
    def total_before(self) -> float:
        return sum(sum(c.values()) for c in self.monthly_before.values())

    @property
    def total_after(self) -> float:
        return sum(sum(c.values()) for c in self.monthly_after.values())

    @property
    def monthly_saving(self) -> float:
        return self.total_before - self.total_after

    @property
    def saving_vs_hot_fs(self) -> float:
        """USD/month saved by the store (after the plan) against keeping everything on the hot tier."""
        return self.hot_fs_monthly_usd - self.total_after


def summarize(holdings: Iterable[Holding], prices: PriceTable, hot_fs_usd_per_gb_month: float) -> CostSummary:
    before: dict[str, dict[str, float]] = {}
    after: dict[str, dict[str, float]] = {}
    sizes: dict[str, dict[str, tuple[int, int]]] = {}
    saves: dict[str, int] = {}
    fees = hot = pending = compressed = 0.0
    for h in holdings:
        fees += h.fee_usd
        was = now = 0.0
        if h.before is not None:
            by_class = before.setdefault(h.run, {})
            was = prices.monthly_cost(h.billed, h.before, h.objects)
            by_class[h.before] = by_class.get(h.before, 0.0) + was
            hot += h.nbytes / GB * hot_fs_usd_per_gb_month
            if h.billed != h.nbytes:
                compressed += prices.monthly_cost(h.nbytes, h.before, h.objects) - was
            orig, stored = sizes.setdefault(h.run, {}).get(h.before, (0, 0))
            sizes[h.run][h.before] = (orig + h.nbytes, stored + h.billed)
            saves[h.before] = saves.get(h.before, 0) + 1
        if h.after is not None:
            by_class = after.setdefault(h.run, {})
            now = prices.monthly_cost(h.billed, h.after, h.objects)
            by_class[h.after] = by_class.get(h.after, 0.0) + now
        if h.takes_effect is not None:
            pending += was - now
    return CostSummary(before, after, fees, hot, pending, sizes, compressed, saves)
