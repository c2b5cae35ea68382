"""Prefect tasks of the scrub flow: one library call each. The scrub itself is one task run: its saves
are checked (and repaired) one after another, each recorded in the catalog as it is done, so a retry
after a transient store error scrubs the same selection again and records it again (a second
`scrubbed` event of the same save: the rotation reads the latest)."""

from __future__ import annotations

from collections.abc import Sequence

from ckptvault.catalog import Catalog, CheckpointState, Event
from ckptvault.config import LockConfig
from ckptvault.replication.scrub import Copy
from ckptvault.replication.scrub_pass import ScrubReport, run_scrub
from ckptvault_prefect.tasks.retry import io_task


@io_task("catalog-events-all")
def all_events_task(catalog: Catalog) -> list[Event]:
    return catalog.events()


@io_task("scrub")
def scrub_task(
    copies: Sequence[Copy],
    checked: Sequence[str],
    states: Sequence[CheckpointState],
    past_events: Sequence[Event],
    sample: int | None,
    repair: bool,
    lock: LockConfig,
    catalog: Catalog,
) -> ScrubReport:
    return run_scrub(copies, checked, states, past_events, sample=sample, repair=repair, lock=lock, catalog=catalog)
