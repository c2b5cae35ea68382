"""The catalog as a reader and writer: `Catalog.append` writes one event file per run; `events` and
`current` (reading.py) read a partition's newest snapshot and the event files since, fetched concurrently.

Two writers never lose each other's events because they never write the same key. Every event has an
identity, (origin file key, row index), kept as hidden columns when compaction merges files and listed in
a snapshot for what it folded. Readers drop duplicate identities, so a reader that lists a merged file and
its not-yet-deleted sources, a compaction that crashed between write and delete, or two compactions
racing each other all read as if the merge were atomic (docs/FORMAT.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from ckptvault.catalog import compaction, stats
from ckptvault.catalog.codec import encode_events
from ckptvault.catalog.model import Event
from ckptvault.catalog.reading import CatalogReader


class Catalog(CatalogReader):
    """The catalog: what `CatalogReader` reads, with the writes (`append`, compaction) and the passes
    over the whole of it (stats, the rebuild from manifests)."""

    def append(self, events: Sequence[Event]) -> str | None:
        """Write `events` as one new object per run, in that run's partition; returns the key of the
        first (None when there is nothing to write)."""
        if not events:
            return None
        by_run: dict[str, list[Event]] = {}
        for e in events:
            by_run.setdefault(e.run, []).append(e)
        ns = time.time_ns()
        first = None
        for run in sorted(by_run):
            key = self._new_key(run, time_ns=ns)
            # The key is unique by construction; if_none_match makes a (practically impossible)
            # collision an error instead of a silent overwrite of someone else's events.
            self.store.put_bytes(
                key, encode_events(by_run[run]), if_none_match=True, content_type="application/vnd.apache.parquet"
            )
            first = first or key
        return first

    def compact(
        self,
        older_than: float,
        *,
        runs: Iterable[str] | None = None,
        max_partitions: int | None = None,
        max_seconds: float | None = None,
        deletes: bool = True,
        progress: Callable[[int], Callable[[int], None]] | None = None,
    ) -> int:
        """See `ckptvault.catalog.compaction.compact`."""
        return compaction.compact(
            self, older_than, runs=runs, max_partitions=max_partitions, max_seconds=max_seconds, deletes=deletes,
            progress=progress,
        )  # fmt: skip

    def compact_now(
        self,
        runs: Iterable[str] | None = None,
        progress: Callable[[int], Callable[[int], None]] | None = None,
        workers: int = compaction._COMPACTORS,
        deletes: bool = True,
    ) -> compaction.Compacted:
        """See `ckptvault.catalog.compaction.compact_now`."""
        return compaction.compact_now(self, runs=runs, progress=progress, workers=workers, deletes=deletes)

    def rebuild_from_manifests(
        self,
        progress: Callable[[int], Callable[[int], None]] | None = None,
        run: str | None = None,
        lock_heads: bool = True,
    ) -> list[Event]:
        """See `ckptvault.catalog.rebuild.rebuild_from_manifests`."""
        from ckptvault.catalog import rebuild  # with ckptvault.checkpoint.manifest: not on a listing's start-up

        return rebuild.rebuild_from_manifests(self, progress, run, lock_heads)

    def stats(self) -> stats.CatalogStats:
        """See `ckptvault.catalog.stats.stats`."""
        return stats.stats(self)
