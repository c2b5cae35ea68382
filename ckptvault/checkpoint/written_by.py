"""What the training process reports of the software it ran, beside what the checkpoint's files record
(docs/FORMAT.md, "What wrote a save"): the hooks collect it inside training (torch, its CUDA, the
framework) and hand it to ingest as `KEY=VERSION` words, on the command line (`ingest --written-by`) or
in the saved event's payload. One text form for both, so a Prefect trigger passes it as a string."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ckptvault.errors import InvalidArgumentError

MAX_VERSION = 64  # characters, as for the versions a checkpoint records
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_!-]{0,63}")


class ReportedError(InvalidArgumentError):
    """A `KEY=VERSION` word that does not read as one."""


def parse(text: str | None) -> dict[str, str]:
    """`"torch=2.9.1 torch.cuda=12.8"` (words separated by spaces or commas) as a dict. ReportedError
    naming the word that is not `KEY=VERSION`, a key of letters, digits, `.`, `_`, `-`, and a version of
    at most 64 characters of those and `+`, `!`."""
    out: dict[str, str] = {}
    for word in re.split(r"[\s,]+", (text or "").strip()):
        if not word:
            continue
        key, eq, value = word.partition("=")
        if not eq or not _KEY.fullmatch(key) or not _VALUE.fullmatch(value):
            raise ReportedError(
                f"{word!r} is not KEY=VERSION (e.g. torch=2.9.1): a key of letters, digits, '.', '_' or '-',"
                f" a version of at most {MAX_VERSION} characters"
            )
        out[key] = value
    return dict(sorted(out.items()))


def parse_leniently(text: str | None) -> tuple[dict[str, str], str]:
    """`parse` for a report that came with an event: one that does not read is left out with a warning
    (the second item, "" when none) and never fails the ingest of the save it came with."""
    try:
        return parse(text), ""
    except ReportedError as e:
        return {}, f"written_by not recorded: {e}"


def render(versions: Mapping[str, str]) -> str:
    """The words `parse` reads back, keys sorted; entries that would not read back are left out."""
    words = [f"{k}={v}" for k, v in sorted(versions.items()) if _KEY.fullmatch(k) and _VALUE.fullmatch(v)]
    return " ".join(words)


def merge(recorded: Mapping[str, str], reported: Mapping[str, str]) -> dict[str, str]:
    """The manifest's `written_by`: what the checkpoint's files record wins over what the process reported
    under the same key (the file is the thing being archived; the report is the hook's view of it)."""
    return dict(sorted({**reported, **recorded}.items()))
