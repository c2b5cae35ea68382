"""`make demo`: the whole ingest lifecycle on this machine, with nothing configured.

Starts the embedded default store (a persistent SeaweedFS on 127.0.0.1:8333, data under .demo/;
DEMO_STORE=ceph for a real Ceph RGW), simulates three training runs that keep writing checkpoints
in different formats while ingest passes run every few seconds, then prints the catalog and where
to look next.
"""

from __future__ import annotations

import os
import shutil
import socket
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


def _store_conf(state_dir: Path) -> dict[str, str]:
    """What a store instance was created with (its config.env: ports, keys); empty if it was not."""
    conf = state_dir / "config.env"
    values: dict[str, str] = {}
    for line in conf.read_text().splitlines() if conf.exists() else []:
        name, sep, value = line.partition("=")
        if sep and not name.startswith("#"):
            values[name] = value
    return values


def _store_ports(state_dir: Path) -> dict[str, int]:
    """The ports a store instance was created with, S3 first; Ceph's OSD range left out."""
    return {
        name: int(value)
        for name, value in _store_conf(state_dir).items()
        if name.endswith("PORT") and not name.startswith("OSD_") and value.isdigit()
    }


def _port_ranges(ports: list[int]) -> str:
    """[8333, 8334, 8335, 18333] -> "8333-8335, 18333"."""
    out: list[str] = []
    for p in sorted(set(ports)):
        if out and out[-1].split("-")[-1] == str(p - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{p}"
        else:
            out.append(str(p))
    return ", ".join(out)


def _free_port_near(kind: str, port: int) -> int | None:
    """A port near `port` whose whole block (infra/local/common.sh port_block) is free: for a hint."""
    offsets = (0, 1, 2, 3, 4, 10000, 10001, 10002, 10003, 10004) if kind == "seaweedfs" else (0, 1, 2)
    for base in range(port + 100, min(port + 4100, 65536 - max(offsets)), 100):
        try:
            for o in offsets:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + o))
        except OSError:
            continue
        return base
    return None


def _store_env() -> tuple[str, dict[str, str]]:
    """The demo's store: one of this checkout already serving the demo's port (`make up`'s, or the demo's
    own from an earlier run), else the demo's own, started in DEMO_DIR/<kind>. Returns the endpoint and the
    store's environment (STATE_DIR, PORT, ACCESS_KEY, SECRET_KEY, SCRIPT)."""
    kind = os.environ.get("DEMO_STORE", "seaweedfs")
    if kind == "ceph":
        default_port, script = 7480, "ceph.sh"
    elif kind == "seaweedfs":
        default_port, script = 8333, "seaweedfs.sh"
    else:
        sys.exit(f"DEMO_STORE={kind!r} is not known: use seaweedfs (default) or ceph")
    own = DEMO / kind
    recorded = _store_ports(own).get("PORT")
    asked = os.environ.get("DEMO_PORT", "")
    if asked and not asked.isdigit():
        sys.exit(f"DEMO_PORT={asked!r} is not a port number")
    if asked and recorded and int(asked) != recorded:
        sys.exit(
            f"DEMO_PORT={asked}, but the demo's {kind} store in {own} was created on port {recorded} and keeps it; "
            "unset DEMO_PORT, or delete the demo's data first (`make clean`)"
        )
    port = int(asked) if asked else recorded or default_port
    scripts = ROOT / "infra" / "local"
    # The store scripts' own settings come from us alone, not from a stray `export PORT=...`.
    base = {k: v for k, v in os.environ.items() if k not in ("STATE_DIR", "PORT", "ACCESS_KEY", "SECRET_KEY")}
    base["DEMO_DIR"] = str(DEMO)
    found = subprocess.run(
        ["bash", str(scripts / "instances.sh"), "serving", kind, str(port)],
        env=base,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    state_dir = Path(found.stdout.strip()) if found.returncode == 0 and found.stdout.strip() else own
    if state_dir != own:
        # `make up`'s store (or a hand-started one) holds the port: share it, with its keys. Each demo writes
        # under a prefix of its own, so it tells its own story in any store.
        conf = _store_conf(state_dir)
        key, secret = conf["ACCESS_KEY"], conf["SECRET_KEY"]
        print(f"[demo] using the {kind} store already running on 127.0.0.1:{port} (data in {state_dir})", flush=True)
    else:
        key, secret = KEY, SECRET
        what = "the demo's store is running" if found.returncode == 0 else f"starting the {kind} store"
        print(f"[demo] {what} on 127.0.0.1:{port} (data in {own})", flush=True)
    env = {**base, "STATE_DIR": str(state_dir), "PORT": str(port), "ACCESS_KEY": key, "SECRET_KEY": secret}
    other = f"DEMO_PORT={_free_port_near(kind, port) or '<free port>'} make demo"
    if recorded:
        hint = (
            f"the demo's store in {own} was created on port {port} and keeps it; free the port, or delete the "
            f"demo's data (`make clean`) and rerun with {other}"
        )
    else:
        hint = (
            "if it is a server of this checkout, `bash infra/local/instances.sh` lists them and `make down` stops "
            f"them; else choose other ports: {other}"
        )
    proc = subprocess.run(
        ["bash", str(scripts / script), "up"], env={**env, "PORT_HINT": hint}, stdin=subprocess.DEVNULL, check=False
    )
    if proc.returncode != 0:
        print(f"[demo] the {kind} store did not start (see above)", file=sys.stderr, flush=True)
        sys.exit(proc.returncode)
    env["SCRIPT"] = script
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
    from ckptvault_cli.synthetic import finish_checkpoint, write_checkpoint

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
            "AWS_ACCESS_KEY_ID": env["ACCESS_KEY"],
            "AWS_SECRET_ACCESS_KEY": env["SECRET_KEY"],
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
    key, secret = env["ACCESS_KEY"], env["SECRET_KEY"]
    ports = _port_ranges(list(_store_ports(Path(env["STATE_DIR"])).values()))
    if Path(env["STATE_DIR"]) == DEMO / os.environ.get("DEMO_STORE", "seaweedfs"):
        shared = "`make up` uses this store (its data and keys) rather than start a second one on these ports"
    else:
        shared = "this store is not the demo's own (`make up`'s, most likely): `make down` stops it with the rest"
    print(
        f"""
[demo] where to look next
  config:      {cfg_path}
  keep using this store:
      export AWS_ACCESS_KEY_ID={key} AWS_SECRET_ACCESS_KEY={secret} AWS_DEFAULT_REGION=us-east-1
      export CKPTVAULT_CONFIG={cfg_path}
      .venv/bin/ckptvault ls            # the catalog
      .venv/bin/ckptvault ingest        # another pass
  the store keeps running: {env["STATE_DIR"]}, S3 on 127.0.0.1:{env["PORT"]}, ports {ports}
      stop it:  make down     (stops every server of this checkout and says which; the data is kept)
      alone:    STATE_DIR={env["STATE_DIR"]} bash infra/local/{env["SCRIPT"]} down
      {shared}
  these passes ran in this process, without a Prefect server (none is configured); for the Prefect UI,
  scheduled deployments and a worker: `make up`, then `export PREFECT_API_URL=...` as it prints
""",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
