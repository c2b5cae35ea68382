"""Progress bars on a terminal, quiet otherwise: the real `ckptvault` console entry with its stderr on a
pseudo-terminal, then on a pipe."""

from __future__ import annotations

import os
import pty
import subprocess
from pathlib import Path
from typing import Any

from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config
from tests.reliability.conftest import REPO

MiB = 2**20
BAR = "] 100.0%"


def _console() -> str:
    return str(REPO / ".venv" / "bin" / "ckptvault")


def _run_on_tty(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run with stderr on a pseudo-terminal (stdout a pipe); returns (exit code, what the terminal showed)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    seen = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    proc.communicate(timeout=300)
    os.close(master)
    return proc.returncode, seen.decode(errors="replace")


def test_ingest_restore_and_drill_draw_bars_on_a_terminal_and_nothing_on_a_pipe(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path
) -> None:
    root = tmp_path / "hot"
    write_checkpoint(root, "deepspeed", 100, 8 * MiB, seed=1)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket_factory(seaweedfs), [("r", root, "deepspeed")])
    cfg.write_text(cfg.read_text() + f'[validation]\nenabled = false\n[drill]\nscratch = "{tmp_path / "scratch"}"\n')
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(seaweedfs.env(), PYTHONPATH=str(REPO))

    rc, screen = _run_on_tty([_console(), "--config", str(cfg), "ingest"], env)
    assert rc == 0, screen[-2000:]
    assert "r step 100 [" in screen and BAR in screen, screen[-2000:]
    rc, screen = _run_on_tty([_console(), "--config", str(cfg), "restore", "r", "--dest", str(tmp_path / "a")], env)
    assert rc == 0, screen[-2000:]
    assert "restore r step 100 [" in screen and BAR in screen, screen[-2000:]

    rc, screen = _run_on_tty([_console(), "--config", str(cfg), "drill"], env)
    assert rc == 0, screen[-2000:]
    assert "drill r step 100 [" in screen and BAR in screen, screen[-2000:]

    piped = subprocess.run(
        [_console(), "--config", str(cfg), "restore", "r", "--dest", str(tmp_path / "b")],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr[-2000:]
    assert BAR not in piped.stderr and "\r" not in piped.stderr, piped.stderr[-2000:]
