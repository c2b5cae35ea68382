"""The one preload list (ckptvault_prefect/runtime/preload.py): what `ckptvault warm` and `serve`'s warm
start import before their first fork. A name that no longer exists (a module of ckptvault renamed, one
Prefect or another dependency moved) fails here rather than in a warm start."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from ckptvault_prefect.runtime import preload, warm_start

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", preload.COMMAND)
def test_every_preloaded_module_exists(name: str) -> None:
    assert importlib.util.find_spec(name) is not None, f"{name} is preloaded but cannot be found"


def test_a_flow_runs_preload_is_part_of_a_commands_and_each_is_named_once() -> None:
    assert set(preload.FLOW_RUN) <= set(preload.COMMAND)
    assert len(set(preload.COMMAND)) == len(preload.COMMAND)


def test_serves_warm_start_and_the_warm_process_preload_from_the_one_list() -> None:
    from ckptvault_cli.warm import server

    assert warm_start.install.__defaults__ == (preload.FLOW_RUN,)
    assert not hasattr(server, "PRELOAD") and not hasattr(warm_start, "PRELOAD")  # no second list


def test_reading_the_list_imports_nothing_it_names() -> None:
    code = (
        "import sys; import ckptvault_prefect.runtime.preload; print(sorted(m for m in sys.modules if 'prefect' in m))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (
        out.stdout.strip() == "['ckptvault_prefect', 'ckptvault_prefect.runtime', 'ckptvault_prefect.runtime.preload']"
    )
