"""Prefect tasks every flow uses: configuration, the store, the catalog, manifests, artifacts."""

from __future__ import annotations

from collections.abc import Sequence

from ckptvault.catalog import COMPACT_SECONDS, Catalog, CheckpointState, Event
from ckptvault.command import memo
from ckptvault.config import Config
from ckptvault.observe import ledger
from ckptvault.restore.plan import load_manifest
from ckptvault.store import ObjectStore
from ckptvault_prefect.tasks.retry import io_task, local_task


@local_task("load-config")
def load_config_task(config_path: str | None) -> Config:
    # once per command: the command line read it a moment ago in this process (ckptvault/command/memo.py)
    return memo.load_config(config_path)


@io_task("open-store")
def open_store_task(cfg: Config) -> ObjectStore:
    return memo.checked_store(cfg.store, retried=True)  # once per command, as the config


@io_task("record-events")
def record_task(catalog: Catalog, events: Sequence[Event]) -> str | None:
    return catalog.append(events)


@io_task("catalog-current")
def current_states_task(catalog: Catalog, run: str | None = None) -> list[CheckpointState]:
    return catalog.current(run)


@io_task("catalog-events")
def run_events_task(catalog: Catalog, run: str) -> list[Event]:
    return catalog.events(run)


@io_task("compact-catalog")
def compact_catalog_task(
    catalog: Catalog, older_than: float, runs: Sequence[str] | None = None, *, deletes: bool = True
) -> int:
    return catalog.compact(older_than, runs=runs, max_seconds=COMPACT_SECONDS, deletes=deletes)


load_manifest_task = io_task("load-manifest")(load_manifest)
# a flow's end in the metrics' ledger (its counts, its success): never fails the flow
ledger_task = io_task("record-ledger")(ledger.note_ledger)


@local_task("publish-markdown", record_only=True)
def publish_markdown_task(key: str, markdown: str, description: str) -> None:
    from prefect.artifacts import create_markdown_artifact  # record_only: never called in direct mode

    create_markdown_artifact(key=key, markdown=markdown, description=description)
