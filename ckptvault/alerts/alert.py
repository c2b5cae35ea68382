"""The alert record: pure data, no I/O.

Every message is written for a tired on-call engineer at 3 a.m.: what happened, to which run and step,
what to do next, and a link to the Prefect flow run when there is one. Wording lives only in the table
of kinds (ckptvault/alerts/wording.py), which the one builder (`kinds.build`) reads, so every caller
says things the same way; this record only knows how to render what it wrote, as text or Slack blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptvault.alerts.wording import ALL_RUNS as ALL_RUNS
from ckptvault.alerts.wording import KINDS as KINDS
from ckptvault.alerts.wording import Severity as Severity
from ckptvault.errors import InvalidArgumentError

# Slack rejects a section over 3000 characters and a message over 50 blocks; a wall of detail
# is also useless at 3 a.m., so we cut early and say how much was cut.
MAX_DETAILS = 10
MAX_DETAIL_CHARS = 300

_ICON = {"info": ":information_source:", "warning": ":warning:", "error": ":rotating_light:"}


@dataclass(frozen=True)
class Alert:
    kind: str
    run: str
    step: int | None
    summary: str
    details: list[str]
    next_step: str
    severity: Severity
    flow_run_url: str | None = None
    reason: str = ""  # part of the dedup key: what makes two alerts of one kind and run different

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidArgumentError(f"unknown alert kind {self.kind!r}; expected one of {', '.join(KINDS)}")

    def dedup_key(self) -> str:
        return f"{self.kind}|{self.run}|{self.reason}"

    def where(self) -> str:
        if self.run == ALL_RUNS:
            return "all runs"
        return f"run {self.run}" + (f", step {self.step}" if self.step is not None else "")

    def shown_details(self) -> list[str]:
        shown = [_clip(d, MAX_DETAIL_CHARS) for d in self.details[:MAX_DETAILS]]
        if len(self.details) > MAX_DETAILS:
            shown.append(f"... and {len(self.details) - MAX_DETAILS} more")
        return shown

    def text(self) -> str:
        lines = [f"[{self.severity.upper()}] {self.summary} ({self.where()})"]
        lines += [f"  - {d}" for d in self.shown_details()]
        lines.append(f"Next: {self.next_step}")
        if self.flow_run_url:
            lines.append(f"Flow run: {self.flow_run_url}")
        return "\n".join(lines)

    def blocks(self) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = [
            _section(f"{_ICON[self.severity]} *{escape(self.summary)}*"),
            {"type": "context", "elements": [_mrkdwn(self._context())]},
        ]
        if self.details:
            blocks.append(_section("\n".join(f"• {escape(d)}" for d in self.shown_details())))
        blocks.append(_section(f"*Next:* {escape(self.next_step)}"))
        return blocks

    def _context(self) -> str:
        parts = [f"`{escape(self.kind)}`", escape(self.where())]
        if self.flow_run_url:
            parts.append(f"<{self.flow_run_url}|Open the flow run>")
        return " · ".join(parts)


def escape(text: str) -> str:
    """Slack mrkdwn control characters; an error message with `<` must not become a broken link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _mrkdwn(text: str) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": _clip(text, 3000)}


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": _mrkdwn(text)}
