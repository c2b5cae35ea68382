"""How the command line runs a flow: as a Prefect flow run when an API is configured, else directly.

With `PREFECT_API_URL` set, every command is a flow run on that server (visible in its UI, with task
runs and artifacts). Without it, Prefect would start a temporary API server for this one process
(10-30 s before any work, and a screenful of shutdown errors after it); instead the flow's own
function runs in direct mode (ckptvault_prefect/tasks/step.py): the same wiring, library calls, retries, catalog
events and alerts, with nothing recorded in Prefect. `CKPTVAULT_PREFECT=always` forces a flow run
(a temporary API then starts, as before).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any

from ckptvault.clock import timing
from ckptvault.clock.timing import phase
from ckptvault_cli import process


def direct() -> bool:
    return not os.environ.get("PREFECT_API_URL") and os.environ.get("CKPTVAULT_PREFECT", "") != "always"


def temporary_api() -> bool:
    """A flow run with no server configured: Prefect starts a temporary API in a process of its own."""
    return not direct() and not os.environ.get("PREFECT_API_URL")


def run_flow(flow: Any, workers: int = 4, *, force_prefect: bool = False, **params: Any) -> Any:
    """The flow's return value, or the exception it ended with (as `state.result(raise_on_failure=False)`).
    `workers`: the threads a mapped step fans out over in direct mode (the flow's own task runner's
    size in Prefect mode)."""
    if direct() and not force_prefect:
        return run_direct(flow.fn, flow.name, workers, **params)
    # the flow's own phases are nested in this one: what is left of it is Prefect's own overhead
    with phase(timing.PREFECT), process.flow_settings(), process.prefect_client():
        state = flow(**params, return_state=True)
        return state.result(raise_on_failure=False)


def run_direct(body: Callable[..., Any], flow_name: str, workers: int = 4, **params: Any) -> Any:
    """A flow's body run in direct mode: `run_flow` without a Prefect API. A command whose flow body
    lives in a module without Prefect (ckptvault_prefect/flows/ingest_body.py) calls this with it and
    never imports the flow's own module, nor Prefect."""
    from ckptvault_prefect.runtime.hooks import alert_failed
    from ckptvault_prefect.tasks.step import direct_mode

    # What a flow prints is its log (in a flow run, Prefect's console handler puts it on stderr):
    # stdout stays the command's own output, so `--json` is parseable in either mode.
    with direct_mode(workers), contextlib.redirect_stdout(sys.stderr):
        try:
            return body(**params)
        except Exception as e:  # the same outcome a Failed flow state carries
            with phase(timing.ALERTS):
                alert_failed(flow_name, "Failed", str(e), e, params)
            return e
