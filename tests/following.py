"""`ckptvault follow` as its own process, for the tests that run it beside a writer: its output read as
it comes (a thread per stream), so a test can wait for a line, then stop it with Ctrl-C."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]


class Follower:
    def __init__(self, cfg: Path, env: Mapping[str, str], *args: str, entry: str = "ckptvault_cli.main") -> None:
        """`entry`: ckptvault_cli.entry to start it as the console script does (through a warm process)."""
        cmd = [sys.executable, "-m", entry, "--config", str(cfg), "follow", *args]
        self.proc = subprocess.Popen(
            cmd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [self._reader(self.proc.stdout, self.out), self._reader(self.proc.stderr, self.err)]

    @staticmethod
    def _reader(stream: IO[str] | None, into: list[str]) -> threading.Thread:
        def run() -> None:
            assert stream is not None
            for line in stream:
                into.append(line.rstrip("\n"))

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    def wait_line(self, want: str, timeout: float, stream: str = "out") -> str:
        """The first line of stdout (or stderr) containing `want`, waiting up to `timeout` seconds (a
        bound, never an expectation of speed); fails naming what it saw."""
        lines = self.out if stream == "out" else self.err
        deadline = time.monotonic() + timeout
        while True:
            hit = next((ln for ln in list(lines) if want in ln), None)
            if hit is not None:
                return hit
            if self.proc.poll() is not None or time.monotonic() > deadline:
                time.sleep(0.2)  # the readers' last lines
                hit = next((ln for ln in list(lines) if want in ln), None)
                assert hit is not None, (
                    f"follow: no {want!r} within {timeout:g} s (exit {self.proc.poll()}):\n"
                    + "\n".join(self.out[-30:] + self.err[-30:])
                )
                return hit
            time.sleep(0.1)

    def started(self, timeout: float = 120.0) -> list[str]:
        """Its lines up to "Ctrl-C stops": the mechanisms chosen and the watches in place."""
        self.wait_line("Ctrl-C stops", timeout, "err")
        return list(self.err)

    def stop(self) -> int:
        """Ctrl-C, and its exit code once it and its readers are done (killed if it does not stop)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        for t in self._threads:
            t.join(10)
        return code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
