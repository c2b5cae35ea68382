"""A warm command that ends for its user before its process does (docs/warm.md, "The result before the
bookkeeping").

A command run by the warm process (ckptvault_cli/warm/server.py) is a child whose user waits on the
console script, which exits with the code the warm process sends it. When a restore's result is final
(ckptvault/command/early_result.py: the bytes durable in place and recorded), the child prints it, then
`release`s: its standard streams are moved to the warm process's log and the code is written to a pipe
the warm process reads, which sends it to the command at once. The child goes on with the alert, the
ledger and the flow run's end, as before, with its output in the log. A cold process has no pipe
(`armed` is False) and ends as it always did.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

_pipe: int | None = None  # the write end of the warm process's pipe for this child
_log: int | None = None  # the warm process's log, open for appending
_code: int | None = None
# held off while the streams move: the relayed Ctrl-C of a user who already has the result
_HELD = {signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP}


def arm(pipe: int, log: int) -> None:
    """In a warm child, before the command runs: `pipe` reaches the warm process, `log` is its log."""
    global _pipe, _log, _code
    _pipe, _log, _code = pipe, log, None


def armed() -> bool:
    return _pipe is not None and _code is None


def released() -> int | None:
    """The exit code the user was given, if the command was released before its end."""
    return _code


def release(code: int) -> bool:
    """End the command for its user with `code` now; this process goes on, its output in the warm log.
    False (nothing done) outside a warm child or when already released. Ctrl-C and Ctrl-\\ are ignored
    from here on (the command they were typed at has ended; the work left is bookkeeping), and held off
    while the streams move, so the user never gets 130 after the result."""
    global _pipe, _code
    if _pipe is None or _log is None or _code is not None:
        return False
    _code = code  # from here the result is given: never printed again, whatever fails below
    pipe, _pipe = _pipe, None
    main = threading.current_thread() is threading.main_thread()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        if main:  # only the main thread may set handlers; a listener runs on the announcing thread
            for sig in (signal.SIGINT, signal.SIGQUIT):
                signal.signal(sig, signal.SIG_IGN)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can reach it anyway
                stream.flush()
        # the user's terminal or pipes are let go before the code is sent: nothing of this process reaches
        # them after the prompt comes back, and a reader waiting for their end (`$(...)`, `| tee`) gets it now
        os.dup2(_log, 1)
        os.dup2(_log, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        with contextlib.suppress(OSError):  # the warm process is gone: the command waits for this child's end
            os.write(pipe, f"{code}\n".encode())
    finally:
        os.close(pipe)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return True
