"""What one command reads once: its config, each store's bucket probe and lifecycle check, and the
reads a restore decides from (its run's catalog history, its survey of the copies).

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

`remembered` is the same for a read of data the command line makes to decide and its flow makes again
~0.2 s later to decide the same thing: `restore`'s run history (`from_manifests.read_run_once`) and its
survey of the copies (`copies.survey_once`). The key names what was read and from which store object
(`Same`: the object itself, not its settings; the ObjectStore port exposes none, and within a command
`checked_store` hands the command line and its flow the very same object for the same settings and
credentials, one bucket through one client), for at most READ_MAX_AGE_S (60 s). That is safe because
the command line has already decided from that snapshot (the step and save it resolved are passed to
the flow explicitly), so the flow deciding from the same snapshot is consistent, not stale; a later
command, or a read more than a minute on, reads the store again. A read started in one command is
never remembered into the next (a survey thread outliving its command's exit 2).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    from ckptvault.config import Config, StoreConfig
    from ckptvault.store import ObjectStore

_lock = threading.Lock()
_depth = 0
_configs: dict[tuple[Any, ...], Config] = {}
_stores: dict[str, tuple[float, ObjectStore]] = {}
_rules: dict[tuple[str, int], float] = {}
_reads: dict[tuple[Hashable, ...], tuple[float, object]] = {}
_generation = 0  # which outermost command: a read started in one is not remembered into another

# How long a bucket probe or lifecycle check is taken as still true within one command
MAX_AGE_S = 600.0
# How long a read of data (`remembered`) is: the command line's read and its flow's are ~0.2 s apart
READ_MAX_AGE_S = 60.0

T = TypeVar("T")
_MISSING = object()


@contextmanager
def command() -> Iterator[None]:
    """Remember within: one command of this process (nested: the outermost's end forgets)."""
    global _depth, _generation
    with _lock:
        _depth += 1
        if _depth == 1:
            _generation += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _configs.clear()
                _stores.clear()
                _rules.clear()
                _reads.clear()


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


def checked_store(cfg: StoreConfig, *, retried: bool = False) -> ObjectStore:
    """`open_store(cfg)` with its bucket checked (`check_bucket`: StoreError when missing or denied),
    once per command for the same store and credentials. The check is one try, so that a dead endpoint
    is reported at once (the command line's preflight) or its copy passed over (a restore's copies);
    `retried`: under the store's retry policy, for a flow's own opening of its store (a step a transient
    error would otherwise fail). The store returned retries its calls either way."""
    from ckptvault.store import open_store
    from ckptvault.store.retrying import unretried

    key = identity(cfg) if active() else ""
    if key:
        with _lock:
            at, hit = _stores.get(key, (0.0, None))
        if hit is not None and _fresh(at, MAX_AGE_S):
            return hit
    store = open_store(cfg)
    (store if retried else unretried(store)).check_bucket()
    if key:
        with _lock:
            if active():
                _stores[key] = (time.monotonic(), store)
    return store


def ensure_abort_rule(store: ObjectStore, cfg: StoreConfig, days: int = 1) -> bool:
    """`store.ensure_abort_incomplete_mpu_rule(days)` (a lifecycle read, and a write when the rule is
    missing), once per command for the same store and credentials: True when it wrote the rule. With
    `[store] lifecycle = "external"` nothing is read or written: the rule is Terraform's (infra/terraform
    declares it with the same ID and content), and the ingest role could not write it anyway."""
    if not cfg.manages_lifecycle:
        return False
    key = (identity(cfg), days) if active() else None
    if key is not None:
        with _lock:
            at = _rules.get(key)
        if at is not None and _fresh(at, MAX_AGE_S):
            return False
    wrote = store.ensure_abort_incomplete_mpu_rule(days)
    if key is not None:
        with _lock:
            if active():
                _rules[key] = time.monotonic()
    return wrote


class Same:
    """An object as part of a key by its identity alone, whatever its own == and hash (None is one too).
    The key holds the object, so its id is not another's while the entry is remembered."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and other.obj is self.obj

    def __repr__(self) -> str:
        return f"Same({type(self.obj).__name__} at {id(self.obj):#x})"


def remembered(key: tuple[Hashable, ...], read: Callable[[], T]) -> T:
    """`read()`, made once per command for the same `key` within READ_MAX_AGE_S of its start; outside a
    command, every time. `key` must name everything the result depends on: what is read (a first item
    naming the kind of read) and from where (the store as `Same(store)`, the prefix, the run ...). A read
    that raised is not remembered: whoever asks next reads again. The caller gets the very object the
    first read returned: it must not change it."""
    if not active():
        return read()
    with _lock:
        at, hit = _reads.get(key, (0.0, _MISSING))
        generation = _generation
    if hit is not _MISSING and _fresh(at, READ_MAX_AGE_S):
        return cast("T", hit)
    started = time.monotonic()  # its age counts from before the read: the snapshot is no newer than that
    got = read()
    with _lock:
        if active() and _generation == generation:
            _reads[key] = (started, got)
    return got


def _fresh(at: float, max_age_s: float) -> bool:
    return 0.0 <= time.monotonic() - at < max_age_s
