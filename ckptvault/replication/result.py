"""What one replicate run reports, for every replica it copied to: the passes (ckptvault.replication.
replicate), the text `ckptvault replicate` prints and the flow logs, the flow's markdown artifact, the
alerts of what failed, and `as_dict`, the `ckptvault replicate --json` document (docs/commands.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptvault.alerts import kinds
from ckptvault.alerts.alert import ALL_RUNS, Alert
from ckptvault.errors import AlreadyAlerted
from ckptvault.humanize import size
from ckptvault.replication.replicate import ReplicaPass


@dataclass(frozen=True)
class ReplicateResult:
    passes: tuple[ReplicaPass, ...] = ()
    # replica -> why, for a replica whose pass did not finish (its task failed after every retry): it
    # copied what it reached, and its events are in the catalog; what it did is not known here
    stopped: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, outcomes: Sequence[tuple[str, ReplicaPass | BaseException]]) -> ReplicateResult:
        """From each replica's outcome: its pass, or the error its pass stopped on."""
        passes = tuple(o for _, o in outcomes if isinstance(o, ReplicaPass))
        stopped = {name: str(o) or type(o).__name__ for name, o in outcomes if not isinstance(o, ReplicaPass)}
        return cls(passes, stopped)

    @property
    def ok(self) -> bool:
        """Every wanted save of every replica is on it."""
        return not self.stopped and not any(p.failures for p in self.passes)

    def as_dict(self) -> dict[str, Any]:
        return {"replicas": [p.as_dict() for p in self.passes], "stopped": dict(self.stopped)}

    def lines(self) -> list[tuple[bool, str]]:
        """What a run says, line by line, each with whether it reports a failure (the command line
        prints those on stderr)."""
        out: list[tuple[bool, str]] = []
        for p in self.passes:
            if p.retention == "missing":  # lifecycle = "external": Terraform's rule is not (or not so) there
                out.append((True, f"{p.replica}: retention rule missing: expire_after_days = {p.retention_days}, but "
                                  "the bucket has no such rule and lifecycle = \"external\"; apply infra/terraform "
                                  f"with replica_expire_after_days = {p.retention_days}"))  # fmt: skip
            elif p.retention != "unchanged":
                days = p.retention_days
                kept = f" (objects expire {days} days after their copy)" if p.retention == "installed" else ""
                out.append((False, f"{p.replica}: retention rule {p.retention}{kept}"))
            for s in p.copied:
                out.append((False, f"{p.replica}: {s.run} step {s.step} save {s.save}: {s.copied} objects copied, "
                                   f"{s.kept} kept, {size(s.bytes)} in {s.seconds:.1f} s ({size(s.hot_bytes)} from "
                                   f"the hot copy, {size(s.primary_bytes)} from the primary)"))  # fmt: skip
                out += [(True, f"{p.replica}: {s.run} step {s.step} save {s.save}: read from the primary instead: "
                               f"{why}") for why in s.fallbacks]  # fmt: skip
            out += [(False, f"{p.replica}: {s.run} step {s.step} save {s.save}: committed by an earlier pass, recorded")
                    for s in p.recorded]  # fmt: skip
            out += [(True, f"{p.replica}: {f.label} FAILED: {f.error}") for f in p.failures]
            if p.copied or p.failures:
                n = (len(p.copied), p.present, len(p.failures))
                out.append((False, "{}: {} saves copied, {} already there, {} failed".format(p.replica, *n)))
            else:
                out.append((False, f"{p.replica}: nothing to copy ({p.present} saves already there)"))
        out += [(True, f"{name}: stopped: {why}") for name, why in sorted(self.stopped.items())]
        return out

    def to_markdown(self) -> str:
        """The flow's artifact: a row per replica, then the saves copied, then what failed."""
        head = "| replica | saves copied | already there | objects copied | objects kept | bytes copied | seconds "
        rows = ["## Replicate", "", head + "| failures |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for p in self.passes:
            objects, kept = sum(s.copied for s in p.copied), sum(s.kept for s in p.copied)
            nbytes, seconds = sum(s.bytes for s in p.copied), sum(s.seconds for s in p.copied)
            cells = (p.replica, len(p.copied), p.present, objects, kept, f"{nbytes} ({size(nbytes)})", f"{seconds:.1f}")
            rows.append(_row(*cells, len(p.failures)))
        rows += [_row(name, *["-"] * 6, "stopped") for name in sorted(self.stopped)]
        copied = [(p.replica, s) for p in self.passes for s in p.copied]
        if copied:
            head = _row("replica", "run", "step", "save", "objects copied", "objects kept", "bytes", "seconds")
            rows += ["", "### Saves copied", "", head, "|---|---|---:|---:|---:|---:|---:|---:|"]
            rows += [_row(r, s.run, s.step, s.save, s.copied, s.kept, s.bytes, f"{s.seconds:.1f}") for r, s in copied]
        failed = [f"- {p.replica}: {f.label}: {_cell(f.error)}" for p in self.passes for f in p.failures]
        failed += [f"- {name}: the pass stopped: {_cell(why)}" for name, why in sorted(self.stopped.items())]
        if failed:
            rows += ["", "### Not copied (the replica does not hold these; the next run tries again)", "", *failed]
        return "\n".join(rows) + "\n"

    def alerts(self, flow_run_url: str | None = None) -> list[Alert]:
        """One alert per save not copied, naming the replica and the save, and one per stopped pass."""
        out = [
            kinds.build("replicate_failed", replica=p.replica, run=f.run, step=f.step, save=f.save, error=f.error,
                        flow_run_url=flow_run_url)
            for p in self.passes
            for f in p.failures
        ]  # fmt: skip
        out += [
            kinds.build("replicate_failed", replica=name, run=ALL_RUNS, step=None, save=None, error=why,
                        flow_run_url=flow_run_url)
            for name, why in sorted(self.stopped.items())
        ]  # fmt: skip
        return out


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _cell(text: str) -> str:
    """An error on one line, cut: a markdown list item, not a traceback."""
    return " ".join(text.split())[:500]


class ReplicateIncomplete(AlreadyAlerted):
    """A replicate flow run that left some wanted save off a replica; each was alerted on by the flow."""

    def __init__(self, result: ReplicateResult) -> None:
        self.result = result
        lines = [line for bad, line in result.lines() if bad]
        super().__init__("not every wanted save reached its replica:\n" + "\n".join(f"  {x}" for x in lines))
