"""What every command prints besides its own lines: messages on stderr, the one `--json` document on stdout."""

from __future__ import annotations

import sys


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def jsonable(o: object) -> object:
    import dataclasses

    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    return str(o)  # exceptions, paths, anything else: its text


def emit_json(doc: object) -> None:
    """The one JSON document a `--json` command prints on stdout (schemas in docs/commands.md)."""
    import json

    from ckptvault_cli import profiling

    if profiling.hold_json(doc):  # --profile: printed at the end, with its `profile` key
        return
    print(json.dumps(doc, indent=1, default=jsonable), flush=True)
