"""The drill's resume check (docs/drills.md, "Resume check"): the training's own code, run against the
restored copy, says whether training resumes from it, which a tensor load cannot.

`[drill] verify_command` (or a `[[sources]]` entry's own) is run after the restore and the load checks
passed: a list of arguments, no shell, its placeholders filled in (`PLACEHOLDERS`), in a process group of
its own so that the timeout kills everything it started, with an environment built from scratch (a few
harmless variables of this process, then `verify_env`: the store's credentials reach it only when
`verify_env` names them), in `verify_cwd` (default: the scratch directory the checkpoint was restored into).

What its end means is kept apart (`classify`): exit 0 passes; a code of `verify_fail_codes` says the
checkpoint is bad (the save is marked suspect, as a failed load check marks it); anything else (another
code, a signal, the out-of-memory killer's SIGKILL, the timeout, a command that cannot start) says the
check itself broke: a `verify_error`, which fails the drill and alerts but says nothing about the save, so a
bug in the script never makes `restore latest` skip good saves. A last stdout line that is a JSON object
holding `verify_metric` is compared with the value the manifest recorded (`compare_metric`).

The decisions (`expand`, `build_env`, `classify`, `last_json_object`, `compare_metric`, `decide`, `tail`;
the placeholders' own check is the configuration's, ckptvault/config.py) are pure functions; `run` is the
one call that starts a process.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ckptvault.config import Config

PASSED, FAILED, VERIFY_ERROR = "passed", "failed", "verify_error"
OUTCOMES = (PASSED, FAILED, VERIFY_ERROR)
TAIL_BYTES = 4096  # of stdout and of stderr each, kept for the report, the artifact and the event's detail
# What the command inherits from this process before `verify_env`: where programs are, who and where it
# is, its locale and time zone, and which GPUs this worker was given. Nothing else: a worker's
# environment holds the store's credentials (boto3's chain), which a training script has no need of.
INHERITED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
             "CUDA_VISIBLE_DEVICES")  # fmt: skip
# SIGTERM first, then SIGKILL this long after: a script may release what it holds (a GPU context) on TERM.
KILL_GRACE_SECONDS = 5.0


def expand(command: Sequence[str], values: Mapping[str, object]) -> list[str]:
    """The arguments with each placeholder replaced by its value (every one of config.VERIFY_PLACEHOLDERS given)."""
    return [arg.format_map({k: str(v) for k, v in values.items()}) for arg in command]


def build_env(inherited: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The command's whole environment: INHERITED's variables that `inherited` (this process's environment)
    has, then `extra` (`verify_env`). A value that is exactly `${NAME}` is this process's NAME (left out
    when unset): the one way a credential reaches the command, by name, never written in the config."""
    env = {k: inherited[k] for k in INHERITED if k in inherited}
    for k, v in extra.items():
        if v.startswith("${") and v.endswith("}") and len(v) > 3:
            name = v[2:-1]
            if name in inherited:
                env[k] = inherited[name]
            else:
                env.pop(k, None)
        else:
            env[k] = v
    return env


def resolve_program(program: str, env: Mapping[str, str], cwd: Path | None) -> str | None:
    """Where `program` is, as the command would find it (a path: relative to `cwd`; a bare name: on the
    command's own PATH); None when it is not there or not executable."""
    if os.sep in program:
        p = Path(program)
        if not p.is_absolute() and cwd is not None:
            p = cwd / p
        return str(p) if p.is_file() and os.access(p, os.X_OK) else None
    return shutil.which(program, path=env.get("PATH", os.defpath))


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def classify(
    returncode: int | None, *, timed_out: bool, fail_codes: Collection[int], timeout: float = 0.0
) -> tuple[str, str]:
    """(outcome, why) of a command's end: `returncode` as subprocess gives it (negative: the signal that
    ended it; None: it never started), `timed_out` when it was killed at the limit."""
    if timed_out:
        return VERIFY_ERROR, f"timed out after {timeout:g} s; its process group was killed"
    if returncode is None:
        return VERIFY_ERROR, "did not start"
    if returncode == 0:
        return PASSED, "exit 0"
    if returncode < 0:
        name = _signal_name(-returncode)
        oom = " (the out-of-memory killer's signal)" if -returncode == signal.SIGKILL else ""
        return VERIFY_ERROR, f"killed by {name}{oom}"
    if returncode in fail_codes:
        return FAILED, f"exit {returncode}: the checkpoint failed the check"
    codes = ", ".join(str(c) for c in sorted(fail_codes))
    oom = f" (128 + {_signal_name(returncode - 128)}: a child killed by it?)" if 128 < returncode < 160 else ""
    return VERIFY_ERROR, f"exit {returncode}{oom}: neither 0 (passed) nor a verify_fail_codes code ({codes})"


def last_json_object(stdout: str) -> dict[str, Any] | None:
    """The JSON object on the last non-empty line of `stdout`, else None."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        doc = json.loads(lines[-1])
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


@dataclass(frozen=True)
class MetricCheck:
    """The metric the command printed against the value it is compared with."""

    name: str
    seen: float
    reference: float | None  # the command's own `reference`, else the manifest's recorded value; None: neither
    source: str  # "manifest", "command" (its own `reference`), or "" when there is nothing to compare with
    tolerance: float  # relative

    @property
    def within(self) -> bool | None:
        """None when there is nothing to compare with; NaN or infinity is never within."""
        if self.reference is None:
            return None
        if not (math.isfinite(self.seen) and math.isfinite(self.reference)):
            return False
        return abs(self.seen - self.reference) <= self.tolerance * abs(self.reference)

    def describe(self) -> str:
        if self.reference is None:
            return f"{self.name} {self.seen:g} (the manifest recorded no {self.name} to compare with)"
        rel = abs(self.seen - self.reference) / abs(self.reference) if self.reference else math.inf
        where = "recorded in the manifest" if self.source == "manifest" else "the command's own reference"
        verdict = "within" if self.within else "OUTSIDE"
        return (f"{self.name} {self.seen:g} against {self.reference:g} {where}: {rel:.2%} apart, {verdict} "
                f"verify_tolerance {self.tolerance:g}")  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seen": self.seen, "reference": self.reference, "source": self.source,
                "tolerance": self.tolerance, "within": self.within}  # fmt: skip


def compare_metric(
    doc: Mapping[str, Any] | None, metric: str, recorded: Mapping[str, float], tolerance: float
) -> MetricCheck | None:
    """The metric check of the command's last JSON line `doc`: None when it holds no number `metric`.
    Compared with the line's own `reference` when it has one (a check that measures a fixed batch knows its
    loss at the save), else with the manifest's recorded `metric`."""
    if doc is None:
        return None
    seen = doc.get(metric)
    if isinstance(seen, bool) or not isinstance(seen, int | float):
        return None
    own = doc.get("reference")
    if not isinstance(own, bool) and isinstance(own, int | float):
        return MetricCheck(metric, float(seen), float(own), "command", tolerance)
    ref = recorded.get(metric)
    return MetricCheck(metric, float(seen), ref, "manifest" if ref is not None else "", tolerance)


def tail(data: bytes, limit: int = TAIL_BYTES) -> str:
    """The last `limit` bytes as text (a cut multi-byte character replaced), marked when cut."""
    if len(data) <= limit:
        return data.decode("utf-8", "replace")
    return "[...] " + data[-limit:].decode("utf-8", "replace")


@dataclass(frozen=True)
class VerifyResult:
    """One run of the verify command against one restored save."""

    outcome: str  # PASSED, FAILED or VERIFY_ERROR
    why: str  # how it ended, one line
    command: tuple[str, ...]  # as run, placeholders filled in
    returncode: int | None  # None: killed at the timeout, or never started
    seconds: float
    stdout_tail: str = ""
    stderr_tail: str = ""
    metric: MetricCheck | None = None

    @property
    def problem(self) -> str | None:
        """The drill's problem line when it did not pass."""
        if self.outcome == PASSED:
            return None
        kind = "verify_error" if self.outcome == VERIFY_ERROR else "verify failed"
        return f"{kind}: {self.why}"

    def as_dict(self) -> dict[str, Any]:
        """The report's and the `drilled` event's `verify` (docs/FORMAT.md)."""
        return {"outcome": self.outcome, "why": self.why, "command": list(self.command), "exit": self.returncode,
                "seconds": round(self.seconds, 3), "stdout_tail": self.stdout_tail, "stderr_tail": self.stderr_tail,
                "metric": None if self.metric is None else self.metric.as_dict()}  # fmt: skip


def decide(
    returncode: int | None,
    *,
    timed_out: bool,
    stdout: str,
    fail_codes: Collection[int],
    metric: str,
    tolerance: float,
    recorded: Mapping[str, float],
    timeout: float = 0.0,
) -> tuple[str, str, MetricCheck | None]:
    """(outcome, why, metric check) of a finished command: `classify`, then a pass whose printed metric is
    outside the tolerance is a failed checkpoint. A metric printed by a command that failed or broke is
    kept for the report but decides nothing."""
    outcome, why = classify(returncode, timed_out=timed_out, fail_codes=fail_codes, timeout=timeout)
    check = compare_metric(last_json_object(stdout), metric, recorded, tolerance) if not timed_out else None
    if outcome == PASSED and check is not None and check.within is False:
        return FAILED, check.describe(), check
    if check is not None and outcome == PASSED:
        why = f"{why}; {check.describe()}"
    return outcome, why, check


class _Tail:
    """Reads a stream to its end in a thread, keeping only its last TAIL_BYTES (whatever it writes)."""

    def __init__(self, stream: IO[bytes], keep: int = 64 * 1024) -> None:
        self._buf = bytearray()
        self._keep = keep
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        with stream:
            while chunk := stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536):
                self._buf += chunk
                if len(self._buf) > 2 * self._keep:
                    del self._buf[: -self._keep]

    def join(self, timeout: float) -> bytes:
        self._thread.join(timeout)
        return bytes(self._buf[-self._keep :])


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # every process of the group has ended
        os.killpg(pgid, sig)


def settings_for(cfg: Config, run: str) -> Settings | None:
    """The resume check of `run`'s saves: its `[[sources]]` entry's `verify_command`, else `[drill]`'s, with
    `[drill]`'s other verify keys; None when neither is set."""
    chosen = cfg.verify_command_for(run)
    if chosen is None:
        return None
    d = cfg.drill
    return Settings(tuple(chosen[1]), d.verify_timeout_seconds, dict(d.verify_env), d.verify_cwd,
                    tuple(d.verify_fail_codes), d.verify_metric, d.verify_tolerance)  # fmt: skip


def config_problems(cfg: Config, runs: Sequence[str] | None = None) -> list[str]:
    """Problems with the resume check as this host would run it, each naming the key and the fix (empty if
    fine): `verify_cwd` a directory, and the program of each command `runs` use (default: every one
    configured) an executable file. The placeholders were checked with the file (ckptvault/config.py)."""
    d = cfg.drill
    if d.verify_cwd is not None and not d.verify_cwd.is_dir():
        return [
            f"[drill] verify_cwd: {d.verify_cwd} is not a directory. Create it, fix the path, or remove the key "
            "(the command then runs in the scratch directory the save was restored into)."
        ]
    wanted = list(runs) if runs is not None else ["", *(s.run for s in cfg.sources)]  # "": a run with no entry
    commands = dict(c for r in wanted if (c := cfg.verify_command_for(r)) is not None)
    env = build_env(os.environ, d.verify_env)
    problems: list[str] = []
    for key, command in commands.items():
        program = command[0]
        if "{" in program or (os.sep in program and not os.path.isabs(program) and d.verify_cwd is None):
            continue  # a placeholder, or a path in the scratch directory: known only once a save is restored
        if resolve_program(program, env, d.verify_cwd) is None:
            at = f"in {d.verify_cwd}" if os.sep in program else f"on the command's PATH ({env.get('PATH', '')})"
            problems.append(f"{key}: {program!r} is not an executable file {at}. Give its absolute path, or set "
                            "PATH in [drill] verify_env.")  # fmt: skip
    return problems


@dataclass(frozen=True)
class Settings:
    """`[drill]`'s verify keys, as the library takes them (ckptvault/config.py, DrillConfig)."""

    command: tuple[str, ...]
    timeout_seconds: float = 3600.0
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    fail_codes: tuple[int, ...] = (1,)
    metric: str = "loss"
    tolerance: float = 0.05


def run(
    settings: Settings,
    checkpoint: Path,
    *,
    run_name: str,
    step: int,
    save: int,
    fmt: str,
    metrics: Mapping[str, float],
    environ: Mapping[str, str] | None = None,
    python: str | None = None,
) -> VerifyResult:
    """Run the verify command against the restored `checkpoint` (a directory, or the file of a one-file
    layout) and judge it. Never raises for what the command does: a command that cannot start, hangs or
    crashes is a VERIFY_ERROR result. `metrics`: the manifest's recorded metrics ({metrics_json}). `python`:
    the interpreter `{python}` names (default: this one; `drill --python PATH`'s for the other environment)."""
    t0 = time.monotonic()
    argv: list[str] = list(settings.command)
    try:
        scratch = Path(tempfile.mkdtemp(prefix=".ckptvault-verify-", dir=checkpoint.parent))
    except OSError as e:  # the drill's own scratch, not the save: never a verdict on it
        return VerifyResult(VERIFY_ERROR, f"did not start: the metrics file's directory: {e}", tuple(argv), None, 0.0)
    try:
        metrics_json = scratch / "metrics.json"
        metrics_json.write_text(json.dumps(dict(metrics), sort_keys=True) + "\n")
        values = {"dest": checkpoint, "run": run_name, "step": step, "save": save, "format": fmt,
                  "metrics_json": metrics_json, "python": python or sys.executable}  # fmt: skip
        argv = expand(settings.command, values)
        env = build_env(os.environ if environ is None else environ, settings.env or {})
        cwd = settings.cwd if settings.cwd is not None else checkpoint.parent
        program = resolve_program(argv[0], env, cwd)
        if program is None:
            why = f"{argv[0]!r} is not an executable file on the command's PATH ({env.get('PATH', '')}) or in {cwd}"
            return VerifyResult(VERIFY_ERROR, f"did not start: {why}", tuple(argv), None, time.monotonic() - t0)
        return _run_process(settings, argv, program, env, cwd, metrics, t0)
    except OSError as e:  # writing the metrics file: the drill's side, not the save's
        return VerifyResult(VERIFY_ERROR, f"did not start: {e}", tuple(argv), None, time.monotonic() - t0)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run_process(
    settings: Settings,
    argv: list[str],
    program: str,
    env: dict[str, str],
    cwd: Path,
    metrics: Mapping[str, float],
    t0: float,
) -> VerifyResult:
    try:
        proc = subprocess.Popen([program, *argv[1:]], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    except OSError as e:
        return VerifyResult(VERIFY_ERROR, f"did not start: {e}", tuple(argv), None, time.monotonic() - t0)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = _Tail(proc.stdout), _Tail(proc.stderr)
    timed_out = False
    try:
        proc.wait(timeout=settings.timeout_seconds)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL below
            proc.wait(timeout=KILL_GRACE_SECONDS)
    finally:
        # the whole group, whatever happened: nothing the command started outlives the drill (and a child
        # still holding its stdout open would keep the readers waiting)
        _kill_group(proc.pid, signal.SIGKILL)
        proc.wait()
    seconds = time.monotonic() - t0
    stdout, stderr = out.join(10.0), err.join(10.0)
    outcome, why, check = decide(
        None if timed_out else proc.returncode, timed_out=timed_out, stdout=stdout.decode("utf-8", "replace"),
        fail_codes=settings.fail_codes, metric=settings.metric, tolerance=settings.tolerance, recorded=metrics,
        timeout=settings.timeout_seconds,
    )  # fmt: skip
    return VerifyResult(outcome, why, tuple(argv), None if timed_out else proc.returncode, seconds,
                        tail(stdout), tail(stderr), check)  # fmt: skip
