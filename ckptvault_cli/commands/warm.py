"""`ckptvault warm`: start (`--status`, `--stop`) the warm process that commands from this environment
are handed to, so they skip the ~1 s of imports a cold command pays before its work (docs/warm.md)."""

from __future__ import annotations

import argparse
import fcntl
import os
import socket
import subprocess
import sys
import time
from typing import Any

from ckptvault_cli.output import say
from ckptvault_cli.preflight import EXIT_FAILED, EXIT_OK, UsageError
from ckptvault_cli.warm import protocol as proto

START_TIMEOUT_S = 120.0  # its imports take ~1-2 s on a quiet box, far longer on one that is swapping

# The warm process's entry: the console script's own directory first on its path, as a cold command has.
_BOOT = (
    "import sys; sys.path[0] = sys.argv.pop(1); from ckptvault_cli.entry import warm_process; sys.exit(warm_process())"
)


def ask(path: str, op: str) -> dict[str, Any] | None:
    """The warm process's answer to `op` (status, stop); None when nothing answers at `path`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10.0)
    try:
        sock.connect(path)
        proto.send(sock, {"op": op, "v": proto.VERSION})
        reply, _ = proto.receive(sock)
        return reply
    except (OSError, EOFError, ValueError):
        return None
    finally:
        sock.close()


def cmd_warm(args: argparse.Namespace) -> int:
    directory, path = proto.runtime_dir(), proto.socket_path()
    log = proto.log_path(path)
    if args.stop or args.status:
        reply = ask(path, "stop" if args.stop else "status") if os.path.exists(path) else None
        if reply is None:
            say("ckptvault: no warm process serves this environment; commands start cold (`ckptvault warm` starts one)")
            return EXIT_OK if args.stop else EXIT_FAILED
        verb = "stops after its running commands" if args.stop else "is running"
        say(
            f"ckptvault: warm process {reply['pid']} {verb}: {reply['served']} command(s) served, "
            f"{reply['running']} running; log: {log}"
        )
        return EXIT_OK
    if args.idle_minutes <= 0:
        raise UsageError(f"--idle-minutes {args.idle_minutes:g}: give a positive number of minutes")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as e:
        raise UsageError(
            f"cannot create {directory} for the warm process's socket ({e.strerror}): set {proto.DIR_ENV} to a"
            " directory of yours"
        ) from None
    if not proto.private_dir_ok(directory):
        raise UsageError(
            f"{directory} is not private to you (another owner, or group/other access): a warm process's socket"
            f" there could be used by others. `chmod 700 {directory}` if it is yours, or set {proto.DIR_ENV} to"
            " a directory only you can open"
        )
    with open(path.removesuffix(".sock") + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two `ckptvault warm` at once: the second finds the first's
        return _start(path, log, args.idle_minutes)


def _start(path: str, log: str, idle_minutes: float) -> int:
    reply = ask(path, "status") if os.path.exists(path) else None
    if reply is not None:
        say(f"ckptvault: warm process {reply['pid']} already serves this environment; log: {log}")
        return EXIT_OK
    script = sys.argv[0]  # the console script: its directory; `python -m ...`: the working directory
    bindir = os.getcwd() if not script or script.endswith(".py") else os.path.dirname(os.path.abspath(script))
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, bindir, "--socket", path, "--idle-minutes", f"{idle_minutes:g}"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd="/",
        )  # fmt: skip
    t0 = time.monotonic()
    while time.monotonic() - t0 < START_TIMEOUT_S:
        if proc.poll() is not None:
            say(f"ckptvault: the warm process exited ({proc.returncode}) before it was ready; its log, {log}:")
            say(_tail(log))
            return EXIT_FAILED
        reply = ask(path, "status") if os.path.exists(path) else None
        if reply is not None:
            say(
                f"ckptvault: warm process {reply['pid']} ready in {time.monotonic() - t0:.1f} s: commands from this"
                f" environment now start in it. It stops after {idle_minutes:g} min without a command,"
                f" or with `ckptvault warm --stop`; log: {log}"
            )
            return EXIT_OK
        time.sleep(0.05)
    proc.kill()
    say(f"ckptvault: the warm process was not ready after {START_TIMEOUT_S:.0f} s and was stopped; its log, {log}:")
    say(_tail(log))
    return EXIT_FAILED


def _tail(log: str, lines: int = 20) -> str:
    try:
        with open(log, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).rstrip()
    except OSError as e:
        return f"(unreadable: {e})"
