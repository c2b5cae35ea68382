"""One scrub (`ckptvault scrub`): first the tamper check of every copy checked whose bucket keeps versions
(ckptvault/history/tamper.py: every committed save, from one ListObjectVersions each), then the
rotation's saves (with the tampered ones the catalog knows) checked on every copy (scrub.py), repaired
where asked (repair.py), recorded in the primary's catalog: a `scrubbed` event per save and copy, a
`repaired` event per object rewritten."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ckptvault.catalog import Catalog, CheckpointState, Event
from ckptvault.config import LockConfig
from ckptvault.history.tamper import TamperedSave, TamperSurvey, survey_tamper
from ckptvault.replication.repair import Repair, repair_save
from ckptvault.replication.scrub import (
    PRIMARY,
    Copy,
    History,
    SaveScrub,
    Selection,
    check_save,
    history,
    is_scrubbable,
    scrubbed_events,
    select,
)
from ckptvault.store import StoreError


@dataclass
class ScrubReport:
    selection: Selection
    stores: list[str]  # the copies checked
    saves: list[SaveScrub] = field(default_factory=list)
    repairs: list[Repair] = field(default_factory=list)
    tamper: list[TamperSurvey] = field(default_factory=list)  # each checked copy whose bucket keeps versions
    tamper_skipped: dict[str, str] = field(default_factory=dict)  # copy -> why its tamper check did not run

    @property
    def tampered(self) -> list[TamperedSave]:
        return [t for survey in self.tamper for t in survey.tampered]

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.saves) and not self.tampered

    @property
    def found(self) -> int:
        return sum(len(c.problems) for s in self.saves for c in s.copies)

    @property
    def left(self) -> int:
        return sum(len(c.left) for s in self.saves for c in s.copies)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "stores": self.stores, **self.selection.as_dict(), "found": self.found,
            "left": self.left, "saves": [s.as_dict() for s in self.saves],
            "repaired": [r.as_dict() for r in self.repairs],
            "tampered": [t.as_dict() for t in self.tampered],
            "tamper_check": {**{t.store: {"checked": t.checked, "read": t.read, "unjudged": t.unjudged}
                                for t in self.tamper},
                             **{name: {"skipped": why} for name, why in self.tamper_skipped.items()}},
        }  # fmt: skip


def versioning_of(copies: Sequence[Copy]) -> dict[str, str]:
    """Each copy's versioning ("Enabled", or why its tamper check cannot run)."""
    out = {}
    for c in copies:
        try:
            status = c.store.versioning()
        except StoreError as e:
            out[c.name] = f"whether s3://{c.store.bucket} keeps versions could not be read: {e}"
            continue
        out[c.name] = "Enabled" if status == "Enabled" else (
            f"s3://{c.store.bucket} keeps no versions ("
            + ("versioning never turned on" if status is None else f"versioning {status}")
            + "); the tamper check needs a versioned bucket (Object Lock implies one)"
        )  # fmt: skip
    return out


def tamper_check(
    copies: Sequence[Copy], checked: Sequence[str], versions: dict[str, str], states: Sequence[CheckpointState]
) -> tuple[list[TamperSurvey], dict[str, str]]:
    """The tamper check of each copy in `checked` whose bucket keeps versions; the others, with why not.
    Saves the primary's catalog records expired are left out on the primary (the tier deleted them)."""
    expired = {s.key for s in states if s.expired}
    done: list[TamperSurvey] = []
    skipped: dict[str, str] = {}
    for c in copies:
        if c.name not in checked:
            continue
        if versions.get(c.name) != "Enabled":
            skipped[c.name] = versions.get(c.name, "not checked")
            continue
        days = c.expire_after_days
        try:
            done.append(survey_tamper(
                c.store, c.prefix, c.name, leave_out=expired if c.name == PRIMARY else (),
                expires_after=days * 86400.0 if days is not None else None,
            ))  # fmt: skip
        except StoreError as e:
            skipped[c.name] = f"the versions of s3://{c.store.bucket} could not be listed: {e}"
    return done, skipped


def run_scrub(
    copies: Sequence[Copy],
    checked: Sequence[str],
    states: Sequence[CheckpointState],
    past_events: Sequence[Event],
    *,
    sample: int | None = None,
    repair: bool = False,
    lock: LockConfig | None = None,
    catalog: Catalog | None = None,
    clock: Callable[[], float] = time.time,
    on_save: Callable[[SaveScrub], None] | None = None,
) -> ScrubReport:
    """Scrub the rotation's saves (scrub.select over `past_events`, the primary catalog's) on the copies
    named in `checked` (all of `copies` are the reference's candidates and repair's sources); with
    `repair`, repair each save before its events are recorded (`lock`: the `[lock]` a manifest a
    repair commits is dated by). `catalog`: where the events go (None: nothing recorded). `on_save`
    is called with each save's result as it is done."""
    versions = versioning_of(copies)
    surveys, skipped = tamper_check(copies, checked, versions, states)
    past: dict[tuple[str, int, int], History] = history(past_events)
    chosen = select(states, past, checked, sample)
    # a tampered save the catalog knows is scrubbed (and repaired where asked) now, not when its turn comes
    hit = {(t.run, t.step, t.save) for s in surveys for t in s.tampered}
    extra = [s for s in states if s.key in hit and s.key not in {c.key for c in chosen.chosen} and is_scrubbable(s)]
    if extra:
        chosen = replace(chosen, chosen=tuple(sorted([*chosen.chosen, *extra], key=lambda s: s.key)))
    out = ScrubReport(chosen, list(checked), tamper=surveys, tamper_skipped=skipped)
    on = {name for name, status in versions.items() if status == "Enabled"}
    for s in chosen.chosen:
        h = past.get(s.key)
        result, ms = check_save(copies, checked, s, h.replicated if h else (), on)
        if repair:
            fixed = repair_save(result, ms, copies, lock or LockConfig(), clock=clock)
            out.repairs += fixed
        else:
            fixed = []
        out.saves.append(result)
        if catalog is not None:
            catalog.append([*(r.event() for r in fixed), *scrubbed_events(result)])
        if on_save is not None:
            on_save(result)
    return out
