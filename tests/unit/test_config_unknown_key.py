"""An unknown config key names the valid key it is nearest to (a typo: `keep_hott`), in any section,
array-of-tables entry or inline table; a key near none keeps the plain message. Read from real TOML
files through load_config, and through the command line (exit 2, one message, no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptvault.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
BASE = '[store]\nbucket = "ckpts"\n'


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ("[policy]\nkeep_hott = 2\n", "policy.keep_hott: unknown key; did you mean keep_hot?"),
        ("bucket_nmae = 'x'\n", "store.bucket_nmae: unknown key; did you mean bucket?"),
        ("[storage]\nbucket = 'x'\n", "storage: unknown key; did you mean store?"),
        (
            "[[sources]]\nrun = 'r'\npath = '/tmp'\nformatt = 'hf'\n",
            "sources[0].formatt: unknown key; did you mean format?",
        ),
        (
            "[policy]\nkeep_best = { metric = 'loss', lock_dayz = 3 }\n",
            "policy.keep_best.lock_dayz: unknown key; did you mean lock_days?",
        ),
        ("[drill]\ncover_day = 7\n", "drill.cover_day: unknown key; did you mean cover_days?"),
    ],
)
def test_an_unknown_key_names_the_nearest_valid_one(tmp_path: Path, toml: str, said: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(BASE + toml)
    with pytest.raises(ConfigError) as e:
        load_config(str(cfg))
    assert f"  - {said}\n" in str(e.value) + "\n", str(e.value)


def test_a_key_near_none_says_so_without_a_guess(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(BASE + "[policy]\nzzqxw = 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(cfg))
    assert "policy.zzqxw: unknown key. Remove it, or check its spelling against docs/reference/config.md." in str(
        e.value
    )
    assert "did you mean" not in str(e.value)


def test_the_command_line_exits_2_with_the_near_miss(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(BASE + "[policy]\nkeep_hott = 2\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "CKPTVAULT_WARM": "0"}
    out = subprocess.run(
        [sys.executable, "-m", "ckptvault_cli.entry", "--config", str(cfg), "ls"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert out.returncode == 2, out.stderr
    said = f"ckptvault: {cfg}: the configuration is not valid:\n"
    assert out.stderr == said + "  - policy.keep_hott: unknown key; did you mean keep_hot?\n"
    assert out.stdout == ""
