"""Retention and tiering decisions: a pure planner over checkpoint states, the policy, prices and `now`.

No I/O here: the `tier` flow reads the catalog, calls `plan`, shows the plan, and applies it.

Safety rules hold before any cost rule: the newest `keep_hot` verified checkpoints of a run stay
where they are, milestones are never expired, nothing unverified is touched, nothing moves up a tier.
Then every move must pay for itself over `policy.horizon_days`: a transition or expiry whose one-time
fees (requests, minimum-duration charges) exceed what it saves becomes a `skip` that says why, in
dollars.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from ckptvault.catalog import CheckpointState
from ckptvault.config import PolicyConfig
from ckptvault.errors import CkptvaultError
from ckptvault.humanize import usd
from ckptvault.pricing import DAYS_PER_MONTH, GB, PriceTable
from ckptvault.tiering.cost import TIERS, CostSummary, Holding, class_map, summarize

DAY = 86400.0
ActionKind = Literal["keep", "transition", "expire", "evict_local", "skip"]

# Tier rank of well-known class names, used when a class is not in the store's tier map (an object
# put there by hand, or a map the user changed since). Unknown classes are never moved.
_KNOWN_RANK = {"STANDARD": 0, "STANDARD_IA": 1, "GLACIER_IR": 1, "GLACIER": 2, "COLD": 2, "DEEP_ARCHIVE": 3}


class PlanError(CkptvaultError, ValueError):
    """The policy cannot be planned for this store; the message names the key and the fix."""


@dataclass(frozen=True, slots=True)
class Action:
    run: str
    step: int
    kind: ActionKind
    to_class: str | None  # transition target; for a skipped transition, the class it would have gone to
    reason: str
    saving_usd: float = 0.0  # over the policy horizon
    fee_usd: float = 0.0  # one-time: requests and minimum-duration charges
    save: int = 1  # which save of the step (a restart re-saves steps)
    # A transition the bucket lifecycle carries out (tag now, moved from the rule's date): server mode,
    # and `both` for an archived object, which S3 will not copy until it is restored.
    by_lifecycle: bool = False


@dataclass(frozen=True, slots=True)
class PendingMove:
    """A transition scheduled in the bucket lifecycle and not yet seen in the listing."""

    run: str
    step: int
    save: int
    from_class: str  # where the objects are (as last observed)
    to_class: str
    takes_effect: float | None  # unix s; None for an event that did not say


@dataclass(frozen=True, slots=True)
class Postponed:
    """An expiry a lock stops: not attempted, planned again by the next run. The planner finds it in the
    catalog (`locked_until`, `legal_hold`); `tier --apply` also from the manifest's HEAD, which sees a
    lock the catalog does not know (a bucket default retention, a lock set by hand)."""

    run: str
    step: int
    save: int
    why: str  # expiry_postponed()'s wording

    def as_dict(self) -> dict[str, Any]:
        """An entry of `expire_postponed` in `plan --json` and `tier --json`."""
        return {"run": self.run, "step": self.step, "save": self.save, "why": self.why}


POSTPONED = "expiry postponed: "  # how a `keep` action that is a postponed expiry begins


@dataclass(frozen=True, slots=True)
class ReplicaWait:
    """A move the plan holds back because a replica should hold the save and does not yet (docs/replicas.md,
    "Tiering waits for the copies"): an expiry (the primary's copy is the only one) or a transition into an
    archival class (a frozen save costs a thaw to copy). One per replica; the action is a `keep`."""

    run: str
    step: int
    save: int
    replica: str  # the [[replicas]] name
    action: Literal["transition", "expire"]  # what waits
    to_class: str | None = None  # a transition's target

    def as_dict(self) -> dict[str, Any]:
        """An entry of `waits_for_replica` in `plan --json` and `tier --json`."""
        return {"run": self.run, "step": self.step, "save": self.save, "replica": self.replica,
                "action": self.action, "to_class": self.to_class}  # fmt: skip

    def line(self) -> str:
        """`plan`'s and `tier`'s line: "waits       r step 3 save 1: transition to GLACIER waits for replica dr"."""
        what = f"transition to {self.to_class}" if self.action == "transition" else "expiry"
        return f"{'waits':11} {self.run} step {self.step} save {self.save}: {what} waits for replica {self.replica}"


def expiry_postponed(locked_until: float | None, legal_hold: bool, now: float, mode: str | None = None) -> str:
    """Why an expiry must wait, "" if nothing stops it: a legal hold, or a retention still ahead of
    `now`. The one wording of the plan (from the catalog, which has no mode) and the apply (from a
    HEAD, which has): "expiry postponed: locked until 2027-01-02 00:00 UTC (COMPLIANCE)"."""
    if legal_hold:
        return POSTPONED + "under a legal hold"
    if locked_until is not None and locked_until > now:
        until = datetime.fromtimestamp(locked_until, UTC).strftime("%Y-%m-%d %H:%M UTC")
        return f"{POSTPONED}locked until {until}" + (f" ({mode})" if mode else "")
    return ""


@dataclass(frozen=True)
class Plan:
    actions: list[Action]  # sorted by (run, step, save); a checkpoint's evict_local comes before its storage action
    summary: CostSummary
    store_kind: str
    now: float
    pending: list[PendingMove] = field(default_factory=list)  # sorted by (run, step, save)
    # due expiries the catalog says are locked or held: a `keep` action each, listed here, not counted
    postponed: list[Postponed] = field(default_factory=list)  # sorted by (run, step, save)
    # expiries and archival transitions held back until a replica holds the save: a `keep` action each
    waits: list[ReplicaWait] = field(default_factory=list)  # sorted by (run, step, save), then replica


def _date(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d") if ts is not None else "a date not recorded"


def _created(s: CheckpointState) -> float:
    if s.created_at is not None:
        return s.created_at
    return s.uploaded_at if s.uploaded_at is not None else s.updated_at


def _live(states: Sequence[CheckpointState]) -> list[CheckpointState]:
    return [s for s in states if s.state != "expired"]


def _by_run(states: Sequence[CheckpointState], *, superseded: bool = True) -> dict[str, list[CheckpointState]]:
    """Live, verified checkpoints per run, newest step first (without superseded saves when asked:
    an abandoned branch's save is never among a run's newest)."""
    out: dict[str, list[CheckpointState]] = {}
    for s in _live(states):
        if s.verified and (superseded or not s.superseded):
            out.setdefault(s.run, []).append(s)
    for ss in out.values():
        ss.sort(key=lambda s: s.step, reverse=True)
    return out


def milestones(states: Sequence[CheckpointState], policy: PolicyConfig) -> set[tuple[str, int]]:
    """Checkpoints kept forever, chosen among verified ones: every K steps; the first of each T-hour
    window of creation time (windows aligned to the epoch, so a choice does not change as new
    checkpoints arrive); the best k by a metric."""
    return _milestones(_by_run(states), policy)


def _milestones(by_run: dict[str, list[CheckpointState]], policy: PolicyConfig) -> set[tuple[str, int]]:
    by_step, best = _milestones_by_rule(by_run, policy)
    return by_step | best


def _milestones_by_rule(
    by_run: dict[str, list[CheckpointState]], policy: PolicyConfig
) -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
    """(milestones of milestone_every_steps / milestone_every_hours, milestones of keep_best): each
    group has its own lock_days."""
    out: set[tuple[str, int]] = set()
    best: set[tuple[str, int]] = set()
    for run, ss in by_run.items():
        if policy.milestone_every_steps:
            out.update((run, s.step) for s in ss if s.step % policy.milestone_every_steps == 0)
        if policy.milestone_every_hours:
            width = policy.milestone_every_hours * 3600
            first: dict[int, CheckpointState] = {}
            for s in ss:
                w = math.floor(_created(s) / width)
                if w not in first or (_created(s), s.step) < (_created(first[w]), first[w].step):
                    first[w] = s
            out.update((run, s.step) for s in first.values())
        if policy.keep_best:
            kb = policy.keep_best
            scored = [(s.metrics[kb.metric], s.step) for s in ss if not math.isnan(s.metrics.get(kb.metric, math.nan))]
            sign = 1.0 if kb.mode == "min" else -1.0
            scored.sort(key=lambda vs: (sign * vs[0], vs[1]))
            best.update((run, step) for _, step in scored[: kb.k])
    return out, best


def milestone_lock_days(states: Sequence[CheckpointState], policy: PolicyConfig) -> dict[tuple[str, int], int]:
    """(run, step) -> the days after its commit a milestone stays locked, for every milestone a rule
    with lock_days chose (the longest where two rules chose it). Empty when no rule asks for one."""
    by_step, best = _milestones_by_rule(_by_run(_live(states)), policy)
    out: dict[tuple[str, int], int] = {}
    for chosen, days in (
        (by_step, policy.milestone_lock_days),
        (best, policy.keep_best.lock_days if policy.keep_best else 0),
    ):
        if days:
            for key in chosen:
                out[key] = max(days, out.get(key, 0))
    return out


class _Planner:
    def __init__(self, policy: PolicyConfig, prices: PriceTable, store_kind: str, now: float) -> None:
        self.policy, self.prices, self.now = policy, prices, now
        self.classes = class_map(store_kind, policy.classes)
        self.hot = self.classes["hot"]
        for t in policy.tiers:
            if t.tier not in self.classes:
                raise PlanError(
                    f"[policy.tiers] uses tier {t.tier!r}, which a {store_kind} store has no storage "
                    f'class for. Name one: [policy.classes] {t.tier} = "CLASS" (a class or placement '
                    f"target the store has), or remove that tier."
                )
        self.tiers = sorted(policy.tiers, key=lambda t: t.after_days)
        self.rank = dict(_KNOWN_RANK)
        # The store's own map wins over the well-known ranks; the lowest tier wins if two share a class.
        for tier in reversed(TIERS):
            if tier in self.classes:
                self.rank[self.classes[tier]] = TIERS.index(tier)
        self.horizon = policy.horizon_days

    def monthly(self, s: CheckpointState, cls: str) -> float:
        return self.prices.monthly_cost(s.billed_bytes, cls, max(s.files, 1))  # compressed: what is stored

    def storage_action(self, s: CheckpointState, milestone: bool) -> Action:
        p, now = self.policy, self.now
        age = (now - _created(s)) / DAY
        cur = s.storage_class or self.hot
        since = s.class_since
        if since is None:  # catalogued before class_since existed: it has been there since upload
            since = s.uploaded_at if s.uploaded_at is not None else _created(s)
        in_class = (now - since) / DAY
        objects = max(s.files, 1)
        tag = " (milestone: kept forever)" if milestone else ""
        expires = not milestone and p.expire_after_days is not None
        if expires and p.expire_after_days is not None and age >= p.expire_after_days:
            # A locked save is never planned as an expiry: the store would refuse it (or, on a versioned
            # bucket, hide it behind delete markers). It stays as it is, moved nowhere, until its date.
            if held := expiry_postponed(s.locked_until, s.legal_hold, now):
                return Action(s.run, s.step, "keep", None, held)
            fee = self.prices.early_deletion_fee(s.billed_bytes, objects, cur, in_class)
            saving = self.monthly(s, cur) * self.horizon / DAYS_PER_MONTH
            if fee > saving:
                return Action(
                    s.run, s.step, "skip", None,
                    f"expire skipped: saves {usd(saving)} over {self.horizon:g} d, costs {usd(fee)} "
                    f"early-deletion fee ({cur} minimum {self.prices.get(cur).min_days:g} d, "
                    f"{in_class:.0f} d so far)",
                    saving, fee,
                )  # fmt: skip
            why = f"age {age:.0f} d >= expire_after_days {p.expire_after_days:g}, not a milestone"
            if fee > 0:
                why += (
                    f"; early-deletion fee {usd(fee)}: {cur} bills {self.prices.get(cur).min_days:g} d "
                    f"minimum, {in_class:.0f} d so far"
                )
            return Action(s.run, s.step, "expire", None, why, saving, fee)
        target = None
        for t in self.tiers:
            if age >= t.after_days:
                target = t
        if target is None:
            return Action(s.run, s.step, "keep", None, f"age {age:.0f} d: no tier applies yet{tag}")
        to = self.classes[target.tier]
        if to == cur:
            return Action(s.run, s.step, "keep", None, f"already in {cur} ({target.tier}){tag}")
        if cur not in self.rank:
            return Action(s.run, s.step, "keep", None, f"current class {cur} has no known tier: not moved{tag}")
        sched = s.scheduled_class
        if sched and (to == sched or self.rank[to] <= self.rank.get(sched, math.inf)):
            return Action(
                s.run, s.step, "keep", None,
                f"in {cur}; the bucket lifecycle moves it to {sched} from {_date(s.scheduled_at)}: "
                f"already scheduled{tag}",
            )  # fmt: skip
        if self.rank[to] <= self.rank[cur]:
            return Action(s.run, s.step, "keep", None, f"in {cur}, at or below tier {target.tier} ({to}){tag}")
        frozen = self.prices.get(cur).frozen
        if frozen and p.apply_mode == "client":
            # S3 refuses to copy an archived object until it is restored; its lifecycle engine can move it
            return Action(
                s.run, s.step, "keep", None,
                f"stays in {cur} (due for {to}): a client-side copy of an archived object needs a restore first; "
                f'set [policy] apply_mode = "both" to let the bucket lifecycle move it{tag}',
            )  # fmt: skip
        a = self.transition(s, cur, to, age, in_class, expires, tag)
        if a.kind == "transition" and (p.apply_mode == "server" or (p.apply_mode == "both" and frozen)):
            return replace(a, by_lifecycle=True, reason=a.reason + "; by the bucket lifecycle")
        return a

    def transition(
        self, s: CheckpointState, cur: str, to: str, age: float, in_class: float, expires: bool, tag: str
    ) -> Action:
        p = self.policy
        objects = max(s.files, 1)
        stay = self.horizon
        if expires and p.expire_after_days is not None:
            stay = min(stay, max(0.0, p.expire_after_days - age))  # it will be gone after that
        saving = (self.monthly(s, cur) - self.monthly(s, to)) * stay / DAYS_PER_MONTH
        requests = objects * self.prices.get(to).transition_per_1000 / 1000
        early = self.prices.early_deletion_fee(s.billed_bytes, objects, cur, in_class)
        # Expiring before the target's own minimum duration bills the rest of it.
        short = self.monthly(s, to) * max(0.0, self.prices.get(to).min_days - stay) / DAYS_PER_MONTH
        fee = requests + early + short
        if saving <= fee:
            parts = [f"{usd(requests)} in requests"]
            if early > 0:
                parts.append(f"{usd(early)} early deletion from {cur}")
            if short > 0:
                parts.append(f"{usd(short)} of {to} minimum duration before expiry")
            return Action(
                s.run, s.step, "skip", to,
                f"transition to {to} skipped: saves {usd(saving)} over {stay:g} d, "
                f"costs {', '.join(parts)}{tag}",
                saving, fee,
            )  # fmt: skip
        why = f"age {age:.0f} d: {cur} -> {to}, saves {usd(saving)} over {stay:g} d"
        why += f" for {usd(fee)} in fees{tag}"
        return Action(s.run, s.step, "transition", to, why, saving, fee)


@contextmanager
def _no_gc_pauses() -> Iterator[None]:
    """Everything the planner allocates survives into the plan, so the cyclic collector's passes over
    it (and over the caller's states) are pure overhead: a third of the time at 100,000 checkpoints.
    Reference counting still frees everything that is not cyclic."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def plan(
    states: Sequence[CheckpointState],
    policy: PolicyConfig,
    prices: PriceTable,
    store_kind: str,
    now: float,
    node_local: frozenset[str] = frozenset(),
    unreplicated: Mapping[tuple[str, int, int], Sequence[str]] | None = None,
) -> Plan:
    """One storage action (keep/transition/expire/skip) per live checkpoint, plus evict_local actions.
    `node_local`: runs whose files live on each node's own disk, which tier (one host) cannot reach: their
    local copies are never evicted, since deleting node 0's share would record an eviction that left the
    other nodes' files in place. `unreplicated`: save -> the replicas that should hold it and do not
    (`replica_selection.unreplicated`); such a save is not expired nor moved into an archival class
    until they do: a `keep` whose reason says which replica it waits for, listed in `Plan.waits`."""
    with _no_gc_pauses():
        return _plan(states, policy, prices, store_kind, now, node_local, unreplicated or {})


def _plan(
    states: Sequence[CheckpointState],
    policy: PolicyConfig,
    prices: PriceTable,
    store_kind: str,
    now: float,
    node_local: frozenset[str],
    unreplicated: Mapping[tuple[str, int, int], Sequence[str]],
) -> Plan:
    pl = _Planner(policy, prices, store_kind, now)
    live = _live(states)
    prices.require(
        {
            pl.hot,
            *(pl.classes[t.tier] for t in pl.tiers),
            *(c for s in live for c in (s.storage_class, s.scheduled_class) if c),
        }
    )
    # A milestone step stays a milestone whichever save holds it; "the newest N" counts current saves only.
    ms = _milestones(_by_run(live), policy)
    newest = _by_run(live, superseded=False)
    hot_keep = {s.key for ss in newest.values() for s in ss[: policy.keep_hot]}
    local_keep = {s.key for ss in newest.values() for s in ss[: policy.keep_local or 0]}
    actions: list[Action] = []
    holdings: list[Holding] = []
    pending: list[PendingMove] = []
    postponed: list[Postponed] = []
    waits: list[ReplicaWait] = []
    hot_why = f"among the newest {policy.keep_hot} verified: stays put"
    evict_why = f"older than the newest {policy.keep_local} verified; a verified copy is in the store"
    evict_usd_per_byte = policy.hot_fs_usd_per_gb_month / GB * pl.horizon / DAYS_PER_MONTH
    for s in sorted(live, key=lambda s: s.key):
        if not s.verified:
            a = Action(s.run, s.step, "keep", None, f"not verified in the store (state {s.state}): nothing moves")
        elif s.key in hot_keep:
            a = Action(s.run, s.step, "keep", None, hot_why)
        else:
            a = pl.storage_action(s, (s.run, s.step) in ms)
            if missing := unreplicated.get(s.key):
                a, held = _wait_for_replicas(a, s, missing, prices)
                waits += held
        if s.save != 1:
            a = replace(a, save=s.save)
        # A superseded save's local directory now holds the save that replaced it (or the abandoned
        # branch's leftovers): it is not this save's copy to evict.
        evictable = s.verified and not s.local_evicted and not s.superseded
        if policy.keep_local and evictable and s.key not in local_keep and s.run not in node_local:
            evict = Action(s.run, s.step, "evict_local", None, evict_why, s.bytes * evict_usd_per_byte, save=s.save)
            actions.append(evict)
        actions.append(a)
        if a.kind == "keep" and a.reason.startswith(POSTPONED):
            postponed.append(Postponed(s.run, s.step, s.save, a.reason))
        before = s.storage_class or pl.hot
        # A scheduled move is still pending unless this plan expires the checkpoint or moves it further.
        waiting = bool(s.scheduled_class) and a.kind not in ("expire", "transition")
        if waiting:
            pending.append(PendingMove(s.run, s.step, s.save, before, s.scheduled_class, s.scheduled_at))
        if s.uploaded_at is not None or s.verified:
            # Now: the class the objects were last seen in. After: with the scheduled move done, dated.
            after = None if a.kind == "expire" else (a.to_class if a.kind == "transition" else before)
            fee = a.fee_usd if a.kind in ("transition", "expire") else 0.0  # a skip is not paid
            since = None
            if waiting:
                after, since = s.scheduled_class, s.scheduled_at
            holdings.append(Holding(s.run, s.bytes, max(s.files, 1), before, after, fee, since, s.stored_bytes))
    summary = summarize(holdings, prices, policy.hot_fs_usd_per_gb_month)
    return Plan(actions=actions, summary=summary, store_kind=store_kind, now=now, pending=pending, postponed=postponed,
                waits=waits)  # fmt: skip


def _wait_for_replicas(
    a: Action, s: CheckpointState, missing: Sequence[str], prices: PriceTable
) -> tuple[Action, list[ReplicaWait]]:
    """`a` held back while `missing` replicas lack the save: an expiry (deletes never travel, so the
    primary's copy is the only one there is) and a move into an archival class (the replicate pass reads
    the primary, and a frozen object must be thawed first) become a `keep` that says why. A move into a
    readable class (STANDARD_IA, Ceph's COLD) and a local eviction go ahead: the copy reads them as it is."""
    if a.kind == "expire":
        what = "expiry"
    elif a.kind == "transition" and a.to_class and prices.get(a.to_class).frozen:
        what = f"transition to {a.to_class}"
    else:
        return a, []
    names = ("replicas " if len(missing) > 1 else "replica ") + ", ".join(missing)
    cost = "the primary's is the only copy" if a.kind == "expire" else "a frozen save costs a thaw to copy"
    why = f"{what} waits for {names}: not copied there yet ({cost})"
    kind: Literal["transition", "expire"] = "expire" if a.kind == "expire" else "transition"
    held = [ReplicaWait(s.run, s.step, s.save, r, kind, a.to_class) for r in missing]
    return Action(s.run, s.step, "keep", None, why, save=s.save), held
