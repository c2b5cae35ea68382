"""The replica wing: copies committed saves from the primary store to a `[[replicas]]` store
(docs/FORMAT.md, "Replicas"). It imports no other wing: which saves a replica takes is decided by
ckptvault.tiering.replica_selection, and the caller hands the chosen saves in. `ckptvault replicate`
and the replicate flow make the same calls: select_replicas, open_replica, wanted, replicate, then
ReplicateResult for what to print, publish and alert."""

from ckptvault.replication.replicas import ReplicaUnusable, open_replica, select_replicas
from ckptvault.replication.replicate import FailedSave, ReplicaPass, ReplicatedSave, replicate
from ckptvault.replication.result import ReplicateIncomplete, ReplicateResult

__all__ = [
    "FailedSave",
    "ReplicaPass",
    "ReplicaUnusable",
    "ReplicateIncomplete",
    "ReplicateResult",
    "ReplicatedSave",
    "open_replica",
    "replicate",
    "select_replicas",
]
