"""The console script (`ckptvault`): hand the command to this environment's warm process when one is
running (`ckptvault warm`, docs/warm.md), else run it here, cold. Only the standard library is imported
before that choice."""

from __future__ import annotations

import sys
import time

_T_ENTRY = time.perf_counter()


def run() -> None:
    from ckptvault_cli import warm_client

    code = warm_client.hand_off(sys.argv[1:], _T_ENTRY)
    if code is not None:
        warm_client.exit_with(code)
    from ckptvault_cli.main import run as run_cold

    run_cold()


if __name__ == "__main__":
    run()
