"""Opening the store as it was at a moment: `--as-of TIME` (docs/object-lock.md, "After an attack").

A point-in-time view needs the bucket's versions, so a bucket that keeps none is refused before anything
else is read (its answer to ListObjectVersions would look like a history and is not one). A moment older
than what the bucket's lifecycle keeps of noncurrent versions is read anyway, with a warning: what has
expired since reads as absent, and the user should know why a save they expect is not there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from ckptvault.history.as_of import AsOfError, parse_as_of
from ckptvault.store import ObjectStore, StoreError


@dataclass(frozen=True)
class View:
    store: ObjectStore  # reads name the versions current at `at`; writes refused
    at: float
    warnings: tuple[str, ...]


def kept_noncurrent_days(store: ObjectStore, prefix: str) -> int | None:
    """The fewest days the bucket's enabled lifecycle rules keep a noncurrent version under `prefix`
    (None: kept until deleted, or the rules cannot be read)."""
    try:
        rules = store.get_lifecycle()
    except StoreError:
        return None
    days = []
    for rule in rules:
        if rule.get("Status") != "Enabled" or "NoncurrentVersionExpiration" not in rule:
            continue
        scope = str((rule.get("Filter") or {}).get("Prefix", rule.get("Prefix", "")))
        if prefix.startswith(scope) or scope.startswith(prefix):
            days.append(int(rule["NoncurrentVersionExpiration"].get("NoncurrentDays", 0)))
    return min(days) if days else None


def open_as_of(store: ObjectStore, at: datetime, prefix: str, flag: str = "--as-of") -> View:
    """The view of `store` at `at`; AsOfError (exit 2) when the bucket keeps no versions."""
    status = store.versioning()
    if status != "Enabled":
        said = "never turned on" if status is None else status.lower()
        raise AsOfError(
            f"{flag}: s3://{store.bucket} keeps no versions (versioning {said}): a point-in-time read needs a "
            "versioned bucket (Object Lock implies one; infra/terraform makes it so)"
        )
    moment = at.timestamp()
    warnings = []
    days = kept_noncurrent_days(store, prefix)
    if days is not None and moment < time.time() - days * 86400:
        warnings.append(
            f"{flag} {at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ} is older than the {days} days s3://{store.bucket} "
            "keeps noncurrent versions: what was deleted or overwritten before then reads as absent"
        )
    return View(store.as_of(moment), moment, tuple(warnings))


def open_at(store: ObjectStore, text: str, prefix: str, flag: str = "--as-of") -> View:
    """The view at the moment the user's TIME `text` names (`--as-of`, `--since`); AsOfError naming the flag
    on a TIME that names no moment or a bucket that keeps no versions."""
    return open_as_of(store, parse_as_of(text, datetime.now(UTC), flag), prefix, flag)
