"""The `ckptvault` command line: an entry layer beside deployments. It may drive flows.

Exit codes: 0 success; 1 the work ran but something did not end well (an invalid checkpoint, a
failed upload, a failed drill); 2 bad input or an unusable environment (config, paths, store),
reported before anything is touched; 141 stdout's reader went away (`ckptvault ls | head`), as a shell
reports a tool SIGPIPE ended.
"""

from __future__ import annotations

import time

# As early as main.py can: `--profile` charges the interpreter's start up to here to "process start"
# and from here to the command's start to "imports" (ckptvault_cli/profiling.py).
_T_MAIN = time.perf_counter()

import argparse  # noqa: E402
import atexit  # noqa: E402
import contextlib  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import NoReturn  # noqa: E402

from ckptvault.command import memo  # noqa: E402
from ckptvault.config import ConfigError  # noqa: E402
from ckptvault.errors import CkptvaultError  # noqa: E402
from ckptvault_cli import process, profiling  # noqa: E402
from ckptvault_cli.output import EXIT_PIPE, let_go_of_closed_stdout, say  # noqa: E402
from ckptvault_cli.parser import build_parser  # noqa: E402
from ckptvault_cli.preflight import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, UsageError  # noqa: E402

__all__ = ["build_parser", "main", "run"]

# The command's first line of Python: _T_MAIN here, the console script's own in a warm process's child.
_main_started = [_T_MAIN]


def main(argv: Sequence[str] | None = None) -> int:
    started = _main_started[-1] if process.one_shot() else time.perf_counter()
    parser = build_parser()
    args = parser.parse_args(argv)
    fn: Callable[[argparse.Namespace], int] = args.fn
    if getattr(args, "profile", False):
        profiling.begin(args.command, bool(getattr(args, "json", False)), started, process.one_shot())
    try:
        with memo.command():  # the config, the bucket probes: read once by the command and its flow
            return fn(args)
    except (ConfigError, UsageError) as e:
        say(f"ckptvault: {e}")
        return EXIT_USAGE
    except CkptvaultError as e:  # the work ran and ckptvault said why it stopped: no traceback
        say(f"ckptvault: {e}")
        return EXIT_FAILED
    except BrokenPipeError:
        # the reader of stdout went away (`ckptvault ls --json | head`): end quietly, as a Unix tool
        # ended by SIGPIPE does; a broken pipe of the work's own (stdout still read) is a bug, traceback
        if not let_go_of_closed_stdout():
            raise
        return EXIT_PIPE
    except KeyboardInterrupt:
        say("ckptvault: interrupted; rerun the same command to continue where it stopped")
        return EXIT_INTERRUPTED
    finally:
        if not process.one_shot():  # in-process (tests): now; the console script's last exit handler else
            profiling.finish(shutdown=False)


# After Ctrl-C the work gets this long to stop by itself (a flow run reports its state to the server),
# then the process ends anyway: Prefect's task runner otherwise waits for an upload in flight to finish.
INTERRUPT_GRACE_S = 3.0


def _on_interrupt(signum: int, frame: object) -> None:
    """The first SIGINT interrupts as Python does by default, with a deadline: a hard exit (130, the
    message) if the process is still here INTERRUPT_GRACE_S later. Nothing committed is at risk: the
    manifest is written last, and a rerun resumes what was in flight."""

    def deadline() -> None:
        say("ckptvault: interrupted; rerun the same command to continue where it stopped")
        os._exit(EXIT_INTERRUPTED)

    timer = threading.Timer(INTERRUPT_GRACE_S, deadline)
    timer.daemon = True
    timer.start()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    raise KeyboardInterrupt


_exit_code: list[int] = []


def _end_process() -> None:
    """The last exit handler (registered first, run last): every Python-level handler has run
    (Prefect's log and event drains, non-daemon threads joined), so the interpreter's own teardown
    is skipped. It buys nothing for a process about to end, and Arrow's C++ thread pools, torn down
    in it, sometimes abort the process ("terminate called without an active exception", exit -6)
    after a command that read the catalog had already printed its result: a wrong exit code for a
    command that worked, or an exit 2 reported as a crash."""
    code = _exit_code[-1] if _exit_code else EXIT_FAILED
    try:
        profiling.finish(shutdown=True)  # after every other exit handler: the shutdown is on it
    except BrokenPipeError:  # the held --json document: its reader has gone (see below)
        code = _output_lost(code)
    logging.shutdown()
    try:
        sys.stdout.flush()  # what a command printed without flushing reaches a pipe only here
    except BrokenPipeError:
        code = _output_lost(code)
    except (OSError, ValueError):  # stdout closed or unusable: nothing more can reach it
        pass
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    os._exit(code)


def _output_lost(code: int) -> int:
    """The exit code of a command whose output's reader went away before its end (`ckptvault plan | head -1`):
    what a shell reports for a tool SIGPIPE ended, instead of a success, and nothing on stderr."""
    if not let_go_of_closed_stdout():
        return code  # stdout's reader is still there: nothing to say of it at exit
    return EXIT_PIPE if code == 0 else code


def run() -> NoReturn:
    """The console-script entry (`ckptvault`): `main` in a process that ends with it."""
    prepare_one_shot()
    run_prepared()


def prepare_one_shot() -> None:
    """What a process that will run one command sets up before anything else is imported: the exit
    handler that must run last (so registered first) and collection off. A warm process does this once,
    before its imports; each child it forks then calls `run_prepared` (ckptvault_cli/warm/server.py)."""
    atexit.register(_end_process)
    process.begin_one_shot()


def run_prepared() -> NoReturn:
    """`main` on sys.argv in a process `prepare_one_shot` set up, ending the process with its code."""
    signal.signal(signal.SIGINT, _on_interrupt)
    try:
        rc = main()
    except SystemExit as e:  # argparse's own exits (--help 0, a usage error 2) keep their code
        _exit_code.append(e.code if isinstance(e.code, int) else 0 if e.code is None else EXIT_FAILED)
        raise
    profiling.returned()
    process.end_one_shot()
    if rc == EXIT_INTERRUPTED:
        # Worker threads may still be inside a part upload: an ordinary exit would join them first.
        # Nothing needs them: the work is committed only after every file is verified, and a rerun
        # resumes what they leave half-done.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a reader gone too: nothing more can reach it
                stream.flush()
        os._exit(rc)
    _exit_code.append(rc)
    sys.exit(rc)


if __name__ == "__main__":
    run()
