"""ckptvault's data path alone, without the CLI, Prefect or the quality gates: the library steps the
flows call, with the same file-level concurrency as the flows (2 files at a time for ingest, 4 for
restore). Run as a child process by bench/run.py so its CPU time and peak RSS are its own.

    python bench/lib_child.py upload CONFIG STEP [--record]
    python bench/lib_child.py download CONFIG RUN STEP DEST
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ckptvault.catalog import Catalog
from ckptvault.catalog.events import verified as verified_event
from ckptvault.config import load_config
from ckptvault.ingest.steps import commit_manifest, find_checkpoints, plan_upload, upload_one
from ckptvault.restore.plan import load_manifest, plan_objects
from ckptvault.restore.steps import download_one
from ckptvault.store import open_store

INGEST_FILES_AT_ONCE = 2  # ckptvault_prefect/flows/ingest.py: ThreadPoolTaskRunner(max_workers=2)
RESTORE_FILES_AT_ONCE = 4  # ckptvault_prefect/flows/restore.py: ThreadPoolTaskRunner(max_workers=4)


def upload(config: str, step: int, record: bool) -> None:
    cfg = load_config(config)
    store = open_store(cfg.store)
    prefix = cfg.store.prefix
    source = cfg.sources[0]
    found = next(f for f in find_checkpoints(source).found if f.step == step)
    jobs = plan_upload(store, prefix, found)
    with ThreadPoolExecutor(INGEST_FILES_AT_ONCE) as pool:
        entries = list(pool.map(lambda j: upload_one(store, j, found, sha256=cfg.sha256), jobs))
    manifest = commit_manifest(store, prefix, found, entries)
    if record:  # so that `ckptvault restore` (which resolves steps through the catalog) finds it
        Catalog(store, prefix).append([verified_event(manifest)])
    print(f"uploaded {len(entries)} files, {manifest.total_bytes} bytes")


def download(config: str, run: str, step: int, dest: Path) -> None:
    cfg = load_config(config)
    store = open_store(cfg.store)
    manifest = load_manifest(store, cfg.store.prefix, run, step)
    plans = plan_objects(store, cfg.store.prefix, manifest)
    dest.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(RESTORE_FILES_AT_ONCE) as pool:
        done = list(pool.map(lambda p: download_one(store, p, dest, manifest), plans))
    print(f"downloaded {len(done)} files")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "upload":
        upload(sys.argv[2], int(sys.argv[3]), "--record" in sys.argv[4:])
    elif cmd == "download":
        download(sys.argv[2], sys.argv[3], int(sys.argv[4]), Path(sys.argv[5]))
    else:
        raise SystemExit(__doc__)
