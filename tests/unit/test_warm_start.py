"""`ckptvault serve`'s warm start (ckptvault_prefect/runtime/warm_start.py): a flow run's process forked
from a process that has imported Prefect's engine and the flows, instead of a new interpreter.

Run in a subprocess: install() changes a module global of Prefect's for the whole process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

PROBE = textwrap.dedent(
    """
    import json, multiprocessing, sys

    def child(q):
        # what the child found already imported when its target began: the warm process's preload
        q.put({m: m in sys.modules for m in ("prefect.flow_engine", "ckptvault_prefect.flows.ingest")})

    if __name__ == "__main__":
        import prefect.flow_engine as engine
        from ckptvault_prefect.runtime import warm_start

        assert not warm_start.installed()
        ok = warm_start.install()
        ctx = engine.multiprocessing.get_context("spawn")  # what the runner's direct starter asks for
        q = ctx.SimpleQueue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        got = q.get()
        p.join(60)
        print(json.dumps({
            "installed": ok and warm_start.installed(),
            "method": ctx.get_start_method(),
            "fork_untouched": engine.multiprocessing.get_context("fork").get_start_method(),
            "passthrough": engine.multiprocessing.context is multiprocessing.context,
            "exitcode": p.exitcode,
            "preloaded": got,
        }))
    """
)


def test_a_served_flow_runs_process_starts_with_prefect_and_the_flows_already_imported(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=170)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["installed"] is True
    assert got["method"] == "forkserver"
    assert got["fork_untouched"] == "fork"  # only "spawn" is answered with the warm context
    assert got["passthrough"] is True
    assert got["exitcode"] == 0
    # a spawned interpreter would have imported neither before its target ran
    assert got["preloaded"] == {"prefect.flow_engine": True, "ckptvault_prefect.flows.ingest": True}
