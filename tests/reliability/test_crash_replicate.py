"""Crash test of the replicate pass (docs/replicas.md, "A crash mid-copy"; docs/FORMAT.md, "Replicas"):
`ckptvault replicate` SIGKILLed at stratified, seeded moments of its copy, then run again. Both stores
are buckets of one SeaweedFS: the primary, and a replica with Object Lock (`[lock]` governance, one
day), reached through a proxy that slows each request down. Three saves: two uncompressed (one of a
single-PUT and a two-part multipart object, one of seven small objects) and one compressed
(shuffle-zstd frames, always a multipart object). Each kill copies into its own replica (its
own name and prefix, so one primary catalog serves all), and then, checked straight on the server
(never through the code under test):

- at the kill, every manifest on the replica names only objects that are there, each of the manifest's
  size and with the CRC32C it records (computed here from the bytes read back), each locked at least
  until the manifest's own date;
- the rerun exits 0, and the replica then holds every object and manifest of the primary's saves byte
  for byte, key for key, each written once (one version: what the killed pass completed is kept, not
  sent again);
- one `replicated` event per save for that replica, recorded by the killed pass or the rerun (a save the
  killed pass committed without recording it is recorded by the rerun), and every object of the save
  locked at least until the date the event records (the rerun raises what the killed pass copied);
- the multipart uploads left open are only the killed pass's, the replica's bucket has the one-day
  abort rule for the replica's prefix that ends them, and the abort (what that rule does a day later)
  leaves none and loses nothing.

A kill moment is a request, not a time: a calibration pass counts the requests a whole pass sends to
the replica, one kill is drawn (seeded) in each of 10 equal slices of them, and the pass is killed as
its n-th request reaches the proxy, while the proxy holds it: the same moment on an idle machine and on
a loaded one. The rerun locks for a day longer than the killed pass (as a rerun a day later would), so
that what it keeps must really be raised to its date.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import crc32c
import pytest

from ckptvault.catalog import Catalog
from ckptvault.checkpoint.manifest import MANIFEST_NAME
from ckptvault.config import load_config
from ckptvault.objectlock.probe_cache import ProbeCache
from ckptvault.objectlock.save_lock import lock_problem
from ckptvault.store import open_store
from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.faultproxy import FaultProxy, FaultRates
from tests.reliability.conftest import (
    CRASH_SEED,
    MiB,
    all_keys,
    assert_abort_rules,
    cli_cmd,
    incomplete_uploads,
    manifest_keys,
    prewarmed,
    stratified_offsets,
)
from tests.reliability.test_crash_lock import _drained, _versions
from tests.servers import S3Endpoint

# One kill in each of 10 equal slices of the calibrated copy window (the "10 random moments").
# CKPTVAULT_REPLICATE_KILL_POINTS=N asks for more (or fewer).
KILLS = int(os.environ.get("CKPTVAULT_REPLICATE_KILL_POINTS", "10"))
SAVES = (("r", 100), ("r", 200), ("z", 300))  # run z compressed
DAYS = 1
LATENCY = 0.02  # seconds the proxy adds to each request to the replica
# what `replicate` imports once it runs: loaded before "go", so the kills fall in the copy itself
PRELOAD = "boto3, ckptvault.replication, ckptvault.catalog, ckptvault.tiering.replica_selection, ckptvault.store.s3"


def _config(
    path: Path,
    s3: S3Endpoint,
    primary: str,
    replica: str,
    name: str,
    roots: dict[str, Path],
    remote: str = "",
    days: int = DAYS,
) -> Path:
    """The primary (prefix t; run z compressed), `[lock]` for `days` and one replica `name` under prefix
    `name`, reached at `remote` (default: where the primary is); 5 MiB parts, one request at a time per
    object (the kills land between and inside parts)."""
    store = f'region = "{s3.region}"\npart_size_mb = 5\nmax_concurrency = 1\n'
    text = f'[store]\nbucket = "{primary}"\nprefix = "t"\nendpoint_url = "{s3.url}"\n{store}\n'
    for run, root in roots.items():
        text += f'[[sources]]\nrun = "{run}"\npath = "{root}"\nformat = "deepspeed"\nsettle_seconds = 0\n'
        text += 'compression = "auto"\n\n' if run == "z" else "\n"
    text += f'[validation]\nenabled = false\n\n[lock]\nmode = "governance"\ndays = {days}\n\n'
    text += f'[[replicas]]\nname = "{name}"\nbucket = "{replica}"\nprefix = "{name}"\n'
    text += f'endpoint_url = "{remote or s3.url}"\n{store}'
    path.write_text(text)
    return path


def _crc(data: bytes) -> str:
    return base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()


def _objects(client: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    """Every object of the saves under `prefix` (runs r and z), by key below it."""
    keys = [k for run in ("r", "z") for k in all_keys(client, bucket, f"{prefix}/{run}/")]
    return {k[len(prefix) + 1 :]: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def _lock(client: Any, bucket: str, key: str) -> tuple[str | None, float]:
    h = client.head_object(Bucket=bucket, Key=key)
    until = h.get("ObjectLockRetainUntilDate")
    return h.get("ObjectLockMode"), until.timestamp() if until is not None else 0.0


def _check_manifest(client: Any, bucket: str, key: str) -> int:
    """A manifest on the replica names only objects that are there, whole (size and CRC32C of the bytes
    read back are the manifest's: the stored ones for a compressed file), each locked at least until the
    manifest's own date. Returns how many objects it names."""
    m = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    base = key[: -len(MANIFEST_NAME)]
    _, committed_until = _lock(client, bucket, key)
    for f in m["files"]:
        compressed = f.get("codec", "none") != "none"
        body = client.get_object(Bucket=bucket, Key=base + f["path"])["Body"].read()
        assert len(body) == (f["stored_size"] if compressed else f["size"]), f"{base}{f['path']}: size"
        assert _crc(body) == (f["stored_crc32c"] if compressed else f["crc32c"]), f"{base}{f['path']}: CRC32C"
        mode, until = _lock(client, bucket, base + f["path"])
        assert mode == "GOVERNANCE" and until >= committed_until, (base + f["path"], mode, until, committed_until)
    return len(m["files"])


def _copy_window(proc: Any, proxy: FaultProxy, client: Any, bucket: str, prefix: str) -> tuple[int, int]:
    """Run a prewarmed replicate to the end, polling the replica: how many requests it had sent
    through the proxy when its first object or multipart upload appeared, and in all."""
    assert proc.stdout.readline() == b"ready\n", "the prewarmed CLI did not start"
    base = proxy.total_requests
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    first = None
    while proc.poll() is None:
        copying = incomplete_uploads(client, bucket, prefix + "/r/") or all_keys(client, bucket, prefix + "/r/")
        if first is None and copying:  # the saves sort r before z: the first copy is under r/
            first = proxy.total_requests - base
        time.sleep(0.02)
    assert proc.returncode == 0 and first is not None, (proc.returncode, first)
    return first, proxy.total_requests - base


def _go_and_kill_at(proc: Any, proxy: FaultProxy, n: int) -> bool:
    """Let the prewarmed replicate run; SIGKILL it as its n-th request reaches the proxy (which holds
    each request LATENCY before sending it on: the kill lands while it is in flight). A moment counted
    in requests, not seconds, is the same moment on a loaded machine. Returns whether it was killed
    (False: it finished first)."""
    assert proc.stdout.readline() == b"ready\n", "the prewarmed CLI did not start"
    base = proxy.total_requests
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    try:
        while proc.poll() is None:
            if proxy.total_requests - base >= n:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.002)
        assert proc.returncode == 0, f"exit {proc.returncode}"
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_replicate_killed_at_stratified_random_points_then_rerun(
    seaweedfs: S3Endpoint,
    locked_bucket: Any,
    tmp_path: Path,
    s3_env: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    t_start = time.monotonic()
    s3_env(seaweedfs)
    monkeypatch.setenv("CKPTVAULT_CACHE_DIR", str(tmp_path / "cache"))  # this test's, its CLIs' too
    client = seaweedfs.client()
    # the primary is locked too: `[lock]` is one setting for every store ckptvault writes
    primary, replica = locked_bucket(seaweedfs), locked_bucket(seaweedfs)
    roots = {run: tmp_path / "hot" / run for run in ("r", "z")}
    # The replica is reached through the proxy, LATENCY added to every request: a slow link to another
    # site, so that the copy is long enough for the kills to land all over it.
    env = {**os.environ, **seaweedfs.env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proxy = FaultProxy(seaweedfs.url, FaultRates(latency=1.0, latency_s=LATENCY)).start()
    calib = _config(tmp_path / "calib.toml", seaweedfs, primary, replica, "calib", roots, proxy.url)
    names = [f"k{i:02d}" for i in range(KILLS)]
    cfgs = [_config(tmp_path / f"{n}.toml", seaweedfs, primary, replica, n, roots, proxy.url) for n in names]
    # the first two CLIs start up (imports) while the primary is filled
    calib_cli, warm = (prewarmed(cli_cmd(c, "replicate"), env, PRELOAD) for c in (calib, cfgs[0]))
    # steps 100 and 300: a 4 MiB single PUT and an 8 MiB two-part object (5 MiB parts); step 200 seven
    # small objects, more than a pass copies at once: a kill mid-save finds some done, for the rerun to keep
    for run, step in SAVES:
        write_checkpoint(roots[run], "deepspeed", step, 12 * MiB, shards=6 if step == 200 else 1, seed=step)
    direct = _config(tmp_path / "ingest.toml", seaweedfs, primary, replica, "calib", roots)
    assert main(["--config", str(direct), "ingest"]) == 0
    # a replica keeps no block-checksum sidecar (docs/FORMAT.md, "Block checksums": what the manifest names)
    src = {k: v for k, v in _objects(client, primary, "t").items() if not k.endswith("/_BLOCKS.json")}
    z = json.loads(src["z/step-0000000300/_MANIFEST.json"])
    assert {f.get("codec") for f in z["files"]} == {"shuffle-zstd"}, z["files"]  # the frames are exercised
    assert max(len(b) for b in src.values()) > 5 * MiB  # multipart objects too

    # The replica's Object Lock enforcement probe passes once and is cached for its endpoint and bucket
    # (ckptvault/objectlock/probe_cache.py): made here, so that no pass, the calibration's included, spends
    # the time of the copy the kills are timed by on it.
    cfg = load_config(str(calib))
    assert lock_problem(cfg.lock, open_store(cfg.replicas[0]), ProbeCache.of(cfg.replicas[0])) is None
    first, last = _copy_window(calib_cli, proxy, client, replica, "calib")
    _, killed_date = _lock(client, replica, "calib/r/step-0000000100/" + MANIFEST_NAME)  # a killed pass's date
    # a kill point is the request the pass is killed at, one in each of KILLS slices of the copy's requests
    rng = random.Random(CRASH_SEED + 44)
    kill_at = [int(x) for x in stratified_offsets(rng, max(1, first - 3), last + 1, KILLS)]

    seen = Counter[str]()
    for i, (name, at) in enumerate(zip(names, kill_at, strict=True)):
        killed = _go_and_kill_at(warm, proxy, at)
        if i + 1 < KILLS:  # starts up while this kill point is checked
            warm = prewarmed(cli_cmd(cfgs[i + 1], "replicate"), env, PRELOAD)
        # The requests the dead process had sent reach the server first: what is read now is what the
        # rerun finds.
        _drained(proxy)
        committed = manifest_keys(client, replica, name + "/")
        for key in committed:  # a manifest only over whole, verified, locked objects
            seen["objects verified under a manifest at the kill"] += _check_manifest(client, replica, key)
        open_at_kill = {(u["Key"], u["UploadId"]) for u in incomplete_uploads(client, replica, name + "/")}
        seen[f"killed={killed}, {len(committed)} of {len(SAVES)} committed"] += 1
        seen["uploads open at the kill"] += len(open_at_kill)

        # The rerun, in this process (no start-up), the replica reached directly. It locks for a day
        # longer, as a rerun a day later would: its date is later than the killed pass's, so the
        # objects it keeps must be raised to it (within one day both would round to the same midnight).
        rerun_cfg = _config(tmp_path / f"{name}-rerun.toml", seaweedfs, primary, replica, name, roots, days=DAYS + 1)
        capsys.readouterr()
        assert main(["--config", str(rerun_cfg), "replicate", "--json"]) == 0, f"kill {i} at request {at}"
        (done,) = json.loads(capsys.readouterr().out)["replicas"]
        assert done["failed"] == {} and len(done["copied"]) + done["present"] == len(SAVES), done
        seen["objects kept by the rerun"] += sum(s["kept"] for s in done["copied"])
        seen["saves committed by the kill, recorded by the rerun"] += len(done["recorded"])

        # The replica holds the primary's saves, byte for byte, key for key, each object written once.
        assert _objects(client, replica, name) == src, f"kill {i} at request {at}: the replica differs"
        twice = {k: len(v) for k, v in _versions(client, replica, name + "/").items() if len(v) != 1}
        assert not twice, f"kill {i} at request {at}: written more than once: {twice}"

        # One replicated event per save for this replica, and every object locked at least that long.
        catalog = Catalog(open_store(load_config(str(rerun_cfg)).store), "t")
        got = [(e, json.loads(e.detail)) for run in ("r", "z") for e in catalog.events(run) if e.event == "replicated"]
        mine = [(e, d) for e, d in got if d["store"] == name]
        assert Counter((e.run, e.step) for e, _ in mine) == dict.fromkeys(SAVES, 1), f"kill {i}: {mine}"
        for _, d in mine:
            # the rerun's date where the rerun committed the save, the killed pass's where it did
            seen[f"saves dated {'a day later' if d['retain_until'] > killed_date else 'by the killed pass'}"] += 1
            base = d["key"][: -len(MANIFEST_NAME)]
            for key in all_keys(client, replica, base):
                mode, until = _lock(client, replica, key)
                assert mode == "GOVERNANCE" and until >= d["retain_until"], (i, key, mode, until, d["retain_until"])

        # Open uploads: only the killed pass's; the abort the bucket's rule makes leaves none, loses nothing.
        left = {(u["Key"], u["UploadId"]) for u in incomplete_uploads(client, replica, name + "/")}
        assert left <= open_at_kill, f"kill {i}: the rerun left uploads open: {left - open_at_kill}"
        seen["uploads open after the rerun"] += len(left)
        replica_store = open_store(load_config(str(rerun_cfg)).replicas[0])
        assert replica_store.abort_multipart_uploads(name + "/") == len(left)
        assert incomplete_uploads(client, replica, name + "/") == []
        assert _objects(client, replica, name) == src

    proxy.stop()
    assert_abort_rules(client, replica, names)
    print(
        f"\n[crash replicate, seaweedfs] a pass sends {last} requests to the replica, the first copy at "
        f"request {first}; SIGKILLs at requests {kill_at}; "
        f"{json.dumps(dict(seen), sort_keys=True)}; {time.monotonic() - t_start:.0f} s in all"
    )
