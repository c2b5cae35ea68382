"""Which copy of a save a restore reads (docs/replicas.md, "Restore from a copy"): the primary
(`[store]`) or a `[[replicas]]` store holding it (docs/FORMAT.md, "Replicas", "Reading").

`survey` looks at each copy once (its manifest, one LIST, a HEAD of archived objects), `rank` orders
what it saw: usable first (reachable and complete: its manifest is there), then no thaw before a thaw,
then the cheaper storage class to read back, then fewer objects missing, then the configuration's
order (the primary first). `rank` and `choose` are pure, so every ordering is unit-tested
(tests/unit/test_restore_copies.py) without a store. The entry layer opens the stores (a `Copy` with
`store` None is one it could not reach) and hands them in.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from ckptvault.catalog import Catalog
from ckptvault.checkpoint.manifest import Manifest
from ckptvault.config import Config
from ckptvault.errors import CkptvaultError
from ckptvault.restore import from_manifests
from ckptvault.restore.from_manifests import RunHistory
from ckptvault.restore.plan import ObjectPlan, plan_present
from ckptvault.restore.resolve import RestoreError
from ckptvault.store import ObjectStore, manifest_load

PRIMARY = "primary"

# What reading an object of the class back costs, cheapest first: retrieval fees grow down the list,
# and the last two need a thaw (ckptvault/restore/plan.py ARCHIVAL). A class the table does not know
# (Ceph's own, e.g. COLD) is read like STANDARD_IA: readable at once, maybe billed.
CLASS_COST = {
    "STANDARD": 0,
    "REDUCED_REDUNDANCY": 0,
    "INTELLIGENT_TIERING": 1,
    "STANDARD_IA": 2,
    "ONEZONE_IA": 2,
    "GLACIER_IR": 3,
    "GLACIER": 5,
    "DEEP_ARCHIVE": 6,
}
_UNKNOWN_CLASS_COST = 2


def class_cost(storage_class: str) -> int:
    return CLASS_COST.get(storage_class, _UNKNOWN_CLASS_COST)


@dataclass(frozen=True)
class Copy:
    """One store a save may be read from, as the entry layer opened it."""

    name: str  # "primary", or the replica's name
    store: ObjectStore | None  # None: not reachable (`problem` says why)
    prefix: str
    problem: str = ""


@dataclass(frozen=True)
class CopyStatus:
    """What `survey` saw of one copy of one save."""

    name: str
    reachable: bool
    complete: bool  # its manifest is there and readable
    order: int = 0  # its place in the configuration: the primary 0, the replicas 1, 2, ...
    problem: str = ""  # why it is not reachable or not complete
    plans: tuple[ObjectPlan, ...] = ()
    missing: dict[str, str] = field(default_factory=dict)  # path -> "missing" or what is wrong with it
    store: ObjectStore | None = field(default=None, compare=False, repr=False)
    prefix: str = ""
    manifest: Manifest | None = field(default=None, compare=False, repr=False)

    @property
    def usable(self) -> bool:
        return self.reachable and self.complete

    @property
    def frozen(self) -> int:
        """Objects that need a thaw (RestoreObject) before they can be read."""
        return sum(1 for p in self.plans if not p.thawed)

    @property
    def worst_class(self) -> int:
        """The cost of the dearest class among its objects (0 when it has none)."""
        return max((class_cost(p.storage_class) for p in self.plans), default=0)

    def by_class(self) -> dict[str, int]:
        """Bytes per storage class."""
        out: dict[str, int] = {}
        for p in self.plans:
            out[p.storage_class] = out.get(p.storage_class, 0) + p.stored_bytes
        return out

    def describe(self) -> str:
        """One line for the estimate: what this copy holds and what reading it back needs."""
        if not self.reachable:
            return f"{self.name}: unreachable ({self.problem})"
        if not self.complete:
            return f"{self.name}: does not hold this save ({self.problem})"
        classes = ", ".join(f"{c} {b / 2**30:.2f} GiB" for c, b in sorted(self.by_class().items())) or "no objects"
        thaw = f"{self.frozen} objects to thaw" if self.frozen else "no thaw"
        gone = f", {len(self.missing)} objects missing or wrong" if self.missing else ""
        return f"{self.name}: {classes}; {thaw}{gone}"

    def as_dict(self) -> dict[str, object]:
        return {
            "store": self.name, "reachable": self.reachable, "complete": self.complete, "problem": self.problem,
            "frozen_objects": self.frozen, "missing": sorted(self.missing), "by_class": self.by_class(),
        }  # fmt: skip


def _rank_key(s: CopyStatus) -> tuple[bool, bool, int, int, int]:
    return (not s.usable, s.frozen > 0, s.worst_class, len(s.missing), s.order)


def rank(statuses: Sequence[CopyStatus]) -> list[CopyStatus]:
    """Every copy, best to read from first: usable (reachable, its manifest there) before not; no thaw
    before a thaw; the cheaper dearest class (STANDARD before STANDARD_IA before GLACIER ...); fewer
    objects missing; then the configuration's order, so the primary wins a tie."""
    return sorted(statuses, key=_rank_key)


class UnknownCopyError(RestoreError):
    """`--from` names no configured store."""


def choose(statuses: Sequence[CopyStatus], forced: str | None = None) -> list[CopyStatus]:
    """The copies a restore reads, in order: the first is read in full, the others (usable ones only)
    serve what it fails to give. `forced` (`--from`): that copy first, whatever its rank; it must be
    usable. RestoreError when no copy is usable; UnknownCopyError when `forced` names none."""
    ranked = rank(statuses)
    if forced is not None:
        named = [s for s in ranked if s.name == forced]
        if not named:
            known = ", ".join(s.name for s in sorted(statuses, key=lambda s: s.order))
            raise UnknownCopyError(f"--from {forced}: no such store (known: {known})")
        if not named[0].usable:
            raise RestoreError(f"--from {forced}: {named[0].describe()}; choose another with --from, or leave it out")
        return [named[0], *(s for s in ranked if s.usable and s.name != forced)]
    usable = [s for s in ranked if s.usable]
    if not usable:
        raise RestoreError(
            "no copy of this save can be read: "
            + "; ".join(s.describe() for s in sorted(statuses, key=lambda s: s.order))
        )
    return usable


def open_copies(cfg: Config) -> list[Copy]:
    """Every store a save may be read from, the primary first then `[[replicas]]` in order, each opened
    and its bucket checked once (one HEAD, botocore's quick client): a store that fails is a Copy without
    a store, saying why, so a restore goes on from another. Within one command a store already checked
    is not checked again (ckptvault/command/memo.py)."""
    from ckptvault.command import memo
    from ckptvault.store import StoreError

    out = []
    named = [(PRIMARY, cfg.store), *((r.name, r) for r in cfg.replicas)]
    for name, store_cfg in named:
        try:
            store = memo.checked_store(store_cfg)
        except StoreError as e:
            out.append(Copy(name, None, store_cfg.prefix, str(e)))
            continue
        out.append(Copy(name, store, store_cfg.prefix))
    return out


def survey(copies: Sequence[Copy], run: str, step: int, save: int) -> list[CopyStatus]:
    """Each copy's manifest and objects for this save (nothing is downloaded). A store error is recorded
    as the copy being unreachable, an absent or unreadable manifest as it not holding the save. With one
    copy only, a transient store error (one that outlived the store's retries) is raised, failing the
    step as it did before there were copies: there is no other copy to turn to."""
    from ckptvault.store import TransientStoreError

    out = []
    for order, c in enumerate(copies):
        if c.store is None:
            out.append(CopyStatus(c.name, False, False, order, c.problem, prefix=c.prefix))
            continue
        try:
            manifest = manifest_load.load_manifest(c.store, c.prefix, run, step, save)
        except CkptvaultError as e:
            if isinstance(e, TransientStoreError) and len(copies) == 1:
                raise
            reachable = not _is_store_failure(e)
            out.append(CopyStatus(c.name, reachable, False, order, str(e), store=c.store, prefix=c.prefix))
            continue
        try:
            plans, missing = plan_present(c.store, c.prefix, manifest)
        except CkptvaultError as e:
            if isinstance(e, TransientStoreError) and len(copies) == 1:
                raise
            out.append(CopyStatus(c.name, False, True, order, str(e), store=c.store, prefix=c.prefix))
            continue
        out.append(
            CopyStatus(c.name, True, True, order, "", tuple(plans), missing, c.store, c.prefix, manifest)
        )  # fmt: skip
    return out


def survey_once(copies: Sequence[Copy], run: str, step: int, save: int) -> list[CopyStatus]:
    """`survey`, once per command (ckptvault/command/memo.py, `remembered`): `ckptvault restore` surveys the copies
    to choose one and print the estimate (exit 2 when none is usable), then its flow, in the same process
    ~0.2 s later, surveys the same save of the same copies again. Keyed on each copy's name, store object,
    prefix and problem, in order, and the run, step and save, within memo.READ_MAX_AGE_S: the flow gets the
    command line's snapshot, from which it already chose. A survey that raised is not remembered.
    Outside a command (a deployment's flow run) every call surveys."""
    from ckptvault.command import memo

    key = ("survey", tuple((c.name, memo.Same(c.store), c.prefix, c.problem) for c in copies), run, step, save)
    return list(memo.remembered(key, lambda: survey(copies, run, step, save)))  # a list of the caller's own


class EarlySurvey:
    """`survey` of the save a restore most likely resolves to, on a thread started before the catalog
    is read, so the copies' manifests and listings are fetched beside the catalog's objects instead of
    after them (docs/performance.md, "Where a command's time goes"). Only `--step N` can be guessed:
    its save is `--save K`, else the step's first (a step saved twice is rare); `latest` is named by
    the catalog alone. The guess decides nothing: `statuses` hands the survey over only when the
    catalog resolved to the very save surveyed and the survey ended without raising; otherwise the
    caller surveys as it would have without it. What it surveyed is remembered for the command
    (`survey_once`): the flow the command runs next in this process does not survey that save again."""

    def __init__(self, copies: Sequence[Copy], run: str, step: str, save: int | None) -> None:
        self.key = (int(step), 1 if save is None else save) if step.isdigit() else None
        self._got: list[CopyStatus] | None = None
        self._thread: threading.Thread | None = None
        if self.key is not None:
            key = self.key
            # a daemon: a restore that stops at bad input (exit 2) does not wait for it
            self._thread = threading.Thread(target=self._run, args=(copies, run, *key), daemon=True,
                                            name="ckptvault-survey")  # fmt: skip
            self._thread.start()

    def _run(self, copies: Sequence[Copy], run: str, step: int, save: int) -> None:
        try:
            self._got = survey_once(copies, run, step, save)
        except Exception:  # the caller's own survey raises it again, where it always did
            self._got = None

    def statuses(self, step: int, save: int) -> list[CopyStatus] | None:
        """The survey of (step, save) if that is what ran and it ended; None: survey it now."""
        if self._thread is None or self.key != (step, save):
            return None
        self._thread.join()
        return self._got


def _is_store_failure(e: CkptvaultError) -> bool:
    """A store that answered "no such object" (or "archived: thaw it first", a manifest written in a
    replica's frozen class) is reachable and does not hold the save readably; any other store error
    (connection refused, 5xx after the retries, refused credentials) is the store failing."""
    from ckptvault.store import NotFoundError, ObjectFrozenError, StoreError

    return isinstance(e, StoreError) and not isinstance(e, NotFoundError | ObjectFrozenError)


def history_from_replicas(copies: Sequence[Copy], run: str) -> RunHistory:
    """The run's saves from the manifests of the first reachable replica that holds any (the primary,
    and with it the catalog, cannot be reached: docs/FORMAT.md, "Replicas", "Reading")."""
    for c in copies:
        if c.name == PRIMARY or c.store is None:
            continue
        history = from_manifests.read_replica(Catalog(c.store, c.prefix), run)
        if history.events:
            return history
    return from_manifests.RunHistory((), {})


def report(ordered: Sequence[CopyStatus], statuses: Sequence[CopyStatus], forced: str | None = None) -> list[str]:
    """The estimate's lines about copies: which is read and why, then every other one."""
    first = ordered[0]
    why = "--from" if forced else "reachable, complete and the cheapest to read back"
    lines = [f"  copy: {first.describe()}  <- read from ({why})"]
    lines += [f"  copy: {s.describe()}" for s in sorted(statuses, key=lambda s: s.order) if s.name != first.name]
    return lines
