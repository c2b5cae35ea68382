"""The replica wing: copies committed saves from the primary store to a `[[replicas]]` store
(docs/FORMAT.md, "Replicas"). It imports no other wing: which saves a replica takes is decided by
ckptvault.tiering.replica_selection, and the caller hands the chosen saves in."""

from ckptvault.replication.replicate import ReplicaPass, ReplicatedSave, replicate

__all__ = ["ReplicaPass", "ReplicatedSave", "replicate"]
