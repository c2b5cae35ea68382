"""How the command line ends on each kind of error (ckptvault_cli/main.py's exit codes): every error
ckptvault raises on purpose is a CkptvaultError (tests/unit/test_error_tree.py), so the order of the
`except` clauses is what keeps bad input at exit 2, and a failure the flow already alerted on is said
once and not alerted on again."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from ckptvault.config import ConfigError
from ckptvault.errors import AlreadyAlerted, CkptvaultError
from ckptvault.ingest.steps import IngestIncomplete, Outcome
from ckptvault.store import StoreError
from ckptvault_cli import main as cli_main
from ckptvault_cli import running
from ckptvault_cli.commands import ingest as ingest_cmd
from ckptvault_cli.output import EXIT_PIPE
from ckptvault_cli.preflight import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, UsageError
from ckptvault_prefect.runtime import hooks

FAILED = Outcome("r", 10, "hf", "failed", message="upload refused")


class _Parser:
    """build_parser's stand-in: every command line runs `fn`."""

    def __init__(self, fn: Callable[[argparse.Namespace], int]) -> None:
        self.fn = fn

    def parse_args(self, argv: Any) -> argparse.Namespace:
        return argparse.Namespace(fn=self.fn)


def _raising(e: BaseException) -> Callable[..., int]:
    def fn(*args: Any, **kwargs: Any) -> int:
        raise e

    return fn


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (UsageError("--limit 0: give 1 or more"), EXIT_USAGE),
        (ConfigError("[store] bucket is missing"), EXIT_USAGE),
        (StoreError("get s3://b/k: access denied"), EXIT_FAILED),
        (CkptvaultError("the work stopped"), EXIT_FAILED),
        (IngestIncomplete([FAILED]), EXIT_FAILED),
    ],
)
def test_each_ckptvault_error_exits_with_its_code_and_its_message_once(
    error: CkptvaultError, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_main, "build_parser", lambda: _Parser(_raising(error)))
    assert cli_main.main([]) == code
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"ckptvault: {error}\n")


def test_an_interrupt_is_130_and_a_bug_keeps_its_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_main, "build_parser", lambda: _Parser(_raising(KeyboardInterrupt())))
    assert cli_main.main([]) == EXIT_INTERRUPTED
    assert "interrupted" in capsys.readouterr().err
    monkeypatch.setattr(cli_main, "build_parser", lambda: _Parser(_raising(RuntimeError("a bug"))))
    with pytest.raises(RuntimeError, match="a bug"):
        cli_main.main([])


def test_a_broken_pipe_is_141_when_stdouts_reader_is_gone_and_a_bug_otherwise(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_main, "build_parser", lambda: _Parser(_raising(BrokenPipeError(32, "Broken pipe"))))
    # stdout is still read (pytest's capture): the broken pipe was another one, a bug with its traceback
    with pytest.raises(BrokenPipeError):
        cli_main.main([])
    # stdout a pipe whose reader has gone (`ckptvault ls | head`): 141, nothing said, fd 1 now /dev/null
    saved = os.dup(1)
    r, w = os.pipe()
    os.close(r)
    try:
        os.dup2(w, 1)
        assert cli_main.main([]) == EXIT_PIPE
        assert os.readlink("/proc/self/fd/1") == os.devnull
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(w)
    assert capsys.readouterr().err == ""


def test_direct_mode_alerts_on_a_failed_flow_unless_it_already_alerted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("CKPTVAULT_PREFECT", raising=False)
    sent: list[list[Any]] = []
    monkeypatch.setattr(hooks, "load_config", lambda path: SimpleNamespace(store=None))
    monkeypatch.setattr(hooks, "open_store", lambda store_cfg: None)
    monkeypatch.setattr(hooks, "send_alerts", lambda cfg, store, alerts, secret: sent.append(alerts))

    for error in (IngestIncomplete([FAILED]), StoreError("put s3://b/k: access denied")):
        flow = SimpleNamespace(name="ingest", fn=_raising(error))
        assert running.run_flow(flow, 1, config_path=None) is error  # the command prints it, once
    assert isinstance(IngestIncomplete([FAILED]), AlreadyAlerted)
    assert [[a.kind for a in alerts] for alerts in sent] == [["flow_failed"]]  # the StoreError's only


def test_ingest_prints_an_incomplete_pass_once_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = SimpleNamespace(validation=SimpleNamespace(enabled=False))
    monkeypatch.setattr(ingest_cmd, "preflight_store", lambda args, need_sources, config_read=None: (cfg, None))
    monkeypatch.setattr(ingest_cmd, "preflight_runner", lambda *a, **k: SimpleNamespace(needs_prefect=False))
    monkeypatch.setattr(ingest_cmd, "start_prefect_note", lambda force_prefect=False: None)
    incomplete = IngestIncomplete([FAILED])
    monkeypatch.setattr(running, "run_flow", lambda *a, **k: incomplete)
    monkeypatch.setattr(running, "run_direct", lambda *a, **k: incomplete)  # no Prefect API here
    args = argparse.Namespace(config=None, dask_address=None, dask_workers=None, json=False, run=None, step=None)

    assert ingest_cmd.cmd_ingest(args) == EXIT_FAILED
    out, err = capsys.readouterr()
    assert out == "failed    r step 10 (hf, 0.0 MiB, 0 files)  upload refused\n"
    assert err == f"{incomplete}\n" and err.count("not uploaded") == 1
