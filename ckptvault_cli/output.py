"""What every command prints besides its own lines: messages on stderr, the one `--json` document on stdout."""

from __future__ import annotations

import os
import select
import sys

# 128 + SIGPIPE: what a shell reports for a tool that wrote to a pipe whose reader had gone (`| head`)
EXIT_PIPE = 141


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def emit_json(doc: object) -> None:
    """The one JSON document a `--json` command prints on stdout (schemas in docs/commands.md)."""
    from ckptvault_cli import profiling
    from ckptvault_cli.json_text import dumps

    if profiling.hold_json(doc):  # --profile: printed at the end, with its `profile` key
        return
    print(dumps(doc), flush=True)


def let_go_of_closed_stdout() -> bool:
    """After a BrokenPipeError: True when it was stdout's reader that went away (`ckptvault ls | head`),
    and fd 1 (fd 2 too when its reader is the same gone one, `2>&1 | head`) now points at /dev/null, so
    what is still buffered or printed later is dropped instead of raising again at the next flush or at
    exit. False: stdout is fine, the broken pipe was another one (a socket, a child's pipe): a real error.
    SIGPIPE itself stays ignored (Python's default): a reset S3 connection must raise, not end the process."""
    if not _reader_gone(1):
        return False
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            if fd == 1 or _reader_gone(fd):
                os.dup2(null, fd)
    finally:
        os.close(null)
    return True


def _reader_gone(fd: int) -> bool:
    # Linux reports POLLERR on a pipe's write end once it has no reader (POLLHUP: a socket closed by its peer)
    poller = select.poll()
    try:
        poller.register(fd, select.POLLOUT)
    except (OSError, ValueError):
        return False
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
