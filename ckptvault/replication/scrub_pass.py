"""One scrub (`ckptvault scrub`): the rotation's saves checked on every copy (scrub.py), repaired where
asked (repair.py), recorded in the primary's catalog: a `scrubbed` event per save and copy, a
`repaired` event per object rewritten."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptvault.catalog import Catalog, CheckpointState, Event
from ckptvault.config import LockConfig
from ckptvault.replication.repair import Repair, repair_save
from ckptvault.replication.scrub import (
    Copy,
    History,
    SaveScrub,
    Selection,
    check_save,
    history,
    scrubbed_events,
    select,
)


@dataclass
class ScrubReport:
    selection: Selection
    stores: list[str]  # the copies checked
    saves: list[SaveScrub] = field(default_factory=list)
    repairs: list[Repair] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.saves)

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
        }  # fmt: skip


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
    past: dict[tuple[str, int, int], History] = history(past_events)
    chosen = select(states, past, checked, sample)
    out = ScrubReport(chosen, list(checked))
    for s in chosen.chosen:
        h = past.get(s.key)
        result, ms = check_save(copies, checked, s, h.replicated if h else ())
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
