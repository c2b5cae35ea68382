"""`ckptvault ingest --profile` and `restore --profile` as the console script runs them (a subprocess, so
the process's start and its shutdown are on the table), on SeaweedFS, without a Prefect API (the
direct mode: seconds, not a server's start): every phase of the command is named, the phases and
"other" add up to the printed total, and with --json stdout stays one document, with `profile`.
A restore without a Prefect API imports nothing of Prefect. Nothing here asserts how long anything took."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from ckptvault.clock.timing import OTHER
from ckptvault_cli.profiling import PHASES
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config

MiB = 2**20
REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^(?P<name>\S.*?)\s+(?P<s>\d+\.\d{3})\s+\d+\.\d%$")


def _cli(cfg: Path, endpoint: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "CKPTVAULT_PREFECT")}
    env.update(endpoint.env(), PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "ckptvault_cli.main", "--config", str(cfg), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=REPO)


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _table(stderr: str) -> tuple[dict[str, float], float]:
    """The printed breakdown: each phase's seconds, and the total line's."""
    lines = stderr[stderr.index("--profile, where this command's") :].splitlines()[2:]
    lines = lines[: next(i for i, line in enumerate(lines) if line.startswith("total ")) + 1]
    rows = {m["name"]: float(m["s"]) for line in lines if (m := ROW.match(line))}
    total = rows.pop("total")
    return rows, total


def test_profile_names_every_phase_and_adds_up_to_the_total(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path
) -> None:
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    write_checkpoint(root, "deepspeed", 100, 12 * MiB, shards=1, seed=1)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "deepspeed")])

    ingest = _cli(cfg, seaweedfs, "ingest", "--profile", "--json")
    assert ingest.returncode == 0, ingest.stderr
    doc = json.loads(ingest.stdout)  # one document: the outcomes and the profile together
    assert [o["result"] for o in doc["outcomes"]] == ["uploaded"]
    profile = doc["profile"]
    names = [p["phase"] for p in profile["phases"]]
    assert names == [*PHASES["ingest"], OTHER]
    seconds = {p["phase"]: p["seconds"] for p in profile["phases"]}
    # each phase rounded to 0.1 ms: the sum is the total to within that rounding
    assert abs(sum(seconds.values()) - profile["total_s"]) <= 0.0001 * (len(seconds) + 1)
    # wired where the work is: the bytes were sent inside "transfer", the process's start was read
    assert seconds["transfer"] > 0 and seconds["process start"] > 0
    # the gate child's own report, beside the timeline (validation is on by default)
    beside = {p["phase"] for p in profile["alongside"]}
    assert {"gate child: start and imports", "gate child: evaluation"} <= beside
    rows, total = _table(ingest.stderr)
    assert list(rows) == names
    assert abs(sum(rows.values()) - total) <= 0.001 * (len(rows) + 1)  # printed to the ms

    dest = tmp_path / "back"
    restore = _cli(cfg, seaweedfs, "restore", "r", "--dest", str(dest), "--profile")
    assert restore.returncode == 0, restore.stderr
    assert "restored r step 100" in restore.stdout and "where this command" not in restore.stdout
    rows, total = _table(restore.stderr)
    assert list(rows) == [*PHASES["restore"], OTHER]
    assert abs(sum(rows.values()) - total) <= 0.001 * (len(rows) + 1)
    assert rows["transfer"] > 0 and rows["plan"] > 0
    # when the first bytes moved: an instant inside the total, on no line of the sum
    first = re.search(r"^first_byte at (\d+\.\d{3}) s from the process's start$", restore.stderr, re.M)
    assert first is not None, restore.stderr[-2000:]
    assert 0 < float(first[1]) <= total
    assert sorted(p.name for p in dest.rglob("*") if p.is_file()) == sorted(
        p.name for p in root.rglob("*") if p.is_file()
    )

    # issue [W]: without a Prefect API nothing of Prefect runs in a restore, so none of it is imported
    again = tmp_path / "again"
    code = (
        "import sys\nfrom ckptvault_cli.main import main\n"
        f"assert main(['--config', {str(cfg)!r}, 'restore', 'r', '--dest', {str(again)!r}]) == 0\n"
        "print('imported:', sorted(m for m in sys.modules if m.split('.')[0] == 'prefect')[:5])\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "CKPTVAULT_PREFECT")}
    proc = subprocess.run([sys.executable, "-c", code], env={**env, **seaweedfs.env(), "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=240, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "imported: []" in proc.stdout, proc.stdout
    assert _files(again) == _files(dest)  # the same save, byte for byte
