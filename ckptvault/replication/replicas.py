"""Which `[[replicas]]` a replicate run copies to, and each one's store, opened and checked: the part of
a run before any copy, shared by `ckptvault replicate` and the replicate flow so both choose and
refuse alike. Every problem names the replica."""

from __future__ import annotations

from collections.abc import Sequence

from ckptvault.config import LockConfig, ReplicaConfig
from ckptvault.errors import CkptvaultError
from ckptvault.objectlock.probe_cache import ProbeCache
from ckptvault.objectlock.save_lock import bucket_lock, lock_problem
from ckptvault.replication.retention import retention_problem
from ckptvault.store import ObjectStore, StoreError, TransientStoreError, open_store


class ReplicaUnusable(CkptvaultError):
    """A replica that cannot be copied to as configured (no such entry, an unknown credentials profile,
    a missing bucket, refused credentials, a bucket without the Object Lock `[lock]` needs). The message
    names the replica and the fix; the command line makes it exit 2."""


def named(replica: str, message: str) -> str:
    """`message`, prefixed with the replica's name unless it says it already."""
    return message if f"replica {replica}" in message else f"replica {replica}: {message}"


def select_replicas(replicas: Sequence[ReplicaConfig], name: str | None) -> list[ReplicaConfig]:
    """The replicas a run copies to: the one named `name`, or every one (none configured: an empty
    list, which the command refuses and a scheduled flow run takes as nothing to do)."""
    if name is None:
        return list(replicas)
    chosen = [r for r in replicas if r.name == name]
    if not chosen:
        known = ", ".join(r.name for r in replicas) or "none"
        raise ReplicaUnusable(
            f"no [[replicas]] entry is named {name!r} (configured: {known}). Add one to the configuration: "
            "docs/configuration.md"
        )
    return chosen


def open_replica(replica: ReplicaConfig, lock: LockConfig) -> ObjectStore:
    """The replica's store, checked as the command line's preflight checks `[store]`: the bucket is
    there and the credentials are accepted, and with `[lock]` on the bucket has Object Lock and the
    server enforces it. A transient error that outlived the store's retries is raised as it is; any
    other is ReplicaUnusable naming the replica."""
    try:
        store = open_store(replica)
        store.check_bucket()
        problem = lock_problem(lock, store, ProbeCache.of(replica))
        if not problem and replica.expire_after_days is not None:
            problem = retention_problem(replica, bucket_lock(store))
    except TransientStoreError:
        raise
    except StoreError as e:
        raise ReplicaUnusable(named(replica.name, str(e))) from None
    if problem:
        raise ReplicaUnusable(named(replica.name, problem))
    return store
