"""A command's result, known before the command's work is all done.

A restore's result is decided once its bytes are durable in place and the restore is recorded in the
catalog: what is left (the alert, the metrics ledger, the flow run's artifacts and final state) changes
nothing the user is told, yet takes 0.1 s on a quiet server and a Slack round trip more. The restore
announces its result here at that point (ckptvault/restore/complete.py); whoever listens (the warm
command line, docs/warm.md "The result before the bookkeeping") may report it and let the user go on
while the rest is done. Nobody listening: nothing happens, the result is returned at the end as
before. The library decides when a result is final; what to do with it is the entry layer's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("ckptvault.early_result")

Listener = Callable[[object], None]

_lock = threading.Lock()
_listeners: list[Listener] = []


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """`listener(result)` for each result announced within (called on the announcing thread)."""
    with _lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)


def announce(result: object) -> None:
    """`result` is final: tell the listeners. Never raises: a listener's failure is logged, and the
    work that announced goes on (its result is still returned at its end)."""
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(result)
        except Exception:
            log.exception("a listener for the early result failed; the result is reported at the end instead")
