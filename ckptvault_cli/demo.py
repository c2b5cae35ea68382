"""`make demo`: the whole ingest lifecycle on this machine, with nothing configured.

Starts the embedded default store (a persistent SeaweedFS on 127.0.0.1:8333, data under .demo/;
DEMO_STORE=ceph for a real Ceph RGW), simulates three training runs that keep writing checkpoints
in different formats while ingest passes run every few seconds, then prints the catalog and where
to look next.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO = Path(os.environ.get("DEMO_DIR", ROOT / ".demo")).resolve()
KEY, SECRET = "ckptvault-demo", "ckptvault-demo-secret"
MiB = 2**20

# (run, format, steps, bytes per checkpoint): small enough for a laptop, real layouts all the same.
RUNS = [
    ("llama-8b-hf", "hf", [100, 200, 300], 12 * MiB),
    ("gpt-ds", "deepspeed", [1000, 2000], 10 * MiB),
    ("mixtral-megatron", "megatron", [500, 1000], 10 * MiB),
    ("vit-lightning", "lightning", [50, 100], 6 * MiB),
]


def _store_env() -> tuple[str, dict[str, str]]:
    kind = os.environ.get("DEMO_STORE", "seaweedfs")
    if kind == "ceph":
        port, script = "7480", "ceph.sh"
    elif kind == "seaweedfs":
        port, script = "8333", "seaweedfs.sh"
    else:
        sys.exit(f"DEMO_STORE={kind!r} is not known: use seaweedfs (default) or ceph")
    env = {
        **os.environ,
        "STATE_DIR": str(DEMO / kind),
        "PORT": port,
        "ACCESS_KEY": KEY,
        "SECRET_KEY": SECRET,
    }
    print(f"[demo] starting the {kind} store on 127.0.0.1:{port} (data in {DEMO / kind})", flush=True)
    subprocess.run(["bash", str(ROOT / "infra/local" / script), "up"], env=env, check=True)
    return f"http://127.0.0.1:{port}", env


def _write_config(endpoint: str) -> Path:
    # a fresh prefix per demo: the store persists across demos, each demo tells its own story
    prefix = time.strftime("demo-%Y%m%d-%H%M%S")
    lines = [
        "# Written by `make demo`. Credentials come from the environment (see the demo's last lines).",
        "[store]",
        'bucket = "ckpts"',
        f'prefix = "{prefix}"',
        f'endpoint_url = "{endpoint}"',
        'region = "us-east-1"',
        "",
    ]
    for run, fmt, _, _ in RUNS:
        lines += [
            "[[sources]]",
            f'run = "{run}"',
            f'path = "{DEMO / "hot" / run}"',
            f'format = "{fmt}"',
            "settle_seconds = 2",
            "",
        ]
    lines += [
        "[policy]",
        "keep_hot = 2",
        "milestone_every_steps = 1000",
        "",
        "[drill]",
        f'scratch = "{DEMO / "drill"}"',
        "",
    ]
    path = DEMO / "ckptvault.toml"
    path.write_text("\n".join(lines))
    return path


def _write_round(i: int, complete: bool) -> None:
    from ckptvault.synthetic import finish_checkpoint, write_checkpoint

    for run, fmt, steps, size in RUNS:
        if i >= len(steps):
            continue
        root = DEMO / "hot" / run
        if complete:
            finish_checkpoint(root, fmt, steps[i], loss=2.5 / (i + 1))
            print(f"[demo] {run}: step {steps[i]} finished", flush=True)
        else:
            write_checkpoint(root, fmt, steps[i], size, shards=2, seed=i, complete=False, loss=2.5 / (i + 1))
            print(f"[demo] {run}: training is writing step {steps[i]} ({fmt})", flush=True)


def main() -> int:
    DEMO.mkdir(parents=True, exist_ok=True)
    endpoint, env = _store_env()
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "PREFECT_HOME": str(DEMO / "prefect"),
            "DO_NOT_TRACK": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            # the demo's own lines are the story; Prefect's per-task lines stay in the UI
            "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
            "PREFECT_LOGGING_HANDLERS_CONSOLE_FLOW_RUNS_LEVEL": "WARNING",
        }
    )
    cfg_path = _write_config(endpoint)
    from ckptvault.config import load_config
    from ckptvault.store import ensure_bucket

    ensure_bucket(load_config(str(cfg_path)).store)
    print(f"[demo] config written to {cfg_path}", flush=True)
    # No PREFECT_API_URL: every pass runs in direct mode (ckptvault_cli/running.py), no server to wait for.
    from ckptvault_cli.main import main as cli

    # the simulated hot tier is the demo's own scratch data: start it afresh
    shutil.rmtree(DEMO / "hot", ignore_errors=True)
    for run, *_ in RUNS:
        (DEMO / "hot" / run).mkdir(parents=True, exist_ok=True)
    # Training and ingest interleaved: each round, every run starts writing a checkpoint (an ingest
    # pass sees it unfinished and leaves it alone), then finishes it; the next pass uploads it.
    rounds = max(len(steps) for _, _, steps, _ in RUNS)
    for i in range(rounds + 1):
        if i < rounds:
            _write_round(i, complete=False)
        print(f"[demo] ingest pass {i + 1}", flush=True)
        cli(["--config", str(cfg_path), "ingest"])
        if i < rounds:
            _write_round(i, complete=True)
            time.sleep(2.5)  # settle_seconds = 2: a finished checkpoint must be quiet before it is taken
    print("\n[demo] the catalog now holds:\n", flush=True)
    cli(["--config", str(cfg_path), "ls"])
    print(
        f"""
[demo] where to look next
  config:      {cfg_path}
  keep using this store:
      export AWS_ACCESS_KEY_ID={KEY} AWS_SECRET_ACCESS_KEY={SECRET} AWS_DEFAULT_REGION=us-east-1
      export CKPTVAULT_CONFIG={cfg_path}
      .venv/bin/ckptvault ls            # the catalog
      .venv/bin/ckptvault ingest        # another pass
  the store keeps running (stop it: STATE_DIR={env["STATE_DIR"]} bash infra/local/seaweedfs.sh down)
  these passes ran in this process, without a Prefect server (none is configured); for the Prefect UI,
  scheduled deployments and a worker: `make up`, then `export PREFECT_API_URL=...` as it prints
""",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
