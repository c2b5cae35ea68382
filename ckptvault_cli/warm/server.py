"""The warm process (`ckptvault warm`): imports what every command imports once, then forks one child per
command, which runs it as the cold process would have (docs/warm.md).

A cold `ckptvault restore` spends ~1 s of its first bytes' wait importing Prefect, pydantic, pyarrow and
boto before it does anything (issue [W]). Here that is done once, when the warm process starts. Each
command the console script hands over (ckptvault_cli/warm/client.py) gets a child forked from this
single-threaded process: the command's own standard streams (passed as descriptors), its working
directory, environment, umask and argv, and then the same `main` the cold process runs, with the same
exit handler last (registered here before any import). One process per command, as before: its own
memory, threads, exit and signals (the command relays what it receives). This process only reaps the
children and tells each command its child's exit code; a command that goes away (closed terminal,
SIGKILL) has its child interrupted as Ctrl-C would.

What a warm process will not run, so the command runs cold instead: a command from another environment
(another socket), after ckptvault, Prefect or the interpreter's packages changed on disk, or from a
working directory with Prefect settings files (ckptvault_cli/warm/fresh.py): it would run code or
settings other than the command's. The spare Great Expectations child is spare.py's. It stops
after `--idle-minutes` without a command, on `ckptvault warm --stop`, or when it finds itself stale;
commands it is running finish first.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ckptvault_cli.warm import fresh
from ckptvault_cli.warm import protocol as proto
from ckptvault_cli.warm.spare import Spare, gated
from ckptvault_prefect.runtime import preload

# Signals a command's child must not miss between its fork and its own handlers (blocked around the fork)
CHILD_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2}


def _log(msg: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # a full disk under the log must not stop the commands
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} warm[{os.getpid()}]: {msg}", file=sys.stderr, flush=True)


@dataclass
class _Child:
    conn: socket.socket | None  # None: the command went away, or was released (`_released`)
    argv: list[str]
    started: float
    release: int | None = None  # the read end of the child's early-exit pipe (ckptvault_cli/warm/early_exit.py)
    released: int | None = None  # the exit code the command was given before the child's end


@dataclass
class _State:
    listener: socket.socket
    path: str
    wake: tuple[int, int]
    stamp: str
    extensions: tuple[str, ...]  # the compiled extensions loaded by the imports: `stamp` covers them
    idle_s: float
    env: dict[str, str]
    inode: int
    pid: int = field(default_factory=os.getpid)
    children: dict[int, _Child] = field(default_factory=dict)
    spare: Spare = field(default_factory=lambda: Spare(_log))
    served: int = 0
    accepting: bool = True
    last: float = field(default_factory=time.monotonic)
    started: float = field(default_factory=time.time)


@dataclass(frozen=True)
class CommandLine:
    """What a child runs: the command line's own entry (ckptvault_cli/main.py), the same `main` a cold
    process runs. Handed in by ckptvault_cli/entry.py rather than imported here: the commands import this
    package (the protocol, the early exit), so an import of the command line from it would point back up."""

    prepare_one_shot: Callable[[], None]
    run_prepared: Callable[[], NoReturn]
    main_started: list[float]  # the command's first line of Python: the console script's, in a child


def main(command_line: Callable[[], CommandLine], argv: Sequence[str] | None = None) -> int:
    """`command_line()`: the command line's entry, imported when called (its imports count in the warm
    process's start, as the rest of its preload)."""
    ap = argparse.ArgumentParser(prog="ckptvault-warm")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--idle-minutes", type=float, default=60.0)
    args = ap.parse_args(argv)

    t0 = time.monotonic()
    cli_main = command_line()
    cli_main.prepare_one_shot()
    for name in preload.COMMAND:
        importlib.import_module(name)
    _complete_models()
    _make_tasks()
    from ckptvault.store import s3_client
    from ckptvault_cli import process
    from ckptvault_cli.preflight import QUIET_PREFECT

    s3_client.prime()  # S3's service model parsed here, not in each command's first client (~57 ms)
    process.prepare_flow_settings(QUIET_PREFECT)  # a flow run's Prefect settings made here, not in each child (~26 ms)
    process.prepare_prefect_client()  # and its first Prefect client (~20 ms)
    gc.freeze()  # what the imports built lives as long as this process and every child: never collected
    if threading.active_count() != 1:  # a fork would copy a thread's locks, not the thread
        names = [t.name for t in threading.enumerate()]
        _log(f"not starting: the imports started threads {names}; commands run cold")
        os._exit(1)
    state = _listen(args.socket, args.idle_minutes * 60)
    _log(f"ready in {time.monotonic() - t0:.2f} s at {args.socket}; {len(sys.modules)} modules imported")
    become: _Become | None = None
    try:
        _serve(state)
    except _Become as child:  # in a child: the warm process's frames are gone; the command starts here
        become = child
    finally:
        if os.getpid() == state.pid:
            _close(state)
    if become is None:
        _log(f"stopped after {state.served} command(s)")
        os._exit(0)  # not through the exit handlers registered for the children
    _become_command(state, become, cli_main)
    cli_main.run_prepared()  # ends as a cold process ends: SystemExit, thread joins, exit handlers


class _Become(BaseException):  # not an error: a child leaving the warm process's loop, past every except Exception
    """Raised in a freshly forked child, caught by `main` once the warm process's frames are gone."""

    def __init__(self, conn: socket.socket, request: dict[str, Any], fds: list[int], release: int) -> None:
        super().__init__("a command's child")
        self.conn, self.request, self.fds, self.release = conn, request, fds, release


def _complete_models() -> None:
    """Build now what pydantic builds at a model's first use: Prefect defers its client schemas (flow
    run, state, event, artifact models) until then, and every command's child would build them again
    (~0.1-0.2 s of CPU before its flow run exists). A model whose references still cannot be resolved
    stays as it was, to be built (or to fail) where it is used, as in a cold process."""
    import pydantic

    seen: set[type[pydantic.BaseModel]] = set()
    stack: list[type[pydantic.BaseModel]] = [pydantic.BaseModel]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub in seen:
                continue
            seen.add(sub)
            stack.append(sub)
            if not getattr(sub, "__pydantic_complete__", True):
                with contextlib.suppress(Exception):
                    sub.model_rebuild(raise_errors=False)


def _make_tasks() -> None:
    """Make every flow step's Prefect task now: a step makes it at its first use as one
    (ckptvault_prefect/tasks/step.py), and every child would make the same ones again (163 steps in
    31 ms here; a restore's child made 5, ~2 ms with the first one's set-up)."""
    from ckptvault_prefect.tasks.step import Step

    for name, module in list(sys.modules.items()):
        if name.startswith("ckptvault_prefect.") and module is not None:
            for value in list(vars(module).values()):
                if isinstance(value, Step):
                    _ = value.task


def _listen(path: str, idle_s: float) -> _State:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # `ckptvault warm` checked that nothing answers there
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # select wakes on the pipe; children are reaped below
    signal.signal(signal.SIGINT, lambda *_: None)  # SIGTERM stops it (_serve); a stray Ctrl-C does not
    extensions = fresh.loaded_extensions()
    env = proto.comparable(os.environ)
    return _State(listener, path, (r, w), fresh.stamp(extensions), extensions, idle_s, env, os.stat(path).st_ino)


def _close(state: _State) -> None:
    _stop_accepting(state)
    signal.set_wakeup_fd(-1)
    for fd in state.wake:
        os.close(fd)


def _stop_accepting(state: _State) -> None:
    if not state.accepting:
        return
    state.accepting = False
    with contextlib.suppress(OSError):
        if os.stat(state.path).st_ino == state.inode:  # not a newer warm process's socket
            os.unlink(state.path)
    state.listener.close()


def _serve(state: _State) -> None:
    term = [False]
    signal.signal(signal.SIGTERM, lambda *_: term.__setitem__(0, True))
    while state.accepting or state.children:
        if term[0]:
            _stop_accepting(state)
        if state.accepting and not state.children:
            state.spare.start()
        watched: list[Any] = [state.wake[0]]
        if state.accepting:
            watched.append(state.listener)
        watched += [c.conn for c in state.children.values() if c.conn is not None]
        watched += [c.release for c in state.children.values() if c.release is not None]
        timeout = None if state.children else max(0.0, state.last + state.idle_s - time.monotonic())
        if not state.accepting:
            timeout = 1.0
        try:
            ready, _, _ = select.select(watched, [], [], timeout)
        except InterruptedError:
            continue
        if not ready and not state.children and state.accepting:
            _log(f"idle for {state.idle_s / 60:g} min: stopping")
            _stop_accepting(state)
        for item in ready:
            if item == state.wake[0]:
                with contextlib.suppress(BlockingIOError):
                    os.read(state.wake[0], 512)
            elif item is state.listener:
                _accept(state)
            elif isinstance(item, int):
                _released(state, item)
            else:
                _command_gone(state, item)
        _reap(state)


def _command_gone(state: _State, conn: socket.socket) -> None:
    """The command sent nothing after its request: readable means it closed (killed, terminal gone)."""
    for pid, child in state.children.items():
        if child.conn is conn:
            with contextlib.suppress(OSError):
                if conn.recv(1):
                    return
            conn.close()
            child.conn = None
            _log(f"command of child {pid} went away: interrupting it")
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGINT)
            return


def _released(state: _State, fd: int) -> None:
    """A child wrote its command's exit code before its end (ckptvault_cli/warm/early_exit.py): the command
    is told now; the child goes on, output in this log. End of file: the child closed it (or ended)."""
    for pid, child in state.children.items():
        if child.release != fd:
            continue
        try:
            data = os.read(fd, 64)
        except OSError:
            data = b""
        if not data or child.released is not None:
            os.close(fd)
            child.release = None
            return
        try:
            code = int(data.split(b"\n", 1)[0])
        except ValueError:
            _log(f"child {pid} wrote {data!r} on its early-exit pipe: ignored; its command waits for its end")
            return
        child.released = code
        _log(f"child {pid} released its command with exit {code} after {time.monotonic() - child.started:.2f} s")
        if child.conn is not None:
            with contextlib.suppress(OSError):
                proto.send(child.conn, {"exit": code})
            child.conn.close()
            child.conn = None  # its end of the socket closing now is not the command going away
        return


def _reap(state: _State) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        child = state.children.pop(pid, None)
        if child is None:
            state.spare.ended(pid)
            continue
        code = os.waitstatus_to_exitcode(status)
        if child.release is not None:
            os.close(child.release)
        took = time.monotonic() - child.started
        after = "" if child.released is None else f" (its command was given exit {child.released} before)"
        _log(f"child {pid} `{' '.join(child.argv[:4])}` exit {code} after {took:.2f} s{after}")
        state.last = time.monotonic()
        if child.conn is not None:
            with contextlib.suppress(OSError):
                proto.send(child.conn, {"exit": code})
            child.conn.close()


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _accept(state: _State) -> None:
    try:
        conn, _ = state.listener.accept()
    except OSError:
        return
    fds: list[int] = []
    try:
        conn.settimeout(2.0)  # the command sends its request as it connects
        if _peer_uid(conn) != os.getuid():
            conn.close()
            return
        request, fds = proto.receive(conn, max_fds=3)
        op = request.get("op")
        state.last = time.monotonic()
        if op == "status":
            proto.send(conn, _status(state))
        elif op == "stop":
            proto.send(conn, {**_status(state), "stopping": True})
            _log("asked to stop")
            _stop_accepting(state)
        elif op == "run":
            refusal = _refusal(state, request, fds)
            if refusal:
                _log(f"refused `{' '.join(map(str, request.get('argv', [])[:4]))}`: {refusal}")
                proto.send(conn, {"refused": refusal})
            else:
                release = _fork(state, conn, request)
                if release is not None:  # in the child
                    become = _Become(conn, request, list(fds), release)
                    fds.clear()  # the child's now: not closed on the way out
                    raise become
                return
    except Exception as e:  # one request's trouble is not the warm process's end
        _log(f"a request that could not be served: {e!r}")
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    conn.close()


def _status(state: _State) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "served": state.served,
        "running": len(state.children),
        "started": state.started,
        "idle_minutes": state.idle_s / 60,
        "socket": state.path,
    }


def _refusal(state: _State, request: dict[str, Any], fds: list[int]) -> str | None:
    if request.get("v") != proto.VERSION:
        return f"protocol {request.get('v')}, this warm process speaks {proto.VERSION}"
    if len(fds) != 3:
        return "the command's standard streams did not arrive"
    if proto.comparable(request.get("env") or {}) != state.env:
        return "another environment"
    if threading.active_count() != 1:
        return "a thread is running in the warm process; a fork would copy its locks, not the thread"
    if fresh.prefect_settings_in(str(request.get("cwd", "/"))):
        return "the working directory has Prefect settings (.env, prefect.toml, [tool.prefect])"
    if fresh.stamp(state.extensions) != state.stamp:
        _stop_accepting(state)
        _log("code or settings changed on disk since the imports: stopping after the running commands")
        return "stale"
    return None


def _fork(state: _State, conn: socket.socket, request: dict[str, Any]) -> int | None:
    """In the child, the write end of its early-exit pipe; None in this process. The child is known to
    the command only once its pid reached it: if the command went away meanwhile, the child is
    interrupted at once, as Ctrl-C would."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()  # not inherited by what the child starts (close-on-exec)
    signal.pthread_sigmask(signal.SIG_BLOCK, CHILD_SIGNALS)
    try:
        pid = os.fork()
    except BaseException:
        os.close(read_end)
        os.close(write_end)
        raise
    if pid == 0:
        os.close(read_end)
        return write_end  # signals unblocked once the child's own handlers are in place
    signal.pthread_sigmask(signal.SIG_UNBLOCK, CHILD_SIGNALS)
    os.close(write_end)
    state.served += 1
    child = _Child(None, [str(a) for a in request["argv"]], time.monotonic(), release=read_end)
    state.children[pid] = child
    if gated(request.get("argv", [])):
        state.spare.hand_over(pid)
    try:
        conn.settimeout(None)
        proto.send(conn, {"pid": pid})
        child.conn = conn
    except OSError:
        conn.close()
        _log(f"the command of child {pid} went away before it started: interrupting it")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGINT)  # blocked until its handlers are set: then it is interrupted
    return None


def _become_command(state: _State, become: _Become, cli_main: CommandLine) -> None:
    """The child takes on the command's streams, directory, environment, umask, argv and start time."""
    conn, request, fds = become.conn, become.request, become.fds
    try:
        os.setpgid(0, 0)  # its own group: Ctrl-C reaches it and the processes it starts, as on a terminal
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a cold interpreter's
        for fd in state.wake:
            os.close(fd)
        state.listener.close()
        conn.close()
        for child in state.children.values():
            if child.conn is not None:
                child.conn.close()
            if child.release is not None:
                os.close(child.release)
        log = os.dup(2)  # this process's log, where the child's output goes once released
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.umask(int(request["umask"]))
        if not gated(request.get("argv", [])):
            Spare.leave()
        # a cold interpreter buffers stdout by line on a terminal, by block elsewhere; stderr by line
        sys.stdout.reconfigure(line_buffering=sys.stdout.isatty())  # type: ignore[union-attr]
        if sys.stderr.isatty():  # Prefect's console handler chose its colours for this process's log file
            from prefect.logging.configuration import setup_logging

            setup_logging(incremental=False)
        sys.argv = [str(request.get("argv0") or "ckptvault"), *request["argv"]]
        from ckptvault.command import process_clock
        from ckptvault_cli.warm import early_exit

        early_exit.arm(become.release, log)
        if request.get("t_process") is not None:
            process_clock.set_process_start(float(request["t_process"]))
        if request.get("t_main") is not None:
            cli_main.main_started[:] = [float(request["t_main"])]
    except BaseException as e:  # nothing of the command has run: say so on its stderr
        with contextlib.suppress(OSError):
            os.write(2, f"ckptvault: the warm process could not start this command ({e}); run it again\n".encode())
        os._exit(1)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, CHILD_SIGNALS)
