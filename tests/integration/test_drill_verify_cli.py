"""The drill's resume check through the command line on SeaweedFS (docs/drills.md, "Resume check"): two
HF saves ingested once, then tiny Python scripts as `[drill] verify_command`: a pass (the metric within the
tolerance, no store credential in the command's environment but the one `verify_env` names, the outcome
in the report, the `drilled` events and the ledger's gauge); exit 1 and a metric outside the tolerance
fail the checkpoint and make the save suspect; exit 3 and the timeout are a `verify_error` that fails the
drill and alerts (Slack) but leaves the save as it was, and the timeout kills the child the command
started; bad input is exit 2 before anything is restored."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckptvault.catalog import Catalog
from ckptvault.observe import ledger
from ckptvault_cli.synthetic import write_checkpoint
from tests import servers
from tests.helpers import write_config
from tests.reliability.conftest import cli_env, run_cli
from tests.servers import S3Endpoint
from tests.slack_recorder import SLACK_TOKEN, SlackRecorder

MiB = 2**20
LOSS = {100: 2.5, 200: 2.0}  # what each save's trainer_state.json records: the manifest's `loss`
REPORTED = "torch=2.9.1+cu128,torch.cuda=12.8 transformers=4.57.1"  # as a hook's `ingest --written-by` passes it


@dataclass(frozen=True)
class World:
    endpoint: S3Endpoint
    bucket: str
    root: Path  # the run's checkpoint root
    tmp: Path
    env: dict[str, str]  # the CLI's: the store's credentials in it, no Prefect API (this process)


@pytest.fixture(scope="module")
def world(seaweedfs: S3Endpoint, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("verify")
    bucket = servers.unique_bucket_name()
    seaweedfs.client().create_bucket(Bucket=bucket)
    root = tmp / "hot"
    for step, loss in LOSS.items():
        write_checkpoint(root, "hf", step, 1 * MiB, shards=1, seed=step, loss=loss)
    w = World(seaweedfs, bucket, root, tmp, cli_env(seaweedfs, PREFECT_API_URL=""))
    plain = _config(w, w.tmp / "plain.toml", "")
    # step 100 as a hook ingests it: named, with what the training process reported it ran; then the rest
    out = run_cli(plain, "ingest", "--run", "r", "--step", "100", "--written-by", REPORTED, env=w.env)
    assert out.returncode == 0, out.stderr[-3000:]
    out = run_cli(plain, "ingest", env=w.env)
    assert out.returncode == 0, out.stderr[-3000:]
    yield w
    servers.cleanup_buckets([(seaweedfs, bucket)])


def _config(w: World, path: Path, drill: str, extra: str = "") -> Path:
    scratch = w.tmp / "scratch"
    return write_config(path, w.endpoint, w.bucket, [("r", w.root, "hf")],
                        extra=f'[drill]\nscratch = "{scratch}"\nsample = 1\n{drill}\n{extra}')  # fmt: skip


def test_ingest_records_what_the_saving_process_reported_for_the_steps_it_named(world: World) -> None:
    """`ingest --run R --step S --written-by WORDS` (the hooks' ingest channel) records the words in that
    save's manifest (`written_by`, beside what the files record) and the catalog; the pass without them
    records nothing for the other step; words that do not read are exit 2 before anything is ingested."""
    cfg = _config(world, world.tmp / "plain.toml", "")
    out = run_cli(cfg, "ls", "--run", "r", "--json", env=world.env)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["step"]: r for r in json.loads(out.stdout)}
    assert rows[100]["written_by"] == {"torch": "2.9.1+cu128", "torch.cuda": "12.8", "transformers": "4.57.1"}
    assert "torch" not in rows[200]["written_by"], rows[200]
    key = f"t/r/step-{100:010d}/_MANIFEST.json"
    manifest = json.loads(world.endpoint.client().get_object(Bucket=world.bucket, Key=key)["Body"].read())
    assert manifest["written_by"]["torch.cuda"] == "12.8", manifest.get("written_by")
    for args, says in [
        (("--run", "r", "--step", "100", "--written-by", "torch"), "--written-by: 'torch' is not KEY=VERSION"),
        (("--written-by", "torch=2.9.1"), "--written-by needs --run and --step"),
    ]:
        out = run_cli(cfg, "ingest", *args, env=world.env)
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)


def _script(tmp: Path, name: str, body: str) -> str:
    path = tmp / name
    path.write_text("import json, os, subprocess, sys, time\n" + body)
    return f'["{sys.executable}", "{path}"'


def _state(w: World, cfg: Path, step: int) -> str:
    out = run_cli(cfg, "ls", "--run", "r", "--json", env=w.env)
    assert out.returncode == 0, out.stderr[-2000:]
    (row,) = [r for r in json.loads(out.stdout) if r["step"] == step]
    return str(row["state"])


def test_a_passing_check_with_its_metric_in_tolerance_and_no_store_credentials(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = tmp_path / "seen"
    cmd = _script(tmp_path, "ok.py", "dest, metrics, out = sys.argv[1:4]\n"
                  "recorded = json.load(open(metrics))\n"
                  "json.dump({'env': dict(os.environ), 'dest': dest, 'is_dir': os.path.isdir(dest), 'cwd': os.getcwd(),"
                  " 'recorded': recorded}, open(out, 'w'))\n"
                  "print('resumed two steps')\nprint(json.dumps({'loss': recorded['loss'] * 1.02}))\n")  # fmt: skip
    drill = (f'verify_command = {cmd}, "{{dest}}", "{{metrics_json}}", "{seen}-{{step}}.json"]\n'
             'verify_env = { PASSED_KEY = "${AWS_ACCESS_KEY_ID}", HF_HOME = "/nowhere" }\n')  # fmt: skip
    cfg = _config(world, tmp_path / "c.toml", drill)
    out = run_cli(cfg, "drill", "--json", env=world.env)  # the scheduled drill's path: both saves (newest + 1)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r["step"]: r for r in json.loads(out.stdout)["drilled"]}
    assert sorted(rows) == [100, 200]
    for step, row in rows.items():
        v = row["verify"]
        assert row["ok"] and v["outcome"] == "passed" and v["exit"] == 0, row
        assert v["metric"]["source"] == "manifest" and v["metric"]["reference"] == LOSS[step] and v["metric"]["within"]
        assert f"against {LOSS[step]:g} recorded in the manifest" in v["why"]
        assert "resumed two steps" in v["stdout_tail"]
        got = json.loads(Path(f"{seen}-{step}.json").read_text())
        assert (
            got["is_dir"] and Path(got["dest"]).name == f"checkpoint-{step}" and got["recorded"]["loss"] == LOSS[step]
        )
        assert got["cwd"] == str(Path(got["dest"]).parent)  # the scratch directory it was restored into
        env = got["env"]
        assert env["PASSED_KEY"] == world.endpoint.access_key and env["HF_HOME"] == "/nowhere"
        leaked = [k for k in env if k.startswith(("AWS_", "PREFECT_", "CKPTVAULT_")) or k == "PYTHONPATH"]
        assert leaked == [] and world.endpoint.secret_key not in json.dumps(env)
    assert not Path(got["dest"]).exists()  # scratch is cleaned
    # the catalog's drilled events carry the check; the ledger its seconds
    for k, v in world.endpoint.env().items():
        monkeypatch.setenv(k, v)
    from ckptvault.config import load_config
    from ckptvault.store import open_store

    store = open_store(load_config(str(cfg)).store)
    drilled = [e for e in Catalog(store, "t").events("r") if e.event == "drilled"]
    assert {json.loads(e.detail)["verify"]["outcome"] for e in drilled[-2:]} == {"passed"}
    gauge = ledger.read_stored(store, "t").merged().gauges["drill_verify_seconds"][0]
    assert 0 < gauge <= sum(r["verify"]["seconds"] for r in rows.values()) + 0.01


def test_exit_1_and_a_metric_outside_the_tolerance_fail_the_checkpoint_and_mark_it_suspect(
    world: World, tmp_path: Path
) -> None:
    bad = _script(tmp_path, "bad.py", "print('optimizer state missing', file=sys.stderr)\nsys.exit(1)\n")
    cfg = _config(world, tmp_path / "bad.toml", f"verify_command = {bad}]\n")
    out = run_cli(cfg, "drill", "--verify-only", "r", "--step", "100", "--json", env=world.env)
    assert out.returncode == 1, out.stderr[-3000:]
    (row,) = json.loads(out.stdout)["drilled"]
    assert not row["ok"] and row["verify"]["outcome"] == "failed" and row["verify"]["exit"] == 1
    assert row["problems"] == ["verify failed: exit 1: the checkpoint failed the check"]
    assert "optimizer state missing" in row["verify"]["stderr_tail"]
    assert _state(world, cfg, 100) == "suspect"

    far = _script(tmp_path, "far.py", "print(json.dumps({'loss': 9.0}))\n")
    cfg = _config(world, tmp_path / "far.toml", f"verify_command = {far}]\nverify_tolerance = 0.1\n")
    out = run_cli(cfg, "drill", "--verify-only", "r", "--step", "100", env=world.env)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "resume check failed: loss 9 against 2.5 recorded in the manifest: 260.00% apart, OUTSIDE" in out.stdout
    assert _state(world, cfg, 100) == "suspect"


def test_exit_3_and_the_timeout_are_verify_errors_that_alert_and_leave_the_save_unmarked(
    world: World, tmp_path: Path, slack: SlackRecorder
) -> None:
    notify = f'[notify]\nslack_base_url = "{slack.base_url}"\nchannel = "#ckpt"\n'
    env = {**world.env, "CKPTVAULT_SLACK_TOKEN": SLACK_TOKEN}
    broken = _script(tmp_path, "broken.py", "print('ImportError: no module named trainer')\nsys.exit(3)\n")
    cfg = _config(world, tmp_path / "broken.toml", f"verify_command = {broken}]\n", notify)
    assert _state(world, cfg, 200) == "verified"
    out = run_cli(cfg, "drill", "--verify-only", "r", "--step", "200", env=env)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "resume check verify_error: exit 3: neither 0 (passed) nor a verify_fail_codes code (1)" in out.stdout
    assert "ImportError: no module named trainer" in out.stdout
    sent = [json.dumps(p.payload) for p in slack.delivered()]
    assert any("the resume check broke" in s and "verify_error: exit 3" in s for s in sent), sent
    assert _state(world, cfg, 200) == "verified"

    pid_file = tmp_path / "child.pid"
    child = "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    hang = _script(tmp_path, "hang.py", child + f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
                   "print('started', flush=True)\ntime.sleep(600)\n")  # fmt: skip
    cfg = _config(world, tmp_path / "hang.toml", f"verify_command = {hang}]\nverify_timeout_seconds = 3\n", notify)
    t0 = time.monotonic()
    out = run_cli(cfg, "drill", "--verify-only", "r", "--step", "200", "--json", env=env)
    assert out.returncode == 1 and time.monotonic() - t0 < 120, out.stderr[-3000:]
    (row,) = json.loads(out.stdout)["drilled"]
    v = row["verify"]
    assert v["outcome"] == "verify_error" and v["exit"] is None and "started" in v["stdout_tail"]
    assert v["why"] == "timed out after 3 s; its process group was killed"
    assert not _alive(int(pid_file.read_text()))  # the child it started went with it
    assert _state(world, cfg, 200) == "verified"


def test_bad_input_is_exit_2_before_anything_is_restored(world: World, tmp_path: Path) -> None:
    plain = _config(world, tmp_path / "plain.toml", "")
    cases: list[tuple[Path, tuple[str, ...], str]] = [
        (plain, ("--verify-only", "r", "--step", "200"), "no resume check is configured for run 'r'"),
        (_config(world, tmp_path / "v.toml", f'verify_command = ["{sys.executable}"]\n'),
         ("--verify-only", "r", "--step", "7"), "run 'r' has no verified save of step 7 (its verified steps: 100, 200"),
        (_config(world, tmp_path / "w.toml", f'verify_command = ["{sys.executable}"]\n'),
         ("--verify-only", "nope", "--step", "7"), "no run 'nope' in the catalog"),
        (_config(world, tmp_path / "p.toml", 'verify_command = ["no-such-program-zz", "{dest}"]\n'), (),
         "[drill] verify_command: 'no-such-program-zz' is not an executable file on the command's PATH"),
        (_config(world, tmp_path / "d.toml", f'verify_command = ["{sys.executable}"]\nverify_cwd = "{tmp_path}/x"\n'),
         (), f"[drill] verify_cwd: {tmp_path / 'x'} is not a directory"),
        (_config(world, tmp_path / "u.toml", 'verify_command = ["python", "{checkpoint}"]\n'), (),
         "drill.verify_command: '{checkpoint}': {checkpoint} is not a placeholder"),
    ]  # fmt: skip
    scratch = world.tmp / "scratch"
    before = sorted(scratch.rglob("*")) if scratch.exists() else []
    for cfg, args, said in cases:
        out = run_cli(cfg, "drill", *args, env=world.env)
        assert out.returncode == 2 and said in out.stderr, (args, out.stderr[-2000:])
        assert "Traceback" not in out.stderr
    assert (sorted(scratch.rglob("*")) if scratch.exists() else []) == before


def _alive(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return False  # a zombie: ended, waiting for init to reap it
        except (ProcessLookupError, FileNotFoundError):
            return False
        time.sleep(0.05)
    return True
