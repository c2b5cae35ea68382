"""The catalog's records: an `Event` as appended, a `CheckpointState` as folded from them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ckptvault.errors import CkptvaultError, InvalidArgumentError

EVENT_KINDS = (
    "discovered", "invalid", "uploaded", "verified", "evicted_local", "transitioned",
    "restore_requested", "restored", "drilled", "expired", "accepted", "warned",
    "superseded", "transition_scheduled", "evict_skipped", "held", "released", "locked", "replicated",
    "scrubbed", "repaired",
)  # fmt: skip
# A checkpoint's lifecycle state (`CheckpointState.state`), derived from its events; see `_lifecycle`.
LIFECYCLE_STATES = ("pending", "invalid", "accepted", "verified", "suspect", "superseded", "expired")
# Events about a copy elsewhere, not the save's own life: the fold keeps them in their own field and they
# never become `last_event` (docs/FORMAT.md, "The copies in the state").
SIDE_EVENTS = ("replicated", "scrubbed", "repaired")


class CatalogError(CkptvaultError):
    """A catalog file cannot be read or an event is malformed; the message names the key."""


@dataclass(frozen=True)
class Event:
    run: str
    step: int
    event: str
    at: float  # unix seconds
    format: str = ""
    bytes: int = 0
    files: int = 0
    storage_class: str = ""
    created_at: float | None = None  # when the checkpoint was written (newest file mtime)
    ok: bool | None = None  # drilled: passed or failed
    detail: str = ""  # JSON text: reasons, metrics, who/why for accepted, timings
    flow_run: str = ""  # Prefect flow run id; the library never imports prefect, callers pass it
    save: int = 1  # which save of the step (1 in files written before saves existed)
    stored_bytes: int = 0  # what the objects occupy in the store; 0: the same as `bytes` (uncompressed)

    def __post_init__(self) -> None:
        if self.event not in EVENT_KINDS:
            raise InvalidArgumentError(f"unknown event kind {self.event!r}; one of {', '.join(EVENT_KINDS)}")
        if not self.run:
            raise InvalidArgumentError("event run must not be empty")
        if self.step < 0:
            raise InvalidArgumentError(f"event step must be >= 0, got {self.step}")
        if self.save < 1:
            raise InvalidArgumentError(f"event save must be >= 1, got {self.save}")


@dataclass(frozen=True)
class ReplicaCopy:
    """A save's copy on a replica, as its last `replicated` event recorded it."""

    store: str  # the replica's name ([[replicas]] name)
    storage_class: str
    verified_at: float  # unix s: when the replica's manifest was written
    retain_until: float | None = None  # unix s: the replica's Object Lock date, when [lock] was on


@dataclass(frozen=True)
class CheckpointState:
    """The fold of one checkpoint's (run, step, save) events in time order."""

    run: str
    step: int
    format: str
    last_event: str  # the latest event kind; `state` is the lifecycle state derived from all of them
    bytes: int
    files: int
    storage_class: str
    created_at: float | None
    uploaded_at: float | None
    verified: bool  # ever verified, and not expired since
    local_evicted: bool
    last_drill_at: float | None
    last_drill_ok: bool | None
    metrics: dict[str, float]  # "metrics" in the detail of the uploaded/verified event
    updated_at: float
    detail: str  # detail of the latest event
    # When the checkpoint entered its current storage class: minimum-duration charges count from here.
    class_since: float | None = None
    save: int = 1
    superseded: bool = False  # a later save of this step, or a restart before it, replaced this save
    superseded_reason: str = ""
    # Server apply mode: a lifecycle rule will move the objects; the class changes when observed.
    scheduled_class: str = ""
    scheduled_at: float | None = None  # when the rule takes effect (unix s)
    fingerprint: str = ""  # (path, size, mtime) digest of the verified save, when its event recorded one
    stored_bytes: int = 0  # in the store, after compression; 0: the same as `bytes`
    # Object Lock as ckptvault set it (docs/FORMAT.md, "The lock in the state"); the objects' HEADs are the truth.
    locked_until: float | None = None  # unix s: the retain-until date of the save's objects; None: none known
    legal_hold: bool = False  # the last held/released event was `held`
    replicas: tuple[ReplicaCopy, ...] = ()  # the copies on replicas, in the order first recorded
    # from the checkpoint's commit on the hot tier to its manifest's (docs/FORMAT.md, "The RPO of a save")
    rpo_seconds: float | None = None  # None: not recorded (events before it, a rebuild)
    # the original bytes of the files `restore --only model` / `--only optimizer` restore (docs/FORMAT.md,
    # "The model and the optimizer of a save"); they sum to `bytes`
    model_bytes: int | None = None  # None: not recorded (events before it), or the layout cannot tell
    optimizer_bytes: int | None = None
    # what the checkpoint records of what wrote it (docs/FORMAT.md, "What wrote a save"), from the last
    # verified event that says it; {}: none recorded (a layout that records nothing, events before it)
    written_by: dict[str, str] = field(default_factory=dict)

    @property
    def copies(self) -> int:
        """How many stores hold the save: the primary (once verified there, until it expires) and each replica."""
        return int(self.verified) + len(self.replicas)

    @property
    def billed_bytes(self) -> int:
        """What the storage class charges for: the stored objects, not the files they decode to."""
        return self.stored_bytes or self.bytes

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.run, self.step, self.save)

    @property
    def expired(self) -> bool:
        return self.last_event == "expired"

    @property
    def suspect(self) -> bool:
        """Verified, but its last drill failed: not trusted until a later drill passes."""
        return self.verified and self.last_drill_ok is False

    @property
    def good(self) -> bool:
        """What `restore latest` may pick: verified, not superseded, its last drill did not fail."""
        return self.verified and not self.superseded and not self.suspect

    @property
    def state(self) -> str:
        """The lifecycle state, one of LIFECYCLE_STATES: what the checkpoint *is*, not what last happened."""
        if self.expired:
            return "expired"
        if self.verified:
            if self.superseded:
                return "superseded"
            return "suspect" if self.suspect else "verified"
        if self.last_event in ("invalid", "accepted"):
            return self.last_event
        return "pending"


def newest_saves(states: Iterable[CheckpointState]) -> dict[tuple[str, int], CheckpointState]:
    """The newest save of each (run, step): what a step means when no save is named."""
    out: dict[tuple[str, int], CheckpointState] = {}
    for s in states:
        cur = out.get((s.run, s.step))
        if cur is None or s.save > cur.save:
            out[(s.run, s.step)] = s
    return out
