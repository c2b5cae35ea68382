"""The environment a drill loads a save with, and another one to compare before an upgrade.

`loaded_with()` records the versions of what the load checks and a resume check load with (the drill's
`loaded_with`), read from the installed packages' metadata, nothing imported. `drill --python PATH` runs
the load checks again with another interpreter (the environment of the upgrade being considered) and the
verify command with `{python}` as PATH: `check_with` runs `python -m ckptvault.restore.loadcheck` there,
with this ckptvault's directory put at the END of its module path, so that its own torch and framework
packages are the ones that load and only ckptvault's (standard-library-only) checks come from here.

What the comparison means is `verdict`: a save that passes here and fails there is format rot (the
upgrade would break it), never a corrupt save: it is not marked suspect.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptvault.errors import CkptvaultError
from ckptvault.restore.load_result import LoadReport
from ckptvault.restore.load_result import loaded_with as loaded_with

PROBE_SECONDS = 60.0
_PACKAGE = Path(__file__).resolve().parents[1]  # this ckptvault package's directory
# Runs the module with a directory holding only ckptvault appended: the other interpreter's packages come
# first, and none of this environment's other packages (an installed ckptvault sits in site-packages,
# beside this environment's torch: appending site-packages would load it there too)
_RUNNER = (
    "import sys; sys.path.append({root!r}); from ckptvault.restore.loadcheck import main; "
    "raise SystemExit(main(sys.argv[1:]))"
)


class OtherPythonError(CkptvaultError):
    """The other interpreter does not run the load checks at all (missing, not Python, too old)."""


def _run(python: str, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    try:
        with tempfile.TemporaryDirectory(prefix="ckptvault-only-") as only:
            os.symlink(_PACKAGE, os.path.join(only, "ckptvault"))
            code = _RUNNER.format(root=only)
            return subprocess.run([python, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                                  env=env, stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as e:
        raise OtherPythonError(f"{python} did not finish the load checks within {timeout:.0f} s") from e
    except OSError as e:
        raise OtherPythonError(f"{python} cannot be run: {e.strerror or e}") from e


def _last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def probe(python: str) -> dict[str, str]:
    """The versions `python` loads with; OtherPythonError naming why it cannot run the load checks."""
    import json

    done = _run(python, ["--env"], PROBE_SECONDS)
    try:
        if done.returncode != 0:
            raise ValueError(_last_line(done.stderr) or f"exit {done.returncode}")
        line = _last_line(done.stdout)
        if not line:
            raise ValueError("it printed nothing: not a Python interpreter")
        return {str(k): str(v) for k, v in dict(json.loads(line)["loaded_with"]).items()}
    except (ValueError, KeyError, TypeError) as e:
        raise OtherPythonError(f"{python} does not run ckptvault's load checks ({e})") from None


def check_with(python: str, checkpoint: Path, timeout: float) -> tuple[LoadReport, dict[str, str]]:
    """The load checks of the restored `checkpoint`, run by `python`; OtherPythonError if it did not run them."""
    from ckptvault.restore.loadcheck import report_from_json

    done = _run(python, [str(checkpoint)], timeout)
    try:
        if done.returncode != 0:
            raise ValueError(_last_line(done.stderr) or f"exit {done.returncode}")
        return report_from_json(_last_line(done.stdout))
    except (ValueError, KeyError, TypeError) as e:
        raise OtherPythonError(f"the load checks with {python} broke: {e}") from None


ROT, BROKE, BOTH_PASS, BOTH_FAIL, ONLY_OTHER = "format_rot", "other_broke", "both_pass", "both_fail", "only_other"


@dataclass(frozen=True)
class OtherResult:
    """The same save's load checks (and resume check) with the other interpreter."""

    python: str
    loaded_with: Mapping[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()  # its checks' and its resume check's verdicts on the save
    checks: tuple[str, ...] = ()
    not_run: tuple[str, ...] = ()
    error: str = ""  # the check itself broke there (OtherPythonError, or its verify_error)
    verify: Any = None  # its VerifyResult, when a resume check ran

    @property
    def ok(self) -> bool:
        return not self.problems and not self.error

    def as_dict(self) -> dict[str, Any]:
        return {"python": self.python, "loaded_with": dict(self.loaded_with), "ok": self.ok,
                "problems": list(self.problems), "checks": list(self.checks), "not_run": list(self.not_run),
                "error": self.error, "verify": None if self.verify is None else self.verify.as_dict()}  # fmt: skip


def verdict(here_ok: bool, other: OtherResult | None) -> str | None:
    """What the two environments' results say together (None: no other environment). FORMAT ROT: it passes
    here and fails there, so the upgrade would break it; the save itself is sound."""
    if other is None:
        return None
    if other.error:
        return BROKE
    if here_ok:
        return BOTH_PASS if other.ok else ROT
    return BOTH_FAIL if not other.ok else ONLY_OTHER


def drill_with(
    python: str,
    checkpoint: Path,
    settings: Any,
    *,
    run_name: str,
    step: int,
    save: int,
    fmt: str,
    metrics: Mapping[str, float],
    timeout: float,
) -> OtherResult:
    """The other environment's turn on a save that was restored (and checked here): its load checks, then,
    where they pass and a resume check is configured (`settings`, a verify.Settings), the verify command
    with `{python}` as `python`. Never raises for what happens there: a check that broke is `error`."""
    from ckptvault.restore import verify

    try:
        report, versions = check_with(python, checkpoint, timeout)
    except OtherPythonError as e:
        return OtherResult(python, error=str(e))
    checks, not_run = tuple(report.descriptions()), tuple(report.not_run)
    if report.problems or settings is None:
        return OtherResult(python, versions, tuple(report.problems), checks, not_run)
    ran = verify.run(settings, checkpoint, run_name=run_name, step=step, save=save, fmt=fmt, metrics=metrics,
                     python=python)  # fmt: skip
    if ran.outcome == verify.VERIFY_ERROR:
        return OtherResult(python, versions, (), checks, not_run, error=ran.problem or "", verify=ran)
    problems = (ran.problem,) if ran.problem else ()
    return OtherResult(python, versions, problems, checks, not_run, verify=ran)
