"""What `ckptvault restore` imports before its first byte (issue [W] item 3; docs/performance.md, "Where a
command's time goes"): the command run in a fresh interpreter, without a Prefect API, on an in-memory
store holding one committed save, stopped at its first download: by then it has imported the config,
the store and the catalog it needs, and none of what only comes after the bytes (the layouts' modules,
slack-sdk) nor Prefect."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ckptvault.catalog import Catalog
from ckptvault.catalog.events import verified
from ckptvault.config import SourceConfig
from ckptvault.ingest import steps
from ckptvault.store.memory import MemoryStore
from ckptvault_cli.synthetic import write_checkpoint

REPO = Path(__file__).resolve().parents[2]

# Loads the objects the test wrote into an in-memory store, hands it to the command in place of the
# S3 adapter, and prints which of the modules asked for are imported when the first download starts.
_CHILD = """
import json, os, sys, threading
from pathlib import Path

import ckptvault.store
from ckptvault.store.memory import MemoryStore

dump, asked = Path(sys.argv[1]), sys.argv[2].split(",")
store = MemoryStore("ckpts")
for p in sorted(dump.rglob("*")):
    if p.is_file():
        store.put_bytes(p.relative_to(dump).as_posix(), p.read_bytes())
ckptvault.store.open_store = lambda cfg: store


first = threading.Lock()


def first_byte(*a, **k):
    first.acquire()  # the first download only; the others wait for the exit
    print(json.dumps(sorted(m for m in asked if m in sys.modules)), flush=True)
    os._exit(0)


MemoryStore.download_file = MemoryStore.download_range = first_byte
from ckptvault_cli.main import main

main(sys.argv[3:])
sys.exit("no download started")
"""

AFTER_THE_BYTES = ("ckptvault.formats", "slack_sdk", "prefect", "ckptvault_prefect.flows", "pandas", "torch")
BEFORE = ("ckptvault.config", "ckptvault.catalog", "ckptvault.restore.complete")


def test_a_restore_imports_nothing_of_what_follows_its_first_byte_before_it(tmp_path: Path) -> None:
    store = MemoryStore("ckpts")
    write_checkpoint(tmp_path / "hot", "hf", 100, 2**20, shards=2, seed=1)
    [found] = steps.find_checkpoints(SourceConfig(run="r", path=tmp_path / "hot", format="hf", settle_seconds=0)).found
    entries = [steps.upload_one(store, j, found) for j in steps.plan_upload(store, "vault", found)]
    manifest = steps.commit_manifest(store, "vault", found, entries)
    Catalog(store, "vault").append([verified(manifest)])
    dump = tmp_path / "dump"
    for o in store.list(""):
        (dump / o.key).parent.mkdir(parents=True, exist_ok=True)
        (dump / o.key).write_bytes(store.get_bytes(o.key))
    cfg = tmp_path / "c.toml"
    cfg.write_text("[store]\nbucket = 'ckpts'\nprefix = 'vault'\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "CKPTVAULT_CONFIG")}
    args = ["--config", str(cfg), "restore", "r", "--step", "100", "--dest", str(tmp_path / "back")]
    asked = ",".join((*AFTER_THE_BYTES, *BEFORE))
    p = subprocess.run([sys.executable, "-c", _CHILD, str(dump), asked, *args], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    imported = json.loads(p.stdout.strip().splitlines()[-1])
    assert imported == sorted(BEFORE)  # at its first download: what it needs, nothing of what follows it
    assert not (tmp_path / "back").exists()
