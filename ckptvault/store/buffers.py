"""One process-wide memory budget for upload part buffers.

Every upload in a process (the ingest flow sends several files at once) takes its part buffers from
one `PartBuffers` pool, so peak memory is the budget, not part_size * concurrency * files in flight.
A reader that finds the budget spent waits until a part in flight is sent and its buffer given back.

Buffers are anonymous mmaps (page-aligned: reading a file into them is ~5x faster than into a
bytearray) and are recycled while any upload is running. When the last one is given back the pool
unmaps them all, so a long-running worker holds no part memory between passes.

Progress is guaranteed: a buffer larger than the whole budget (a file so big that its parts had to
grow, see upload.part_size_for) is still handed out when nothing else is in use.
"""

from __future__ import annotations

import contextlib
import mmap
import threading

from ckptvault.errors import InvalidArgumentError

_pools: dict[int, PartBuffers] = {}
_pools_lock = threading.Lock()


class PartBuffers:
    def __init__(self, budget: int) -> None:
        if budget <= 0:
            raise InvalidArgumentError(f"the part-buffer budget must be positive, got {budget}")
        self.budget = budget
        self._cond = threading.Condition()
        self._in_use = 0  # bytes handed out
        self._idle: dict[int, list[mmap.mmap]] = {}  # size -> buffers given back, ready to reuse
        self._idle_bytes = 0
        self.peak = 0  # the most bytes handed out at once (for tests and benchmarks)

    def take(self, size: int) -> mmap.mmap:
        """A buffer of exactly `size` bytes; blocks while the budget is spent by buffers in use."""
        with self._cond:
            while True:
                idle = self._idle.get(size)
                if idle:
                    buf = idle.pop()
                    self._idle_bytes -= size
                    return self._hand_out(buf, size)
                if self._in_use + self._idle_bytes + size <= self.budget or self._in_use == 0:
                    return self._hand_out(mmap.mmap(-1, size), size)
                if self._idle_bytes:
                    self._drop_one_idle()  # idle buffers of another size: make room for this one
                    continue
                self._cond.wait()

    def give(self, buf: mmap.mmap) -> None:
        with self._cond:
            size = len(buf)
            self._in_use -= size
            if self._in_use == 0:
                self._drop_all_idle()
                _close(buf)
            else:
                self._idle.setdefault(size, []).append(buf)
                self._idle_bytes += size
            self._cond.notify_all()

    @property
    def in_use(self) -> int:
        with self._cond:
            return self._in_use

    def _hand_out(self, buf: mmap.mmap, size: int) -> mmap.mmap:
        self._in_use += size
        self.peak = max(self.peak, self._in_use)
        return buf

    def _drop_one_idle(self) -> None:
        size, bufs = next((s, b) for s, b in self._idle.items() if b)
        _close(bufs.pop())
        self._idle_bytes -= size

    def _drop_all_idle(self) -> None:
        for bufs in self._idle.values():
            for b in bufs:
                _close(b)
        self._idle.clear()
        self._idle_bytes = 0


def _close(buf: mmap.mmap) -> None:
    with contextlib.suppress(BufferError):  # a view still held by a dying worker: GC unmaps it
        buf.close()


def shared(budget: int) -> PartBuffers:
    """The process's pool for this budget (one per distinct budget, normally exactly one)."""
    with _pools_lock:
        pool = _pools.get(budget)
        if pool is None:
            pool = _pools[budget] = PartBuffers(budget)
        return pool
