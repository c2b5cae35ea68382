"""How an ingest pass ended, in a form both the flow and the command line report."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckptvault.ingest.steps import Outcome


class AlreadyAlerted(Exception):
    """A failure whose every part was alerted on by the flow itself: the failure hook stays quiet
    rather than saying the same thing twice."""


class IngestIncomplete(AlreadyAlerted):
    """Some finished checkpoint ended neither uploaded nor already present."""

    def __init__(self, outcomes: Sequence[Outcome]) -> None:
        self.outcomes = list(outcomes)
        bad = [o for o in self.outcomes if not o.ok]
        lines = [f"{len(bad)} checkpoint(s) not uploaded:"]
        lines += [f"  {o.run} step {o.step} ({o.format}): {o.result}: {o.message}" for o in bad]
        super().__init__("\n".join(lines))


class DrillFailed(AlreadyAlerted):
    """At least one drilled checkpoint did not restore intact or did not load."""

    def __init__(self, rows: Sequence[dict[str, object]], report: dict[str, object] | None = None) -> None:
        self.rows = list(rows)
        # the whole drill report (README "Restore drills"), so `drill --json` prints it for a failed drill too
        self.report = report if report is not None else {"drilled": self.rows}
        bad = [r for r in self.rows if not r["ok"]]
        lines = [f"{len(bad)} of {len(self.rows)} drilled checkpoint(s) FAILED:"]
        lines += [f"  {r['run']} step {r['step']}" + (f" save {r['save']}" if r.get("save", 1) != 1 else "")
                  + f": {r['problems']}" for r in bad]  # fmt: skip
        super().__init__("\n".join(lines))
