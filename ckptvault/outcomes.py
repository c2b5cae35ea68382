"""How an ingest pass ended, in a form both the flow and the command line report."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ckptvault.errors import CkptvaultError

if TYPE_CHECKING:
    from ckptvault.ingest.steps import Outcome
    from ckptvault.restore.drill import DrillReport


class AlreadyAlerted(CkptvaultError):
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

    def __init__(self, report: DrillReport) -> None:
        # the whole drill report, so `drill --json` prints it for a failed drill too
        self.report = report
        bad = report.failed
        lines = [f"{len(bad)} of {len(report.drilled)} drilled checkpoint(s) FAILED:"]
        lines += [f"  {r.run} step {r.step}" + (f" save {r.save}" if r.save != 1 else "") + f": {list(r.problems)}"
                  for r in bad]  # fmt: skip
        super().__init__("\n".join(lines))
