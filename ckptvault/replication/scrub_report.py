"""What one scrub reports (ckptvault.replication.scrub_pass.ScrubReport), shared by `ckptvault scrub` and
the scrub flow so both say the same: the lines printed (or logged) per save and copy, the tamper check's
lines, the closing line, the flow's markdown artifact, one `scrub_problem` alert per save and copy with
a problem left and one `tamper` alert per tampered save and copy, and which copies a scrub opens and
checks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ckptvault.alerts import kinds
from ckptvault.alerts.alert import Alert
from ckptvault.config import ReplicaConfig
from ckptvault.errors import AlreadyAlerted
from ckptvault.history.tamper import TamperedSave, recover_since, utc
from ckptvault.replication.replicas import ReplicaUnusable
from ckptvault.replication.scrub import PRIMARY, SaveScrub
from ckptvault.replication.scrub_pass import ScrubReport


@dataclass(frozen=True)
class CopyChoice:
    """The copies a scrub opens (every one is a repair's source) and the ones it checks."""

    replicas: list[ReplicaConfig]  # opened beside the primary
    checked: list[str]  # PRIMARY and replica names


def choose_copies(replicas: Sequence[ReplicaConfig], name: str | None) -> CopyChoice:
    """Every copy (`name` None), or the primary and the one named (PRIMARY: the primary alone checked,
    every replica opened to repair from). An unknown name is ReplicaUnusable naming the known ones."""
    names = [PRIMARY, *(r.name for r in replicas)]
    if name is not None and name not in names:
        raise ReplicaUnusable(
            f"no [[replicas]] entry is named {name!r} (copies: {', '.join(names)}). Name one of them, or "
            "leave it out to scrub every copy"
        )
    opened = [r for r in replicas if name in (None, PRIMARY, r.name)]
    return CopyChoice(opened, [PRIMARY, *(r.name for r in opened)] if name is None else [name])


def label(s: SaveScrub) -> str:
    return f"{s.run} step {s.step}" + (f" save {s.save}" if s.save > 1 else "")


def save_lines(s: SaveScrub) -> list[tuple[bool, str]]:
    """What a scrub says of one save, line by line, each with whether it reports a problem left (the
    command line prints those on stderr)."""
    out: list[tuple[bool, str]] = []
    for c in s.copies:
        n = c.counts()
        how = f"{n['read']} read whole, {n['size_only']} archived or without a CRC32C: size only"
        for p in c.problems:
            fixed = p.path in c.repaired
            out.append((not fixed, f"{c.store}: {label(s)}: {p.path}: {p.why}" + (" -> repaired" if fixed else "")))
        out += [
            (True, f"{c.store}: {label(s)}: {path}: {why}")
            for path, why in c.left.items()
            if not any(p.path == path and p.why == why for p in c.problems)
        ]
        state = "OK" if c.ok else f"{len(c.left)} problem(s) left"
        out.append((False, f"{c.store}: {label(s)}: {n['objects']} objects checked ({how}): {state}"))
    return out


def tamper_label(t: TamperedSave) -> str:
    return f"{t.run} step {t.step}" + (f" save {t.save}" if t.save > 1 else "")


def tamper_lines(report: ScrubReport) -> list[tuple[bool, str]]:
    """What the tamper check says, each line with whether it reports a problem (stderr): each tampered
    key, each save it could not judge, and once per copy where it did not run, why (a bucket without
    versions: said, never an error)."""
    out: list[tuple[bool, str]] = []
    for name, why in report.tamper_skipped.items():
        out.append((False, f"{name}: tamper check skipped: {why}"))
    for survey in report.tamper:
        for t in survey.tampered:
            for k in t.keys:
                out.append((True, f"{t.store}: {tamper_label(t)}: TAMPERED: {k.text()}"))
        for save_dir, why in survey.unjudged.items():
            out.append((True, f"{survey.store}: {save_dir}: tamper check could not judge it: {why}"))
    return out


def tamper_summary(report: ScrubReport) -> str:
    """The tamper check's part of the closing line ("" where it ran nowhere)."""
    if not report.tamper:
        return ""
    checked = sum(s.checked for s in report.tamper)
    stores = ", ".join(s.store for s in report.tamper)
    hit = report.tampered
    if not hit:
        return f"; tamper check ({stores}): {checked} committed saves, none tampered"
    names = ", ".join(f"{t.store}: {tamper_label(t)}" for t in hit)
    since = recover_since(min(t.first_at for t in hit))
    return (
        f"; TAMPERED: {len(hit)} of {checked} committed saves ({names}): deleted or overwritten after their "
        f'commit. `ckptvault recover --since {since}` plans the undo (docs/runbook.md, "The bucket was attacked")'
    )


def closing_line(report: ScrubReport, repair: bool) -> str:
    sel = report.selection
    runs = f"{sel.window} scrub" + ("s" if sel.window != 1 else "")
    return (
        f"scrubbed {len(report.saves)} of {sel.scrubbable} saves on {', '.join(report.stores)} (sample "
        f"{sel.sample}, {len(sel.rechecked)} rechecked: every save within {runs}): {report.found} problem(s) "
        f"found, {len(report.repairs)} repaired, {report.left} left"
        + ("" if not report.left or repair else "; `ckptvault scrub --repair` rewrites them from a good copy")
        + tamper_summary(report)
    )


def to_markdown(report: ScrubReport, repair: bool) -> str:
    """The flow's artifact: a row per copy, then each problem found (repaired or left)."""
    sel = report.selection
    rows = [
        "## Scrub",
        "",
        f"{len(report.saves)} of {sel.scrubbable} saves scrubbed (sample {sel.sample}, {len(sel.rechecked)} "
        f"rechecked after an earlier problem): every save is scrubbed within {sel.window} scrubs. "
        + ("Repair: on." if repair else "Repair: off (report only; `[scrub] repair`)."),
        "",
        "| copy | saves checked | objects checked | read whole | size only | problems found | repaired | left |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for store in report.stores:
        cs = [c for s in report.saves for c in s.copies if c.store == store]
        n = [c.counts() for c in cs]
        cells = (
            store, len(cs), sum(x["objects"] for x in n), sum(x["read"] for x in n), sum(x["size_only"] for x in n),
            sum(len(c.problems) for c in cs), sum(len(c.repaired) for c in cs), sum(len(c.left) for c in cs),
        )  # fmt: skip
        rows.append(_row(*cells))
    if report.repairs:
        head = _row("copy", "save", "path", "from", "was", "bytes")
        rows += ["", "### Repaired", "", head, "|---|---|---|---|---|---:|"]
        rows += [
            _row(r.store, f"{r.run} step {r.step} save {r.save}", r.path, r.source, _cell(r.why), r.bytes)
            for r in report.repairs
        ]
    left = [
        f"- {c.store}: {label(s)}: {path}: {_cell(why)}"
        for s in report.saves
        for c in s.copies
        for path, why in c.left.items()
    ]
    if left:
        rows += ["", "### Left (each alerted on; a restore falls back to another copy for these)", "", *left]
    tampered = [f"- {t.store}: {tamper_label(t)}: {_cell(k.text())}" for t in report.tampered for k in t.keys]
    if tampered:
        rows += ["", "### Tampered (deleted or overwritten after the save's commit; each save alerted on)", "",
                 *tampered]  # fmt: skip
    rows += [f"\nTamper check skipped on {name}: {_cell(why)}" for name, why in report.tamper_skipped.items()]
    return "\n".join(rows) + "\n"


def alerts(report: ScrubReport, repair: bool, flow_run_url: str | None = None) -> list[Alert]:
    """One `scrub_problem` per save and copy with a problem left, naming the copy, the save and each path;
    then the `tamper` alerts."""
    return [
        kinds.build("scrub_problem", store=c.store, run=s.run, step=s.step, save=s.save,
                    problems=[f"{p}: {w}" for p, w in c.left.items()], repaired=repair, flow_run_url=flow_run_url)
        for s in report.saves
        for c in s.copies
        if c.left
    ] + tamper_alerts(report, flow_run_url)  # fmt: skip


def tamper_alerts(report: ScrubReport, flow_run_url: str | None = None) -> list[Alert]:
    """One `tamper` per tampered save and copy, naming each key, what was done to it and when: deduplicated
    by the save and its keys, so a scrub that finds the same again sends nothing new."""
    return [
        kinds.build("tamper", store=t.store, run=t.run, step=t.step, save=t.save, keys=[k.text() for k in t.keys],
                    since=recover_since(t.first_at), committed=utc(t.committed_at), flow_run_url=flow_run_url)
        for t in report.tampered
    ]  # fmt: skip


def tampered_saves(report: ScrubReport) -> int | None:
    """The `ckptvault_tampered_saves` gauge's value: tampered saves (each copy's counted), None where the
    tamper check ran on no copy (the gauge then keeps what the last check that ran said)."""
    return len(report.tampered) if report.tamper else None


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _cell(text: str) -> str:
    return " ".join(text.split())[:300]


class ScrubIncomplete(AlreadyAlerted):
    """A scrub flow run that left a problem on some copy; each save and copy was alerted on by the flow."""

    def __init__(self, report: ScrubReport, repair: bool) -> None:
        self.report = report
        lines = [line for s in report.saves for bad, line in save_lines(s) if bad]
        lines += [line for bad, line in tamper_lines(report) if bad]
        super().__init__(closing_line(report, repair) + ":\n" + "\n".join(f"  {x}" for x in lines))
