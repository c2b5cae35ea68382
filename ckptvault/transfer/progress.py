"""A terminal progress bar for long uploads and downloads; silent when stderr is not a terminal."""

from __future__ import annotations

import io
import sys
import threading
import time
from typing import Any, TextIO

from ckptvault.clock import timing


class ProgressBar:
    """Thread-safe: file transfers report bytes from several worker threads."""

    def __init__(
        self, total: int, label: str, stream: TextIO | None = None, min_interval: float = 0.2, unit: str = "B"
    ) -> None:
        self.total = max(total, 1)
        self.label = label
        self.unit = unit  # "B": bytes, shown as MiB/s; anything else is a count of that thing
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = self._stream.isatty()
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._last = 0.0
        self._min_interval = min_interval

    def __reduce__(self) -> tuple[Any, tuple[int, str, TextIO, float, str]]:
        # sent to another process (a Dask worker): it has no terminal of ours to draw on
        return ProgressBar, (self.total, self.label, io.StringIO(), self._min_interval, self.unit)

    def __call__(self, nbytes: int) -> None:
        if self.unit == "B" and nbytes > 0:
            timing.mark(timing.FIRST_BYTE)  # for --profile: when the transfer's first bytes moved
        with self._lock:
            self.done += nbytes
            now = time.monotonic()
            if self._enabled and (now - self._last >= self._min_interval or self.done >= self.total):
                self._last = now
                self._render(now)

    def _render(self, now: float) -> None:
        frac = min(self.done / self.total, 1.0)
        per_s = self.done / max(now - self._start, 1e-6)
        rate = f"{per_s / 2**20:7.1f} MiB/s" if self.unit == "B" else f"{self.done}/{self.total} {self.unit}"
        bar = "#" * int(frac * 30)
        self._stream.write(f"\r{self.label} [{bar:<30}] {frac:6.1%} {rate}")
        if self.done >= self.total:
            self._stream.write("\n")
        self._stream.flush()
