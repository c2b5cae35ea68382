"""Running the bench's child processes: measured (wall time, CPU, peak memory of the process tree) or
quiet, and the timestamped progress lines printed around them."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

running: list[subprocess.Popen[bytes]] = []  # the child being measured, killed on Ctrl-C


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def measure(
    cmd: Sequence[str], env: dict[str, str], logfile: Path, timeout: float = 3600, stdout: Path | None = None
) -> dict[str, Any]:
    """Wall time, CPU (user+sys of the child and its waited-for descendants, from wait4) and peak RSS.
    `stdout`: the child's stdout goes to this file (e.g. a --json document to parse), its stderr to the log."""
    with open(logfile, "ab") as out, open(stdout or os.devnull, "wb") as doc:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        t0 = time.perf_counter()
        p = subprocess.Popen(
            list(cmd),
            env=env,
            stdout=doc if stdout else out,
            stderr=out if stdout else subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        running.append(p)
        hwm = tree = pss = 0
        polls = 0
        try:
            deadline = t0 + timeout
            while True:
                hwm = max(hwm, _status_kib(p.pid, b"VmHWM:"))
                tree = max(tree, _tree_rss_kib(p.pid))
                if polls % 5 == 0:  # smaps_rollup walks every mapping: 50 ms keeps the probe light
                    pss = max(pss, _tree_kib(p.pid, _pss_kib))
                polls += 1
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    break
                if time.perf_counter() > deadline:
                    p.kill()
                    pid, status, ru = os.wait4(p.pid, 0)
                    break
                time.sleep(0.01)
            seconds = time.perf_counter() - t0
            p.returncode = os.waitstatus_to_exitcode(status)
        finally:
            running.remove(p)
    return {
        "seconds": seconds,
        "cpu_seconds": ru.ru_utime + ru.ru_stime,
        "user_seconds": ru.ru_utime,
        "sys_seconds": ru.ru_stime,
        # Peak RSS: the child's VmHWM, polled every 10 ms. Not ru_maxrss: after fork+exec it keeps the
        # high-water mark of the forking parent (this ~80 MiB bench process), a floor under every tool.
        # The process tree: the child plus everything it started and has not reaped (ckptvault's quality
        # gates run in a child process of their own), summed, sampled every 10 ms. The table reports the
        # larger of the two, so moving memory into a subprocess cannot hide it.
        "max_rss_mib": max(hwm, tree) / 1024,
        "process_hwm_mib": hwm / 1024,
        "tree_rss_mib": tree / 1024,
        # The same tree's proportional set size (smaps_rollup Pss, every 50 ms): a page shared by the
        # parent and its child (the Python binary, libssl, numpy's .so) counts once, not once per
        # process as in the RSS sum. Reported beside the RSS column, never instead of it.
        "tree_pss_mib": pss / 1024,
        "ru_maxrss_mib": ru.ru_maxrss / 1024,
        "rc": p.returncode,
    }


def _status_kib(pid: int, field: bytes) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                kids.extend(int(x) for x in f.read().split())
    except (OSError, ValueError):
        pass
    return kids


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _tree_kib(pid: int, of: Callable[[int], int]) -> int:
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += of(p)
        todo.extend(_children(p))
    return total


def _tree_rss_kib(pid: int) -> int:
    return _tree_kib(pid, lambda p: _status_kib(p, b"VmRSS:"))


def run_quiet(cmd: Sequence[str], env: dict[str, str] | None = None, check: bool = True, **kw: Any) -> str:
    r = subprocess.run(list(cmd), env=env, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return str(r.stdout)
