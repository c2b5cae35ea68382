"""The catalog: an append-only Parquet event log in the bucket, beside the data it describes
(docs/FORMAT.md, "The catalog"), partitioned by run, with a snapshot of each run's folded state.

    model       Event, CheckpointState, the event kinds and lifecycle states
    codec       the event file's Parquet schema, encoding and decoding, the identity columns
    fold        events -> current state, one at a time (the definition) and column at a time (pyarrow)
    layout      object keys: partitions, the flat layout before them, what a listing holds
    snapshot    a partition's folded state as one Parquet object
    combined    every run's state as one Parquet object, with what each run's rows cover
    reading     `CatalogReader`: list and read the catalog's objects, its events and current state
    eventlog    `Catalog`: the reader, with append and the passes below (each takes a CatalogReader)
    compaction  merging event files, writing snapshots, migrating the flat layout, setting aside
    rebuild     the catalog from the manifests alone, the source of truth
    table_view  `ls --json` from the snapshots' Arrow columns, no CheckpointState per save
    summary     the fleet's figures for the metrics (ckptvault/observe/metrics.py), from the same columns

Only this package imports pyarrow.
"""

# first: it answers pyarrow's pandas question before any module below converts a list (see _arrow)
from ckptvault.catalog import _arrow  # noqa: F401
from ckptvault.catalog.codec import SCHEMA_TAG, decode_events, encode_events
from ckptvault.catalog.compaction import COMPACT_SECONDS, MIGRATE_FILES
from ckptvault.catalog.eventlog import Catalog
from ckptvault.catalog.fold import fold
from ckptvault.catalog.layout import CATALOG_DIR, UNREADABLE_DIR, run_partition
from ckptvault.catalog.model import (
    EVENT_KINDS,
    LIFECYCLE_STATES,
    CatalogError,
    CheckpointState,
    Event,
    ReplicaCopy,
    newest_saves,
)
from ckptvault.catalog.snapshot import SNAPSHOT_TAG

__all__ = [
    "CATALOG_DIR",
    "COMPACT_SECONDS",
    "EVENT_KINDS",
    "LIFECYCLE_STATES",
    "MIGRATE_FILES",
    "SCHEMA_TAG",
    "SNAPSHOT_TAG",
    "UNREADABLE_DIR",
    "Catalog",
    "CatalogError",
    "CheckpointState",
    "Event",
    "ReplicaCopy",
    "decode_events",
    "encode_events",
    "fold",
    "newest_saves",
    "run_partition",
]
