"""Prefect tasks of the replicate flow: one library call each. A replica's whole pass is one task run
(`replicate-<replica>`), so each replica shows as its own run with its own retries; a retry reruns the
pass, which keeps what the failed attempt copied (ckptvault/replication/replicate.py)."""

from __future__ import annotations

from collections.abc import Sequence

from ckptvault.catalog import Catalog, CheckpointState
from ckptvault.config import LockConfig, ReplicaConfig
from ckptvault.replication import ReplicaPass, open_replica, replicate
from ckptvault.store import ObjectStore
from ckptvault.tiering.replica_selection import wanted
from ckptvault_prefect.tasks.retry import io_task, local_task

open_replica_task = io_task("open-replica", task_run_name="open-replica-{replica.name}")(open_replica)


wanted_task = local_task("wanted-saves", task_run_name="wanted-{replica.name}")(wanted)


@io_task("replicate", task_run_name="replicate-{replica.name}")
def replicate_task(
    primary: ObjectStore,
    primary_prefix: str,
    replica_store: ObjectStore,
    replica: ReplicaConfig,
    saves: Sequence[CheckpointState],
    lock: LockConfig,
    catalog: Catalog,
) -> ReplicaPass:
    # its own signature, not the library's: Task.map passes every argument by position, and
    # replicate takes the catalog by keyword only
    return replicate(primary, primary_prefix, replica_store, replica, saves, lock, catalog=catalog)
