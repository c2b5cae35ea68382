"""Storage class prices and billing rules: what storing, moving and restoring bytes costs in each class.

Prices live in `ckptvault/data/prices.toml` (AWS list prices); `[policy.prices]` overrides $/GB-month
per class, which is how Ceph users price their own class names. Billing follows AWS's rules because
they are the strictest we know: minimum storage durations, minimum billable object sizes, per-object
index overhead for the archival classes, and per-request fees. A store without those rules (Ceph)
simply has zeros for them.

Checkpoints are priced from their stored bytes (after compression; the catalog's `stored_bytes`, else
`bytes`) and object count only (that is what the catalog keeps),
so the minimum billable size is applied as `max(bytes, objects * min_size)`: exact when all objects are
on the same side of the minimum, a lower bound otherwise.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from importlib import resources
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ckptvault.errors import CkptvaultError

GB = 2**30  # AWS bills GB-months in binary gigabytes
DAYS_PER_MONTH = 30.0
RESTORE_TIERS = ("Expedited", "Standard", "Bulk")


class PriceError(CkptvaultError, ValueError):
    """A price is missing or malformed; the message names the class and the fix."""


@dataclass(frozen=True)
class RestoreTier:
    usd_per_gb: float
    per_1000: float
    seconds_min: float
    seconds_max: float


@dataclass(frozen=True)
class ClassPrice:
    name: str
    usd_per_gb_month: float
    min_days: float = 0.0
    min_billable_bytes: int = 0
    overhead_bytes: int = 0
    overhead_standard_bytes: int = 0
    put_per_1000: float = 0.0
    transition_per_1000: float = 0.0
    get_per_1000: float = 0.0
    retrieval_per_gb: float = 0.0
    restore: Mapping[str, RestoreTier] = field(default_factory=dict)

    @property
    def frozen(self) -> bool:
        """Objects in this class must be restored before a GET (Glacier Flexible, Deep Archive)."""
        return bool(self.restore)


@dataclass(frozen=True)
class PriceTable:
    classes: Mapping[str, ClassPrice]
    egress_per_gb: Mapping[str, float] = field(default_factory=lambda: {"in-region": 0.0, "internet": 0.09})
    # store kind -> route -> $/GB, for the kinds whose transfer is priced otherwise than `egress_per_gb`
    # (on-premises servers: nothing); any other kind pays `egress_per_gb`
    egress_by_kind: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def egress(self, nbytes: int, where: str) -> float:
        """USD to move `nbytes` out of the store to `where` ("in-region" or "internet")."""
        if where not in self.egress_per_gb:
            raise PriceError(f"egress {where!r} has no price; use one of {', '.join(sorted(self.egress_per_gb))}")
        return nbytes / GB * self.egress_per_gb[where]

    def transfer_per_gb(self, kind: str, route: str) -> float:
        """$/GB out of a store of `kind` ("aws", "ceph", ...) along `route` ("in-region", "inter-region",
        "internet"): what the primary bills for the bytes it sends a replica."""
        table = self.egress_by_kind.get(kind, self.egress_per_gb)
        if route not in table:
            raise PriceError(f"egress {route!r} has no price; use one of {', '.join(sorted(table))}")
        return table[route]

    def get(self, name: str) -> ClassPrice:
        try:
            return self.classes[name]
        except KeyError:
            raise PriceError(
                f"storage class {name!r} has no price. Add it to the config: "
                f"[policy.prices] {name} = 0.01  (USD per GB-month)"
            ) from None

    def require(self, names: Iterable[str]) -> None:
        """Fail early, before planning, for any class without a price."""
        for n in names:
            self.get(n)

    @cached_property
    def _monthly_terms(self) -> dict[str, tuple[float, int, float]]:
        """class -> ($ per byte-month, min billable bytes, $ per object-month of overhead). The planner
        prices every checkpoint several times; this keeps that to a multiply and an add."""
        out = {}
        for name, c in self.classes.items():
            per_object = c.overhead_bytes / GB * c.usd_per_gb_month
            if c.overhead_standard_bytes:
                per_object += c.overhead_standard_bytes / GB * self.get("STANDARD").usd_per_gb_month
            out[name] = (c.usd_per_gb_month / GB, c.min_billable_bytes, per_object)
        return out

    def monthly_cost(self, nbytes: int, name: str, objects: int = 1) -> float:
        """USD per month to store `nbytes` in `objects` objects of class `name`: minimum billable size
        and per-object index overhead included."""
        try:
            per_byte, min_size, per_object = self._monthly_terms[name]
        except KeyError:
            self.get(name)  # raises the error that names the fix
            raise
        return max(nbytes, objects * min_size) * per_byte + objects * per_object

    def monthly_cost_total(self, nbytes: ArrayLike, name: str, objects: ArrayLike) -> float:
        """`monthly_cost` summed over many checkpoints of class `name` (each its own minimum billable
        size), vectorised: the metrics price every save of a fleet on each scrape."""
        try:
            per_byte, min_size, per_object = self._monthly_terms[name]
        except KeyError:
            self.get(name)  # raises the error that names the fix
            raise
        b, o = np.asarray(nbytes, dtype=np.float64), np.asarray(objects, dtype=np.float64)
        return float((np.maximum(b, o * min_size) * per_byte + o * per_object).sum())

    def early_deletion_fee(self, nbytes: int, objects: int, name: str, days_in_class: float) -> float:
        """What leaving class `name` after `days_in_class` costs on top: the rest of its minimum."""
        c = self.get(name)
        remaining = max(0.0, c.min_days - max(days_in_class, 0.0))
        return self.monthly_cost(nbytes, name, objects) * remaining / DAYS_PER_MONTH

    def restore_estimate(
        self, objects_by_class: Mapping[str, tuple[int, int]], tier: str
    ) -> tuple[float, float, float]:
        """(USD, seconds_min, seconds_max) to make objects readable and GET them once.
        `objects_by_class`: class -> (objects, bytes). Times are the thaw only, not the download."""
        if tier not in RESTORE_TIERS:
            raise PriceError(f"restore tier {tier!r} is unknown; use one of {', '.join(RESTORE_TIERS)}")
        usd, smin, smax = 0.0, 0.0, 0.0
        for name, (objects, nbytes) in objects_by_class.items():
            c = self.get(name)
            usd += objects * c.get_per_1000 / 1000
            if not c.frozen:
                usd += nbytes / GB * c.retrieval_per_gb
                continue
            if tier not in c.restore:
                offered = ", ".join(sorted(c.restore))
                raise PriceError(f"{name} has no {tier} restore; choose one of {offered}")
            t = c.restore[tier]
            usd += objects * t.per_1000 / 1000 + nbytes / GB * t.usd_per_gb
            # Restores of different objects run in parallel: the slowest class sets the time.
            smin, smax = max(smin, t.seconds_min), max(smax, t.seconds_max)
        return usd, smin, smax


def _float(d: Mapping[str, Any], key: str, where: str) -> float:
    v = d.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or math.isnan(v):
        raise PriceError(f"prices.toml: {where}.{key} must be a non-negative number, got {v!r}")
    return float(v)


def _parse_class(name: str, d: Mapping[str, Any]) -> ClassPrice:
    where = f"classes.{name}"
    if "usd_per_gb_month" not in d:
        raise PriceError(f"prices.toml: {where}.usd_per_gb_month is missing")
    restore = {
        tier: RestoreTier(
            **{
                k: _float(t, k, f"{where}.restore.{tier}")
                for k in ("usd_per_gb", "per_1000", "seconds_min", "seconds_max")
            }
        )
        for tier, t in d.get("restore", {}).items()
    }
    return ClassPrice(
        name=name,
        usd_per_gb_month=_float(d, "usd_per_gb_month", where),
        min_days=_float(d, "min_days", where),
        min_billable_bytes=int(_float(d, "min_billable_bytes", where)),
        overhead_bytes=int(_float(d, "overhead_bytes", where)),
        overhead_standard_bytes=int(_float(d, "overhead_standard_bytes", where)),
        put_per_1000=_float(d, "put_per_1000", where),
        transition_per_1000=_float(d, "transition_per_1000", where),
        get_per_1000=_float(d, "get_per_1000", where),
        retrieval_per_gb=_float(d, "retrieval_per_gb", where),
        restore=restore,
    )


def load_prices(overrides: Mapping[str, float] | None = None) -> PriceTable:
    """The packaged price table with `[policy.prices]` (class -> $/GB-month) on top. An override of a
    known class changes only its storage price; a new class (a Ceph placement target) gets that price
    and no minimums or request fees, which is how on-prem stores bill."""
    text = resources.files("ckptvault").joinpath("data/prices.toml").read_text(encoding="utf-8")
    raw = tomllib.loads(text)
    classes = {name: _parse_class(name, d) for name, d in raw.get("classes", {}).items()}
    egress = {str(k): _float(raw.get("egress", {}), k, "egress") for k in raw.get("egress", {})}
    by_kind = {
        str(kind): {str(k): _float(t, k, f"egress_by_kind.{kind}") for k in t}
        for kind, t in raw.get("egress_by_kind", {}).items()
    }
    for name, usd in (overrides or {}).items():
        if isinstance(usd, bool) or not isinstance(usd, int | float) or usd < 0 or math.isnan(usd):
            raise PriceError(f"[policy.prices] {name} = {usd!r}: must be a non-negative USD per GB-month")
        classes[name] = (
            replace(classes[name], usd_per_gb_month=float(usd))
            if name in classes
            else (ClassPrice(name=name, usd_per_gb_month=float(usd)))
        )
    return PriceTable(classes=classes, egress_per_gb=egress, egress_by_kind=by_kind)
