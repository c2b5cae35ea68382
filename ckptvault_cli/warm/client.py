"""The command's side of a warm process: hand this command to it, relay signals, end with its exit code.

Standard library only, imported first by the console script (ckptvault_cli/entry.py). Every way of not
finding a usable warm process (none started, another environment, a stale socket, a warm process that
refuses) returns None and the command runs cold, in this process, exactly as before: looking costs a
stat and, where a socket exists, a connect.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
from collections.abc import Sequence

from ckptvault.command import process_clock
from ckptvault_cli.warm import protocol as proto

# Never handed over: `warm` manages the warm process itself, `serve` is a long-lived process of its own.
COLD_COMMANDS = frozenset({"warm", "serve"})
# What a user's terminal or supervisor sends: the child gets it as a cold command would have. The
# terminal's own (Ctrl-C, Ctrl-\\) go to the child's process group, as a terminal sends them to the
# command's and every process it started; the others to the child alone.
RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
TO_GROUP = (signal.SIGINT, signal.SIGQUIT)
# Waiting for the warm process to fork the command's child (it does nothing else first): beyond this it
# is stopped or stuck, and the command runs cold (a child forked later finds the command gone and is
# interrupted at once).
START_TIMEOUT_S = 20.0


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand: the first word that is neither an option nor `--config`'s value."""
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif len(a) > 2 and "--config".startswith(a):  # argparse takes `--conf X` for `--config X` too
            skip = True
        elif not a.startswith("-"):
            return a
    return None


def _streams() -> list[int]:
    """fds 0, 1 and 2 as they are; one that is closed is sent as /dev/null (a cold process would fail to
    write to it too, but would not fail to start)."""
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def hand_off(argv: Sequence[str], t_main: float) -> int | None:
    """Run `ckptvault argv` in this environment's warm process and return its exit code (negative: the
    signal that ended it); None: there is none to use, run cold."""
    if os.environ.get(proto.OFF_ENV) == "0" or command_of(argv) in COLD_COMMANDS:
        return None
    directory = proto.runtime_dir()
    if not proto.private_dir_ok(directory):
        return None
    streams = _streams()  # before the socket: a closed 0-2 must not become the socket's number
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(START_TIMEOUT_S)
    try:
        sock.connect(os.path.join(directory, f"warm-{proto.fingerprint()}.sock"))
        request = {
            "op": "run",
            "v": proto.VERSION,
            "argv0": sys.argv[0],
            "argv": list(argv),
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "umask": _umask(),
            "t_process": process_clock.started(),
            "t_main": t_main,
        }
        proto.send(sock, request, streams)
        reply, _ = proto.receive(sock)
        sock.settimeout(None)
    except (OSError, EOFError, ValueError):
        sock.close()
        return None
    if "pid" not in reply:  # refused: another version, stale code, another environment
        sock.close()
        return None
    return _wait(sock, int(reply["pid"]))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _wait(sock: socket.socket, pid: int) -> int:
    def relay(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):  # it has just ended: its exit code is on the way
            if signum in TO_GROUP:
                try:
                    os.killpg(pid, signum)
                    return
                except ProcessLookupError:
                    pass  # not yet its own group leader
            os.kill(pid, signum)

    for sig in RELAYED:
        signal.signal(sig, relay)
    while True:
        try:
            reply, _ = proto.receive(sock)
        except InterruptedError:
            continue
        except (OSError, EOFError, ValueError):
            _outlive(pid)
            print(
                f"ckptvault: the warm process ended while it ran this command (process {pid}); its outcome is"
                " unknown: rerun the same command, which continues where it stopped, and see the warm"
                " process's log next to its socket",
                file=sys.stderr,
            )
            return 1
        if "exit" in reply:
            return int(reply["exit"])


def _outlive(pid: int) -> None:
    """Wait for the child itself (signals still relayed) when the warm process that would have told its
    exit code is gone: the command ends when its work does, not before."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return  # already gone, or no pidfd here
    try:
        while True:
            try:
                select.select([fd], [], [])
                return
            except InterruptedError:
                continue
    finally:
        os.close(fd)


def exit_with(code: int) -> None:
    """End this process as the child ended: its exit code, or the signal that killed it."""
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL, SIGSTOP: no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), -code)  # a signal whose default is not to end: the shell's 128 + n below
        code = 128 - code
    os._exit(code)
