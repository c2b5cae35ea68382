"""A warm process whose code or package data changed on disk since its imports refuses the next command,
which runs cold and gives the same result, and the warm process stops (ckptvault_cli/warm/fresh.py).

No store: `--config missing.toml ls` exits 2 with its one line wherever it runs, and which process ran it
is read from the warm process's log. The warm process runs from a copy of the packages, so the file
changed here is the copy's."""

from __future__ import annotations

import importlib.machinery
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptvault_cli.warm import protocol as proto

REPO = Path(__file__).resolve().parents[2]
SERVED = re.compile(r"child (\d+) `([^`]*)` exit (-?\d+)")

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def copy() -> Iterator[tuple[Path, dict[str, str]]]:
    """The packages copied (bytecode caches left behind), and an environment whose commands import them."""
    directory = Path(tempfile.mkdtemp(prefix="cvs-"))  # short: a Unix socket's path is limited to 107 bytes
    src = directory / "src"
    for name in ("ckptvault", "ckptvault_cli", "ckptvault_prefect"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    # a compiled extension of ckptvault's own (none ships today): the stamp must cover one too
    (src / "ckptvault" / f"_probe{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"\x7fELF")
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "CKPTVAULT_PREFECT", proto.OFF_ENV)}
    env.update(PYTHONPATH=str(src), **{proto.DIR_ENV: str(directory / "w")})
    (directory / "w").mkdir(mode=0o700)
    yield src, env
    _cli(env, src, "warm", "--stop")
    shutil.rmtree(directory, ignore_errors=True)


def _cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ckptvault_cli.entry", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=cwd)


def _log(env: dict[str, str]) -> str:
    return Path(proto.log_path(proto.socket_path(env))).read_text()


def _touch(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


@pytest.mark.parametrize("changed", ["ckptvault/data/prices.toml", "ckptvault/_probe"])
def test_a_changed_file_makes_the_warm_process_refuse_and_the_command_run_cold(
    copy: tuple[Path, dict[str, str]], changed: str
) -> None:
    src, env = copy
    started = _cli(env, src, "warm", "--idle-minutes", "5")
    assert started.returncode == 0 and "ready in" in started.stderr, started.stderr
    missing = str(src / "missing.toml")
    warm = _cli(env, src, "--config", missing, "ls")
    assert warm.returncode == 2 and "missing.toml does not exist" in warm.stderr, warm.stderr
    assert [m[2] for m in SERVED.finditer(_log(env))] == [f"--config {missing} ls"]  # the warm process ran it

    path = src / changed if changed.endswith(".toml") else next((src / "ckptvault").glob("_probe.*"))
    _touch(path)
    cold = _cli(env, src, "--config", missing, "ls")
    assert (cold.returncode, cold.stdout, cold.stderr) == (warm.returncode, warm.stdout, warm.stderr)
    log = _log(env)
    assert len(SERVED.findall(log)) == 1, log  # not the warm process's: it ran cold
    assert f"refused `--config {missing} ls`: stale" in log, log
    assert "code or settings changed on disk since the imports" in log
    deadline = time.monotonic() + 30
    while os.path.exists(proto.socket_path(env)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(proto.socket_path(env))  # it stopped: the next `ckptvault warm` starts afresh
