"""What each store holds and costs per month, per storage class, and what replicating costs the primary
in egress: the per-store section of `ckptvault plan` and `ckptvault catalog stats` (docs/replicas.md,
"Cost"). Pure: the catalog's folded states, the config and the price tables, no I/O.

A replica's copy is byte for byte the primary's objects, so it is billed for the save's stored bytes
(`billed_bytes`) in the class its `replicated` event recorded. A replica's classes are priced by
ckptvault/data/prices.toml, then `[policy.prices]`, then its own `[[replicas]] prices` (a Ceph replica
behind an AWS primary names its COLD there). The egress is the primary's price per GB out along the
route to the replica (`[[replicas]] copy_egress`): at the current rate (the copies recorded in the last
30 days) per month, and once for what the replica should hold and does not yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ckptvault.catalog.model import CheckpointState
from ckptvault.config import PolicyConfig, ReplicaConfig, StoreConfig
from ckptvault.humanize import size, usd
from ckptvault.pricing import DAYS_PER_MONTH, GB, PriceError, PriceTable, load_prices
from ckptvault.tiering.cost import CostSummary
from ckptvault.tiering.replica_selection import wanted

PRIMARY = "primary"  # how the [store] is named beside its replicas (a replica may not take the name)
MONTH_SECONDS = DAYS_PER_MONTH * 86400


@dataclass(frozen=True)
class ClassCost:
    """One store's saves in one storage class."""

    store: str
    storage_class: str
    saves: int
    bytes: int  # what the class bills: the objects' stored size (compressed where they are)
    usd_per_month: float | None  # None: the class has no price (StoreCosts.unpriced says where to set one)

    def as_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "class": self.storage_class,
            "saves": self.saves,
            "bytes": self.bytes,
            "usd_per_month": self.usd_per_month,
        }


@dataclass(frozen=True)
class Egress:
    """What sending a replica its copies costs the primary in transfer: per month at the rate of the last
    30 days, and once for what it should hold and does not yet."""

    replica: str
    route: str  # in-region, inter-region or internet
    usd_per_gb: float  # the primary's price along the route
    month_saves: int  # copies recorded on the replica in the last 30 days
    month_bytes: int
    to_copy_saves: int  # saves the replica should hold (`takes`) and does not
    to_copy_bytes: int
    to_copy_storage_class: str  # the class they will be written in
    to_copy_adds_usd_per_month: float | None  # storing them there; None: that class has no price

    @property
    def usd_per_month(self) -> float:
        return self.month_bytes / GB * self.usd_per_gb

    @property
    def to_copy_usd(self) -> float:
        return self.to_copy_bytes / GB * self.usd_per_gb

    def as_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "route": self.route,
            "usd_per_gb": self.usd_per_gb,
            "last_30_days": {"saves": self.month_saves, "bytes": self.month_bytes},
            "usd_per_month": self.usd_per_month,
            "to_copy": {
                "saves": self.to_copy_saves,
                "bytes": self.to_copy_bytes,
                "usd_once": self.to_copy_usd,
                "storage_class": self.to_copy_storage_class,
                "adds_usd_per_month": self.to_copy_adds_usd_per_month,
            },
        }

    def lines(self) -> list[str]:
        out = [
            f"egress to {self.replica} ({self.route}, {usd(self.usd_per_gb)}/GB out of the primary):",
            f"  per month at the current rate: {size(self.month_bytes)} in {self.month_saves} saves copied in the "
            f"last 30 days, {usd(self.usd_per_month)}/month",
        ]
        if not self.to_copy_saves:
            return [*out, "  to catch up: nothing left to copy"]
        adds = self.to_copy_adds_usd_per_month
        more = f"{usd(adds)}/month" if adds is not None else "an unpriced amount"
        return [
            *out,
            f"  to catch up: {size(self.to_copy_bytes)} in {self.to_copy_saves} saves still to copy, "
            f"{usd(self.to_copy_usd)} once, then {more} more stored in {self.to_copy_storage_class}",
        ]


@dataclass(frozen=True)
class StoreCosts:
    rows: tuple[ClassCost, ...]  # the primary's classes first, then each replica's, as configured
    egress: tuple[Egress, ...]  # one per configured replica
    unpriced: tuple[str, ...] = ()  # per class without a price: where and how to price it

    @property
    def saves(self) -> int:
        return sum(r.saves for r in self.rows)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.rows)

    @property
    def usd_per_month(self) -> float | None:
        """All stores' storage; None while a class has no price (a partial sum would read as the whole)."""
        if any(r.usd_per_month is None for r in self.rows):
            return None
        return sum(r.usd_per_month or 0.0 for r in self.rows)

    def as_dict(self) -> dict[str, Any]:
        """The keys `plan --json` and `catalog stats --json` add (docs/commands.md)."""
        return {
            "stores": [r.as_dict() for r in self.rows],
            "stores_total": {"saves": self.saves, "bytes": self.bytes, "usd_per_month": self.usd_per_month},
            "egress": [e.as_dict() for e in self.egress],
            "unpriced": list(self.unpriced),
        }

    def lines(self) -> list[str]:
        header = ("STORE", "CLASS", "SAVES", "STORED", "$/MONTH")
        cells = [(r.store, r.storage_class, str(r.saves), size(r.bytes), _usd(r.usd_per_month)) for r in self.rows]
        cells.append(("total", "", str(self.saves), size(self.bytes), _usd(self.usd_per_month)))
        widths = [max(len(c[i]) for c in [header, *cells]) for i in range(len(header))]
        out = ["per store and storage class, now:"]
        out += [
            "  ".join(c[i].rjust(w) if i >= 2 else c[i].ljust(w) for i, w in enumerate(widths)).rstrip()
            for c in [header, *cells]
        ]
        out += [line for e in self.egress for line in e.lines()]
        out += [f"unpriced: {u}" for u in self.unpriced]
        return out


def _usd(x: float | None) -> str:
    return "-" if x is None else usd(x)


def copy_route(primary: StoreConfig, replica: ReplicaConfig) -> str:
    """The route the primary's bytes take to `replica`: its `copy_egress`, or guessed from where the two
    stores are (the same endpoint is one provider: in-region in the same region, else inter-region;
    another endpoint is reached over the internet)."""
    if replica.copy_egress != "auto":
        return replica.copy_egress
    if (replica.endpoint_url or "").rstrip("/") != (primary.endpoint_url or "").rstrip("/"):
        return "internet"
    return "in-region" if replica.region == primary.region else "inter-region"


def replica_prices(policy: PolicyConfig, replica: ReplicaConfig) -> PriceTable:
    """The replica's price table: the packaged one, `[policy.prices]`, then the replica's own `prices`."""
    return load_prices({**policy.prices, **replica.prices})


def primary_rows(states: Iterable[CheckpointState], prices: PriceTable) -> list[ClassCost]:
    """The primary's classes from the catalog: the saves uploaded and not expired (what `catalog stats`
    counts per class), each billed for its stored bytes and files."""
    held: dict[str, list[CheckpointState]] = {}
    for s in states:
        if s.uploaded_at is not None and not s.expired:
            held.setdefault(s.storage_class or "STANDARD", []).append(s)
    return [_priced(PRIMARY, cls, ss, prices) for cls, ss in sorted(held.items())]


def plan_primary_rows(summary: CostSummary) -> list[ClassCost]:
    """The primary's classes as a plan costs them now, so the section's primary rows add up to the plan's
    own "now" total."""
    rows = []
    for cls in sorted(summary.saves_before):
        stored = sum(by.get(cls, (0, 0))[1] for by in summary.bytes_before.values())
        monthly = sum(by.get(cls, 0.0) for by in summary.monthly_before.values())
        rows.append(ClassCost(PRIMARY, cls, summary.saves_before[cls], stored, monthly))
    return rows


def _priced(store: str, cls: str, saves: Sequence[CheckpointState], prices: PriceTable) -> ClassCost:
    billed = sum(s.billed_bytes for s in saves)
    try:
        monthly: float | None = sum(prices.monthly_cost(s.billed_bytes, cls, max(s.files, 1)) for s in saves)
    except PriceError:
        monthly = None
    return ClassCost(store, cls, len(saves), billed, monthly)


def _fix(store: str, cls: str, configured: bool = True) -> str:
    if store == PRIMARY:
        return f"{cls} on the primary: add [policy.prices] {cls} = 0.01 (USD per GB-month)"
    if not configured:  # its own prices went with its entry: the primary's table prices it
        return f"{cls} on {store} (no longer in [[replicas]]): add [policy.prices] {cls} = 0.01 (USD per GB-month)"
    return (
        f"{cls} on {store}: add prices = {{ {cls} = 0.01 }} (USD per GB-month) to the [[replicas]] entry "
        f'named "{store}", or {cls} to [policy.prices]'
    )


def store_costs(
    states: Sequence[CheckpointState],
    primary: StoreConfig,
    policy: PolicyConfig,
    replicas: Sequence[ReplicaConfig],
    prices: PriceTable,
    primary_kind: str,
    now: float,
    primary_classes: Sequence[ClassCost] | None = None,
) -> StoreCosts | None:
    """Every store's bytes and $/month per class and each replica's egress; None when there is no replica
    (none configured, no copy recorded): the commands then print what they printed before replicas.
    `prices`: the primary's table; `primary_kind`: its resolved kind (the egress price); `primary_classes`:
    the primary's rows when the caller has costed them already (a plan), else from `states`."""
    recorded = {c.store for s in states for c in s.replicas}
    if not replicas and not recorded:
        return None
    rows = list(primary_rows(states, prices) if primary_classes is None else primary_classes)
    configured = {r.name: r for r in replicas}
    tables: dict[str, PriceTable] = {r.name: replica_prices(policy, r) for r in replicas}
    held: dict[tuple[str, str], list[CheckpointState]] = {}
    for s in states:
        for c in s.replicas:
            held.setdefault((c.store, c.storage_class), []).append(s)
    # configured replicas in their order, then any the catalog records and the config no longer names
    order = {name: i for i, name in enumerate([*configured, *sorted(recorded - set(configured))])}
    for (store, cls), ss in sorted(held.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        # a replica gone from the config is priced as the primary (its own prices went with it)
        rows.append(_priced(store, cls, ss, tables.get(store, prices)))
    egress = tuple(_egress(states, primary, policy, r, prices, tables[r.name], primary_kind, now) for r in replicas)
    unpriced = [
        _fix(r.store, r.storage_class, r.store == PRIMARY or r.store in configured)
        for r in rows
        if r.usd_per_month is None
    ]
    for e, r in zip(egress, replicas, strict=True):
        if e.to_copy_adds_usd_per_month is None and e.to_copy_saves:
            fix = _fix(r.name, e.to_copy_storage_class)
            if fix not in unpriced:
                unpriced.append(fix)
    return StoreCosts(tuple(rows), egress, tuple(unpriced))


def _egress(
    states: Sequence[CheckpointState],
    primary: StoreConfig,
    policy: PolicyConfig,
    replica: ReplicaConfig,
    prices: PriceTable,
    theirs: PriceTable,
    primary_kind: str,
    now: float,
) -> Egress:
    route = copy_route(primary, replica)
    # the last copy recorded per save and replica: a save copied again (a repair) counts once
    recent = [s for s in states for c in s.replicas if c.store == replica.name and c.verified_at > now - MONTH_SECONDS]
    missing = [s for s in wanted(states, replica, policy) if not any(c.store == replica.name for c in s.replicas)]
    cls = replica.storage_class or "STANDARD"  # what the replicate pass records for an unset class
    try:
        adds: float | None = sum(theirs.monthly_cost(s.billed_bytes, cls, max(s.files, 1)) for s in missing)
    except PriceError:
        adds = None
    return Egress(
        replica=replica.name,
        route=route,
        usd_per_gb=prices.transfer_per_gb(primary_kind, route),
        month_saves=len(recent),
        month_bytes=sum(s.billed_bytes for s in recent),
        to_copy_saves=len(missing),
        to_copy_bytes=sum(s.billed_bytes for s in missing),
        to_copy_storage_class=cls,
        to_copy_adds_usd_per_month=adds,
    )
