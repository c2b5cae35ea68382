"""The `--json` document as text, the same wherever it is printed: by output's `emit_json`, or held back
by `--profile` and printed at the end with its `profile` key. Below both, so that neither imports the
other to share it."""

from __future__ import annotations


def jsonable(o: object) -> object:
    import dataclasses

    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    return str(o)  # exceptions, paths, anything else: its text


def dumps(doc: object) -> str:
    """One document (schemas in docs/commands.md), indented, any value JSON has no type for by `jsonable`."""
    import json

    return json.dumps(doc, indent=1, default=jsonable)
