"""The flows ckptvault deploys, each with when it runs and what it does: the one list that the README's
table, the docs site's home page (both written by docs/gen_reference.py) and `ckptvault serve --help`
are rendered from.

Standard library only, and nothing here imports Prefect: the command line's help is built from it before
any command runs. prefect.yaml beside this module stays what Prefect reads; each flow's schedule here is
written in prefect.yaml's terms, and tests/unit/test_flow_list.py fails when the two differ.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

_DAYS = ("Sundays", "Mondays", "Tuesdays", "Wednesdays", "Thursdays", "Fridays", "Saturdays")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_CITED = re.compile(r"\(\[[^\]]+\]\(([^)\s]+)\)\)")


@dataclass(frozen=True)
class FlowDoc:
    """One deployment of prefect.yaml. `what` is Markdown whose links are relative to docs/ (as on the
    site); a flow with neither `interval_s` nor `cron` runs on demand only."""

    name: str
    what: str
    interval_s: int | None = None
    cron: str | None = None  # minute hour * * day-of-week, in UTC
    event: str | None = None  # an event that also starts it (prefect.yaml's `triggers:`)

    def schedules(self) -> list[dict[str, str | int]]:
        """The schedule as prefect.yaml's `schedules:` writes it."""
        if self.interval_s is not None:
            return [{"interval": self.interval_s}]
        if self.cron is not None:
            return [{"cron": self.cron, "timezone": "UTC"}]
        return []

    def when(self, link_prefix: str | None = "") -> str:
        """When it runs, in words. `link_prefix`: put before each docs/ link (None: plain text)."""
        text = _interval_words(self.interval_s) if self.interval_s is not None else None
        text = text or (_cron_words(self.cron) if self.cron is not None else "on demand")
        if self.event:
            text += ", and seconds after each save a [framework hook](hooks.md) reports"
        return _links(text, link_prefix)

    def what_it_does(self, link_prefix: str | None = "") -> str:
        return _links(self.what, link_prefix)


FLOWS: tuple[FlowDoc, ...] = (
    FlowDoc(
        "ingest",
        interval_s=600,
        event="ckptvault.checkpoint.saved",
        what="discover finished checkpoints of 7 framework layouts ([Frameworks](frameworks/index.md)), validate "
        "them, upload with CRC32C computed in the same read pass, verify, commit a manifest last, record in the "
        "catalog",
    ),
    FlowDoc(
        "tier",
        cron="30 3 * * *",
        what="the retention policy as a cost-aware plan, applied (the deployment passes `apply: true`; try a "
        "policy first with `ckptvault plan` or `ckptvault tier`, which only plan): keep the newest hot, "
        "milestones forever, move the rest down the storage classes, expire what the policy allows "
        "([Tiering and cost](tiering.md))",
    ),
    FlowDoc(
        "replicate",
        interval_s=3600,
        what="copy every committed save each `[[replicas]]` store should hold to it, object by object, checked "
        "against its CRC32C, its manifest last ([Replicas](replicas.md))",
    ),
    FlowDoc(
        "scrub",
        cron="30 4 * * *",
        what="check every object of a seventh of the saves on every copy against the manifest (HEADs, no "
        "download where the store keeps a CRC32C), so every save within a week; alert what is wrong, repair "
        "it from a good copy if `[scrub] repair = true`",
    ),
    FlowDoc(
        "drill",
        cron="0 5 * * 0",
        what="restore a rotating sample into scratch, check every CRC32C, load every tensor, run the training's "
        "own resume check where configured, record the time to restore ([Restore drills](drills.md))",
    ),
    FlowDoc(
        "restore",
        what="bring back run R at step S (or `latest`) into a directory the framework resumes from",
    ),
    FlowDoc(
        "watch",
        interval_s=3600,
        what="runs that stopped checkpointing, storage budget; alerts to Slack ([Alerts](alerts.md))",
    ),
)


def _interval_words(seconds: int) -> str:
    if seconds == 3600:
        return "hourly"
    if seconds == 86400:
        return "daily"
    if seconds % 3600 == 0:
        return f"every {seconds // 3600} hours"
    if seconds % 60 == 0:
        return f"every {seconds // 60} minutes"
    return f"every {seconds} s"


def _cron_words(cron: str) -> str:
    """The two shapes the deployments use, daily and weekly at a fixed time; any other is refused rather
    than described wrongly."""
    fields = cron.split()
    if len(fields) == 5 and fields[2:4] == ["*", "*"] and fields[0].isdigit() and fields[1].isdigit():
        at = f"{int(fields[1]):02d}:{int(fields[0]):02d} UTC"
        if fields[4] == "*":
            return f"daily at {at}"
        if fields[4].isdigit() and int(fields[4]) <= 7:
            return f"weekly, {_DAYS[int(fields[4]) % 7]} at {at}"
    raise ValueError(f"no words for the schedule {cron!r}: add its shape to _cron_words")


def _links(markdown: str, prefix: str | None) -> str:
    """Each docs/ link made relative to where the text goes; `prefix` None: plain text, where a link that
    is all of a parenthesis (`([Replicas](replicas.md))`) becomes the file's path and any other its words."""
    if prefix is None:
        markdown = _CITED.sub(lambda m: f"(docs/{m[1]})", markdown)
        return _LINK.sub(lambda m: m[1], markdown)
    return _LINK.sub(lambda m: f"[{m[1]}]({prefix}{m[2]})", markdown)


def markdown_table(link_prefix: str = "") -> str:
    """The flows as a Markdown table; `link_prefix` makes the docs/ links relative to the file it goes in
    (`docs/` for the README)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = [f"| `{f.name}` | {cell(f.when(link_prefix))} | {cell(f.what_it_does(link_prefix))} |" for f in FLOWS]
    return "\n".join(["| flow | when | what it does |", "| --- | --- | --- |", *rows]) + "\n"


def serve_description(width: int = 100) -> str:
    """`ckptvault serve --help`'s text: each flow, when it runs and what it does, in plain text."""
    indent = " " * 14
    lines = [
        f"Serves the {len(FLOWS)} deployments of ckptvault_prefect/deployments/prefect.yaml from this process:",
        "",
    ]
    for f in FLOWS:
        lines += textwrap.wrap(f.when(None), width, initial_indent=f"  {f.name:<10}  ", subsequent_indent=indent)
        lines += textwrap.wrap(
            f.what_it_does(None), width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False
        )
    return "\n".join(lines)
