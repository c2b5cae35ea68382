"""Corruption in the bucket is detected by drill and by restore, each naming the file, and a failed
restore changes nothing at its destination.

One checkpoint per kind of damage, done on the real server behind ckptvault's back: a flipped bit
(same size), a truncated object, a missing object, a manifest whose CRC32C disagrees with the object,
and a manifest whose total_bytes disagrees with its own file list.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from ckptvault.catalog import Catalog
from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault.config import load_config
from ckptvault.restore.drill import DrillFailed
from ckptvault.store import open_store
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config
from tests.reliability.conftest import MiB

MODEL = "mp_rank_00_model_states.pt"
OPT0 = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
OPT1 = "zero_pp_rank_1_mp_rank_00_optim_states.pt"
# step -> (what is damaged, the name the report must contain)
DAMAGE = {
    10: ("bit flip", MODEL),
    20: ("truncation", OPT0),
    30: ("missing object", OPT1),
    40: ("manifest CRC32C disagrees with the object", MODEL),
    50: ("manifest total_bytes disagrees with its files", MANIFEST_NAME),
}


def _damage(client: Any, bucket: str, step: int) -> None:
    base = checkpoint_prefix("t", "r", step)

    def get(key: str) -> bytes:
        return bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())

    if step == 10:
        body = bytearray(get(base + MODEL))
        body[len(body) // 3] ^= 0x04
        client.put_object(Bucket=bucket, Key=base + MODEL, Body=bytes(body))
    elif step == 20:
        client.put_object(Bucket=bucket, Key=base + OPT0, Body=get(base + OPT0)[:-4096])
    elif step == 30:
        client.delete_object(Bucket=bucket, Key=base + OPT1)
    elif step == 40:
        m = json.loads(get(base + MANIFEST_NAME))
        entry = next(f for f in m["files"] if f["path"] == MODEL)
        crc = int.from_bytes(base64.b64decode(entry["crc32c"]), "big") ^ 1
        entry["crc32c"] = base64.b64encode(crc.to_bytes(4, "big")).decode()
        client.put_object(Bucket=bucket, Key=base + MANIFEST_NAME, Body=json.dumps(m).encode())
    elif step == 50:
        m = json.loads(get(base + MANIFEST_NAME))
        m["total_bytes"] += 1
        client.put_object(Bucket=bucket, Key=base + MANIFEST_NAME, Body=json.dumps(m).encode())


def test_drill_and_restore_detect_every_kind_of_damage_naming_the_file(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, s3_env: Any
) -> None:
    from ckptvault_prefect.flows.drill import drill
    from ckptvault_prefect.flows.ingest import ingest
    from ckptvault_prefect.flows.restore import restore

    s3_env(seaweedfs)
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    for s in DAMAGE:
        write_checkpoint(root, "deepspeed", s, 3 * MiB, seed=s)
    scratch = tmp_path / "scratch"
    # the quality gates in this process, warm: a child process per checkpoint cost ~2 s each, and the
    # bucket holds the same objects (validation reports included) either way
    extra = f'[drill]\nscratch = "{scratch}"\nsample = {len(DAMAGE)}\n[validation]\nisolate = false\n'
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "deepspeed")], extra=extra)
    assert sorted(o.result for o in ingest(config_path=str(cfg))) == ["uploaded"] * len(DAMAGE)
    assert all(r.ok for r in drill(config_path=str(cfg)).drilled), "the undamaged checkpoints must drill clean"

    client = seaweedfs.client()
    for step in DAMAGE:
        _damage(client, bucket, step)

    state = drill(config_path=str(cfg), return_state=True)
    err = state.result(raise_on_failure=False)
    assert isinstance(err, DrillFailed), err
    rows = {r.step: r for r in err.report.drilled}
    for step, (what, name) in DAMAGE.items():
        assert not rows[step].ok, f"drill missed the {what} at step {step}"
        assert name in " ".join(rows[step].problems), f"drill report for the {what} lacks {name}"
    assert not list(scratch.glob("*ckptvault-partial*")), "drill left scratch data behind"
    states = {c.step: c for c in Catalog(open_store(load_config(str(cfg)).store), "t").current("r")}
    assert {s: states[s].last_drill_ok for s in DAMAGE} == dict.fromkeys(DAMAGE, False)

    for step, (what, name) in DAMAGE.items():
        dest = tmp_path / f"out-{step}"
        result = restore(run="r", step=str(step), dest=str(dest), config_path=str(cfg), return_state=True)
        assert result.is_failed(), f"restore accepted the {what} at step {step}"
        message = str(result.result(raise_on_failure=False))
        assert name in message, f"restore error for the {what} does not name {name}: {message}"
        assert not dest.exists(), f"a failed restore created {dest}"
    assert not [p for p in tmp_path.iterdir() if "ckptvault-partial" in p.name], "restore left staging behind"
    print("\n[corruption] detected by drill and restore, each naming the file: " + "; ".join(
        f"{w} ({n})" for w, n in DAMAGE.values()))  # fmt: skip
