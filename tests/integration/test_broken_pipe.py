"""Every `ckptvault` command that prints, with its stdout's reader gone before it writes (`ckptvault ls
--json | head`, the reader ending first): exit 141 (what a shell reports for a tool SIGPIPE ended) and
nothing on stderr, no traceback nor "Exception ignored ... BrokenPipeError", cold and run by the warm
process (docs/commands.md, "Exit codes").

The pipe's read end is closed before the command starts: a small output would otherwise fit the pipe's
buffer and the command would never see the broken pipe. One store (SeaweedFS) for the whole module: a
bucket with Object Lock (for hold and release), a replica (for replicate), two quarantined steps (one
`accept` each, cold and warm) and verified ones for the rest."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckptvault_cli.output import EXIT_PIPE
from ckptvault_cli.synthetic import write_checkpoint
from ckptvault_cli.warm import protocol as proto
from tests import servers
from tests.helpers import write_config

KiB = 2**10
REPO = Path(__file__).resolve().parents[2]
SERVED = re.compile(r"child (\d+) `([^`]*)` exit (-?\d+)")


@dataclass
class Store:
    cfg: Path
    tmp: Path
    follow_root: Path
    env: dict[str, str]  # the warm process's environment; a cold command adds CKPTVAULT_WARM=0
    follow_steps: list[int]


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ckptvault_cli.entry", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=REPO)


def _reader_gone(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The console script with stdout a pipe whose read end is already closed; stderr captured."""
    r, w = os.pipe()
    os.close(r)
    try:
        cmd = [sys.executable, "-m", "ckptvault_cli.entry", *args]
        return subprocess.run(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=w, stderr=subprocess.PIPE, text=True, timeout=240, cwd=REPO
        )
    finally:
        os.close(w)


@pytest.fixture(scope="module")
def store(seaweedfs: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    tmp = tmp_path_factory.mktemp("pipe")
    client = seaweedfs.client()
    bucket, replica = servers.unique_bucket_name("ckv-lock"), servers.unique_bucket_name()
    client.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    client.create_bucket(Bucket=replica)
    root, follow_root = tmp / "hot", tmp / "follow"
    follow_root.mkdir()
    for step in (100, 200, 300):
        write_checkpoint(root, "hf", step, 64 * KiB, shards=1, seed=step)
    extra = (
        f'[drill]\nscratch = "{tmp / "scratch"}"\nsample = 1\n'
        f'[[replicas]]\nname = "dr"\nendpoint_url = "{seaweedfs.url}"\nregion = "{seaweedfs.region}"\n'
        f'bucket = "{replica}"\n'
    )
    cfg = write_config(tmp / "c.toml", seaweedfs, bucket, [("r", root, "hf"), ("f", follow_root, "hf")], extra=extra)
    # a short directory of its own: a Unix socket's path is limited to 107 bytes
    directory = tempfile.mkdtemp(prefix="cvp-")
    # stdout block-buffered, as in a user's shell: what a command prints without flushing meets the
    # closed pipe only at exit (PYTHONUNBUFFERED, set on some CI machines, would hide that path)
    gone = ("PREFECT_API_URL", "CKPTVAULT_PREFECT", "PYTHONUNBUFFERED", proto.OFF_ENV)
    env = {k: v for k, v in os.environ.items() if k not in gone}
    env.update(seaweedfs.env(), PYTHONPATH=str(REPO), **{proto.DIR_ENV: directory})
    cold = {**env, proto.OFF_ENV: "0"}
    first = _cli(cold, "--config", str(cfg), "ingest")
    assert first.returncode == 0, first.stderr
    # half the size of their history: the size gate quarantines both (one `accept` cold, one warm)
    for step in (500, 600):
        write_checkpoint(root, "hf", step, 32 * KiB, shards=1, seed=step)
    second = _cli(cold, "--config", str(cfg), "ingest")
    assert second.returncode == 1 and "invalid" in second.stdout, second.stdout + second.stderr
    try:
        yield Store(cfg, tmp, follow_root, env, [1000])
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        for name in (bucket, replica):
            servers.delete_bucket_everything(seaweedfs, name)


@pytest.fixture(scope="module")
def warm(store: Store) -> Iterator[dict[str, str]]:
    started = _cli(store.env, "warm", "--idle-minutes", "10")
    assert started.returncode == 0 and "ready in" in started.stderr, started.stderr
    yield store.env
    _cli(store.env, "warm", "--stop")
    log = Path(proto.log_path(proto.socket_path(store.env)))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "stopped after" not in log.read_text():
        time.sleep(0.1)


def _follow(s: Store, mode: str) -> list[str]:
    # a step not archived yet: follow ingests it at once, then prints its outcome
    step = s.follow_steps[-1] + 100
    s.follow_steps.append(step)
    write_checkpoint(s.follow_root, "hf", step, 64 * KiB, shards=1, seed=step)
    return ["follow", "--run", "f", "--poll-seconds", "3600", "--watch", "poll"]


# Each command that prints on stdout, with the arguments that make it print (mode: cold or warm).
# `serve` and `warm` print on stderr only.
COMMANDS: dict[str, Callable[[Store, str], list[str]]] = {
    "help": lambda s, m: ["--help"],
    "subcommand help": lambda s, m: ["restore", "--help"],
    "version": lambda s, m: ["--version"],
    # --run f: r's quarantined steps would make every pass exit 1
    "ingest --json": lambda s, m: ["ingest", "--run", "f", "--json"],
    "ingest --json --profile": lambda s, m: ["ingest", "--run", "f", "--json", "--profile"],
    "follow": _follow,
    "ls": lambda s, m: ["ls"],
    "ls --json": lambda s, m: ["ls", "--json"],
    "restore": lambda s, m: ["restore", "r", "--dest", str(s.tmp / f"text-{m}")],
    "restore --json": lambda s, m: ["restore", "r", "--dest", str(s.tmp / f"json-{m}"), "--json"],
    "restore --json --profile": lambda s, m: ["restore", "r", "--dest", str(s.tmp / f"p-{m}"), "--json", "--profile"],
    "drill --json": lambda s, m: ["drill", "--json"],
    "plan": lambda s, m: ["plan"],
    "plan --json": lambda s, m: ["plan", "--json"],
    "tier --json": lambda s, m: ["tier", "--json"],
    "watch --json": lambda s, m: ["watch", "--json"],
    "replicate --json": lambda s, m: ["replicate", "--json"],
    "scrub --json": lambda s, m: ["scrub", "--json"],
    "metrics": lambda s, m: ["metrics"],
    "metrics --json": lambda s, m: ["metrics", "--json"],
    "accept": lambda s, m: ["accept", "r", "500" if m == "cold" else "600", "--reason", "reviewed"],
    "hold": lambda s, m: ["hold", "r", "--step", "100", "--reason", "audit"],
    "release": lambda s, m: ["release", "r", "--step", "100", "--reason", "audit over"],
    "catalog stats --json": lambda s, m: ["catalog", "stats", "--json"],
    "catalog rebuild --json": lambda s, m: ["catalog", "rebuild", "--json"],
    "catalog compact --json": lambda s, m: ["catalog", "compact", "--json"],
}


# What these say on stderr in any case (a flow's log, an alert on the console, --profile's table): the
# rest say nothing there
SAY_SOMETHING = {"follow", "drill --json", "tier --json", "hold", "release"}
NOISE = ("Traceback", "Exception ignored", "BrokenPipe", "Broken pipe", "Errno 32")


def _quiet(command: str, out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == EXIT_PIPE, (out.returncode, out.stderr[-3000:])
    if command in SAY_SOMETHING or "--profile" in command:
        assert not [n for n in NOISE if n in out.stderr], out.stderr[-3000:]
    else:
        assert out.stderr == "", out.stderr[-3000:]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_cold_command_ends_quietly_when_its_reader_is_gone(store: Store, command: str) -> None:
    args = COMMANDS[command](store, "cold")
    _quiet(command, _reader_gone({**store.env, proto.OFF_ENV: "0"}, "--config", str(store.cfg), *args))


@pytest.mark.parametrize("command", list(COMMANDS))
def test_warm_command_ends_quietly_when_its_reader_is_gone(store: Store, warm: dict[str, str], command: str) -> None:
    log = Path(proto.log_path(proto.socket_path(warm)))
    before = log.read_text()
    served = len(SERVED.findall(before))
    args = COMMANDS[command](store, "warm")
    _quiet(command, _reader_gone(warm, "--config", str(store.cfg), *args))
    # the warm process ran it (not a silent cold run), and its child ended with the same code: a restore's
    # child, released at its result (docs/warm.md), goes on with its stdout in the log, where nothing of
    # the broken pipe shows either
    deadline = time.monotonic() + 60
    while len(SERVED.findall(log.read_text())) == served:
        assert time.monotonic() < deadline, log.read_text()[len(before) :]
        time.sleep(0.1)
    new = log.read_text()[len(before) :]
    ran = SERVED.findall(new)
    assert len(ran) == 1 and int(ran[0][2]) == EXIT_PIPE, new
    assert "Traceback" not in new and "BrokenPipe" not in new, new
    if command.startswith("restore --json"):
        assert f"child {ran[0][0]} released its command with exit {EXIT_PIPE}" in new, new
