"""The console script (`ckptvault`): hand the command to this environment's warm process when one is
running (`ckptvault warm`, docs/warm.md), else run it here, cold. Only the standard library is imported
before that choice."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckptvault_cli.warm import server

_T_ENTRY = time.perf_counter()


def run() -> None:
    from ckptvault_cli.warm import client

    code = client.hand_off(sys.argv[1:], _T_ENTRY)
    if code is not None:
        client.exit_with(code)
    from ckptvault_cli.main import run as run_cold

    run_cold()


def warm_process() -> int:
    """The warm process (`ckptvault warm` starts it: ckptvault_cli/commands/warm.py): its server, given
    the command line each child runs. Both meet here, at the top, because the commands import the warm
    package below them."""
    from ckptvault_cli.warm import server

    return server.main(_command_line)


def _command_line() -> server.CommandLine:
    from ckptvault_cli import main
    from ckptvault_cli.warm.server import CommandLine

    return CommandLine(main.prepare_one_shot, main.run_prepared, main._main_started)


if __name__ == "__main__":
    run()
