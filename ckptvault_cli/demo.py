"""`make demo`: the whole ingest lifecycle on this machine, with nothing configured.

Starts the embedded default store (a persistent SeaweedFS on 127.0.0.1:8333, data under .demo/;
DEMO_STORE=ceph for a real Ceph RGW), simulates four training runs that keep writing checkpoints
in different formats while ingest passes run every few seconds, then prints the catalog and where
to look next.

The demo and `make up` (infra/local/up.sh) share one config, DEMO_DIR/ckptvault.toml, with one prefix
(`demo`) that the stack's two roles' keys are scoped to: the stack's flows, UI and workers see the
demo's runs, and the demo's runs stay under the keys' prefix across reruns. A rerun continues each run
where the last demo stopped (its steps go on from there). When `make up`'s Prefect server is running,
the demo's ingest passes are flow runs on it (its UI shows them); otherwise they run in this process.

    python -m ckptvault_cli.demo                       # the demo
    python -m ckptvault_cli.demo config URL KIND       # write the shared config (up.sh); prints its path
    python -m ckptvault_cli.demo seed                  # the demo's checkpoints on the hot tier, no ingest (up.sh)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO = Path(os.environ.get("DEMO_DIR", ROOT / ".demo")).resolve()
STATE_ROOT = Path(os.environ.get("STATE_ROOT", ROOT / ".state")).resolve()
CONFIG = DEMO / "ckptvault.toml"
# One prefix for every demo and `make up`: infra/local/roles.py scopes the workers' keys to the config's prefix
PREFIX = "demo"
# The config's first line while the demo and `make up` may rewrite it; a file without it is the user's own
CONFIG_MARKER = "# Written by `make demo` and `make up`: rewritten by them while this line is here"
# How many rounds the demo has played, across reruns: each rerun's steps go on from the last one's
ROUNDS_FILE = "demo-rounds"
KEY, SECRET = "ckptvault-demo", "ckptvault-demo-secret"
MiB = 2**20

# (run, format, steps, bytes per checkpoint): small enough for a laptop, real layouts all the same.
RUNS = [
    ("llama-8b-hf", "hf", [100, 200, 300], 12 * MiB),
    ("gpt-ds", "deepspeed", [1000, 2000], 10 * MiB),
    ("mixtral-megatron", "megatron", [500, 1000], 10 * MiB),
    ("vit-lightning", "lightning", [50, 100], 6 * MiB),
]


def _instance_conf(state_dir: Path) -> dict[str, str]:
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
        for name, value in _instance_conf(state_dir).items()
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
        conf = _instance_conf(state_dir)
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


def write_config(endpoint: str, kind: str = "seaweedfs") -> Path:
    """The config the demo and `make up` share, at CONFIG: the demo's runs and the simulated trainer's
    (ckptvault_cli/trainer.py), prefix PREFIX. Rewritten while it starts with CONFIG_MARKER; a config the
    user took over (the marker line deleted) is left as it is."""
    from ckptvault_cli import trainer

    if CONFIG.exists() and not CONFIG.read_text().startswith(CONFIG_MARKER):
        return CONFIG
    lines = [
        CONFIG_MARKER,
        "# (delete that line to keep your edits). Credentials come from the environment, never from here.",
        "[store]",
        'bucket = "ckpts"',
        f'prefix = "{PREFIX}"',
        f'endpoint_url = "{endpoint}"',
        f'region = "{"default" if kind == "ceph" else "us-east-1"}"',
    ]
    if kind == "seaweedfs":  # `make up` runs its flows under two roles there; only the tier role may delete
        lines.append('deletes = "tier-only"')
        # nor may the ingest role write the lifecycle: roles.py installs the abort rule, as Terraform does
        lines.append('lifecycle = "external"')
    lines.append("")
    for run, fmt, _, _ in RUNS:
        lines += ["[[sources]]", f'run = "{run}"', f'path = "{DEMO / "hot" / run}"', f'format = "{fmt}"']
        lines += ["settle_seconds = 2", ""]
    for live in trainer.RUNS:
        lines += ["[[sources]]", f'run = "{live.run}"', f'path = "{DEMO / "hot" / live.run}"', f'format = "{live.fmt}"']
        lines += [f"settle_seconds = {trainer.SETTLE_SECONDS}", ""]
    lines += [
        "[policy]",
        "keep_hot = 2",
        "milestone_every_steps = 1000",
        "",
        "[drill]",
        f'scratch = "{DEMO / "drill"}"',
        "",
    ]
    for run in [r[0] for r in RUNS] + [live.run for live in trainer.RUNS]:
        (DEMO / "hot" / run).mkdir(parents=True, exist_ok=True)
    DEMO.mkdir(parents=True, exist_ok=True)
    tmp = CONFIG.with_name(CONFIG.name + ".tmp")
    tmp.write_text("\n".join(lines))
    os.replace(tmp, CONFIG)
    return CONFIG


def _rounds_played() -> int:
    f = DEMO / "hot" / ROUNDS_FILE
    text = f.read_text().strip() if f.exists() else ""
    return int(text) if text.isdigit() else 0


def _steps(steps: list[int], played: int) -> list[int]:
    """A run's steps for this demo: its list, shifted past every step the demos before it wrote."""
    return [s + played * steps[-1] for s in steps]


def _prefect_api() -> str | None:
    """`make up`'s Prefect API (STATE_ROOT/prefect), when it answers: the demo's passes become flow runs there."""
    conf = _instance_conf(STATE_ROOT / "prefect")
    port = conf.get("PORT", "")
    if not port.isdigit() or not (STATE_ROOT / "prefect" / "server").exists():
        return None
    url = f"http://127.0.0.1:{port}/api"
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return url if r.read().strip() == b"true" else None
    except OSError:
        return None


def _write_round(i: int, complete: bool, played: int, quiet: bool = False) -> None:
    from ckptvault_cli.synthetic import finish_checkpoint, write_checkpoint

    for run, fmt, run_steps, size in RUNS:
        if i >= len(run_steps):
            continue
        root = DEMO / "hot" / run
        step = _steps(run_steps, played)[i]
        loss = 2.5 / (played * len(run_steps) + i + 1)
        if complete:
            finish_checkpoint(root, fmt, step, loss=loss)
            if not quiet:
                print(f"[demo] {run}: step {step} finished", flush=True)
        else:
            write_checkpoint(root, fmt, step, size, shards=2, seed=i, complete=False, loss=loss)
            if not quiet:
                print(f"[demo] {run}: training is writing step {step} ({fmt})", flush=True)


def seed() -> int:
    """`make up` without a demo before it: the demo's checkpoints on the hot tier, finished, no ingest (the
    stack's first ingest run archives them). Nothing when a demo already wrote its rounds."""
    if _rounds_played():
        return 0
    rounds = max(len(steps) for _, _, steps, _ in RUNS)
    for i in range(rounds):
        _write_round(i, complete=False, played=0, quiet=True)
        _write_round(i, complete=True, played=0, quiet=True)
    (DEMO / "hot" / ROUNDS_FILE).write_text("1\n")
    print(f"[demo] wrote the demo's {sum(len(s) for _, _, s, _ in RUNS)} checkpoints under {DEMO / 'hot'}", flush=True)
    return 0


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
    cfg_path = write_config(endpoint, os.environ.get("DEMO_STORE", "seaweedfs"))
    from ckptvault.config import load_config
    from ckptvault.store import ensure_bucket

    ensure_bucket(load_config(str(cfg_path)).store)
    print(f"[demo] config written to {cfg_path}", flush=True)
    # Without `make up`'s server every pass runs in direct mode (ckptvault_cli/running.py): no server to wait for.
    api = _prefect_api()
    if api:
        os.environ["PREFECT_API_URL"] = api
        print(f"[demo] make up's Prefect server is running: each ingest pass is a flow run in its UI, {api[:-4]}/runs")
    else:
        os.environ.pop("PREFECT_API_URL", None)
    from ckptvault_cli.main import main as cli

    played = _rounds_played()
    if played:
        print(f"[demo] the runs go on where the last demo left them (demo {played + 1})", flush=True)
    # Training and ingest interleaved: each round, every run starts writing a checkpoint (an ingest
    # pass sees it unfinished and leaves it alone), then finishes it; the next pass uploads it.
    rounds = max(len(steps) for _, _, steps, _ in RUNS)
    for i in range(rounds + 1):
        if i < rounds:
            _write_round(i, complete=False, played=played)
        print(f"[demo] ingest pass {i + 1}", flush=True)
        cli(["--config", str(cfg_path), "ingest"])
        if i < rounds:
            _write_round(i, complete=True, played=played)
            time.sleep(2.5)  # settle_seconds = 2: a finished checkpoint must be quiet before it is taken
    (DEMO / "hot" / ROUNDS_FILE).write_text(f"{played + 1}\n")
    print("\n[demo] the catalog now holds:\n", flush=True)
    cli(["--config", str(cfg_path), "ls"])
    key, secret = env["ACCESS_KEY"], env["SECRET_KEY"]
    ports = _port_ranges(list(_store_ports(Path(env["STATE_DIR"])).values()))
    if Path(env["STATE_DIR"]) == DEMO / os.environ.get("DEMO_STORE", "seaweedfs"):
        shared = "`make up` uses this store (its data and keys) rather than start a second one on these ports"
    else:
        shared = "this store is not the demo's own (`make up`'s, most likely): `make down` stops it with the rest"
    if api:
        where_ran = f"these passes were flow runs on make up's Prefect server: its UI is {api[:-4]}"
    else:
        where_ran = (
            "these passes ran in this process, without a Prefect server; `make up` serves this store, config and\n"
            "  runs with the Prefect UI, scheduled deployments, two workers and a simulated trainer"
        )
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
  {where_ran}
""",
        flush=True,
    )
    return 0


def _cli(argv: list[str]) -> int:
    if argv[:1] == ["config"] and len(argv) in (2, 3):
        print(write_config(argv[1], argv[2] if len(argv) == 3 else "seaweedfs"))
        return 0
    if argv == ["seed"]:
        return seed()
    if argv:
        print("usage: python -m ckptvault_cli.demo [config ENDPOINT [seaweedfs|ceph] | seed]", file=sys.stderr)
        return 2
    return main()


if __name__ == "__main__":
    sys.exit(_cli(sys.argv[1:]))
