"""What one command reads once: its config, and each store's bucket probe and lifecycle check.

With a Prefect API, `ckptvault ingest` and `restore` check the config and the bucket themselves (bad
input is exit 2 before a flow run exists), then run a flow that, being also a deployment that must
stand alone, reads the config and probes the bucket again, in the same process, a moment later. Inside
`command()` (the command line wraps each command in it) those reads are remembered for the rest of the
process's command: the config by its file's path, inode, size and modification time (an edited file is
read again), a checked store and the bucket's abort-incomplete-uploads rule by the store's settings
(endpoint, bucket, prefix, region ...) and the credentials the environment gives (another identity is
probed again), for at most MAX_AGE_S: `follow`, one command for days, probes again every few minutes,
as its ingests did before each. Outside it (a deployment's flow run in a worker, a flow called from
Python, the tests' flows) nothing is remembered: every read is made, as before. Only successes are
remembered: a probe that failed is made again by whoever asks next.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckptvault.config import Config, StoreConfig
    from ckptvault.store import ObjectStore

_lock = threading.Lock()
_depth = 0
_configs: dict[tuple[Any, ...], Config] = {}
_stores: dict[str, tuple[float, ObjectStore]] = {}
_rules: dict[tuple[str, int], float] = {}

# How long a bucket probe or lifecycle check is taken as still true within one command
MAX_AGE_S = 600.0


@contextmanager
def command() -> Iterator[None]:
    """Remember within: one command of this process (nested: the outermost's end forgets)."""
    global _depth
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _configs.clear()
                _stores.clear()
                _rules.clear()


def active() -> bool:
    return _depth > 0


def load_config(cli_value: str | None) -> Config:
    """`ckptvault.config.load_config`, parsed once per command for an unchanged file."""
    from ckptvault import config

    if not active():
        return config.load_config(cli_value)
    path = config.resolve_config_path(cli_value)
    try:
        st = os.stat(path)
    except OSError:
        return config.load_config(cli_value)  # its own error names the file and the fix
    key = (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _lock:
        hit = _configs.get(key)
    if hit is not None:
        return hit
    cfg = config.load_config(cli_value)
    with _lock:
        if active():
            _configs[key] = cfg
    return cfg


def identity(cfg: StoreConfig) -> str:
    """Which store, as whom: the store's settings (its type too: [store] or a replica) and every AWS_*
    variable of the environment, where the credentials chain starts (the secrets hashed, never kept)."""
    aws = sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))
    text = f"{type(cfg).__name__} {cfg.model_dump_json()} {aws!r}"
    return hashlib.sha256(text.encode()).hexdigest()


def checked_store(cfg: StoreConfig) -> ObjectStore:
    """`open_store(cfg)` with its bucket checked (`check_bucket`: StoreError when missing or denied),
    once per command for the same store and credentials."""
    from ckptvault.store import open_store

    key = identity(cfg) if active() else ""
    if key:
        with _lock:
            at, hit = _stores.get(key, (0.0, None))
        if hit is not None and _fresh(at):
            return hit
    store = open_store(cfg)
    store.check_bucket()
    if key:
        with _lock:
            if active():
                _stores[key] = (time.monotonic(), store)
    return store


def ensure_abort_rule(store: ObjectStore, cfg: StoreConfig, days: int = 1) -> bool:
    """`store.ensure_abort_incomplete_mpu_rule(days)` (a lifecycle read, and a write when the rule is
    missing), once per command for the same store and credentials: True when it wrote the rule."""
    key = (identity(cfg), days) if active() else None
    if key is not None:
        with _lock:
            at = _rules.get(key)
        if at is not None and _fresh(at):
            return False
    wrote = store.ensure_abort_incomplete_mpu_rule(days)
    if key is not None:
        with _lock:
            if active():
                _rules[key] = time.monotonic()
    return wrote


def _fresh(at: float) -> bool:
    return 0.0 <= time.monotonic() - at < MAX_AGE_S
