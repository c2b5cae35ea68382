"""The Object Lock enforcement probe's memory across processes (docs/object-lock.md): a probe that
PASSED at an endpoint and bucket is not run again for a day.

Why: every `ckptvault ingest` with `[lock]` on would otherwise write a locked object (left for 60 s as
a noncurrent version where the credentials cannot bypass governance) to learn what it learnt at the
previous run ten minutes before. Whether a server enforces Object Lock is a property of the server,
which changes with an upgrade or a migration, not between two runs; a day bounds how long a change
goes unseen. Only a pass is kept: a server found not enforcing is probed again at the next run, so a
fixed one is seen at once. The bucket's GetObjectLockConfiguration is not cached (one cheap request,
and a bucket deleted and created again without Object Lock must be seen).

The file is a cache, never a source of truth: unreadable, malformed, from the future or unwritable
means "probe as if it were absent", never an error. Two processes writing it at once each replace it
whole (write to a temporary file, then rename): the loser's entry is lost, which costs one probe.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ckptvault.config import StoreConfig

CACHE_DIR_ENV = "CKPTVAULT_CACHE_DIR"  # moves the directory (tests point it at their own)
FILE_NAME = "lock-probe.json"
SCHEMA = "ckptvault.lock-probe/1"
MAX_AGE = 86_400.0  # a passed probe counts for a day


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """$CKPTVAULT_CACHE_DIR, else $XDG_CACHE_HOME/ckptvault, else ~/.cache/ckptvault. A relative
    XDG_CACHE_HOME is ignored, as the XDG Base Directory specification says."""
    env = os.environ if env is None else env
    if env.get(CACHE_DIR_ENV):
        return Path(env[CACHE_DIR_ENV])
    xdg = env.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "ckptvault"


def endpoint_key(store: StoreConfig) -> str:
    """Which server and bucket a probe proved: the endpoint URL (AWS's regional one when unset) and the
    bucket. Not the prefix (the lock is the bucket's) nor the credentials (the server enforces it or not)."""
    endpoint = (store.endpoint_url or f"https://s3.{store.region}.amazonaws.com").rstrip("/")
    return f"{endpoint} {store.bucket}"


@dataclass(frozen=True)
class ProbeCache:
    """The passed probes recorded in `directory`/lock-probe.json, as seen for one endpoint and bucket."""

    directory: Path
    key: str
    max_age: float = MAX_AGE

    @classmethod
    def of(cls, store: StoreConfig, env: Mapping[str, str] | None = None) -> ProbeCache:
        return cls(cache_dir(env), endpoint_key(store))

    @property
    def path(self) -> Path:
        return self.directory / FILE_NAME

    def passed_recently(self, now: float) -> bool:
        """A pass recorded for this key less than max_age before `now` (and not after it: a date from
        the future, a clock set back, does not count)."""
        at = self._read().get(self.key)
        return at is not None and 0.0 <= now - at < self.max_age

    def record_pass(self, now: float) -> None:
        """Remember that the probe passed at `now`; entries past their age are dropped. Best effort."""
        kept = {k: t for k, t in self._read().items() if 0.0 <= now - t < self.max_age}
        kept[self.key] = now
        body = json.dumps({"schema": SCHEMA, "passed": kept}, indent=1, sort_keys=True).encode()
        with contextlib.suppress(OSError):
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{FILE_NAME}.")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
                os.replace(tmp, self.path)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)  # gone after the rename; there only when a write failed

    def _read(self) -> dict[str, float]:
        """Every well-formed entry of the file; {} for a file absent, unreadable or of another shape."""
        try:
            doc = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return {}
        passed = doc.get("passed") if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None
        if not isinstance(passed, dict):
            return {}
        return {str(k): float(t) for k, t in passed.items() if isinstance(t, int | float) and not isinstance(t, bool)}
