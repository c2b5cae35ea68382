"""The one thing a framework hook says: "run R, step S is committed at PATH", handed off so that the
training step never waits on it and never sees it fail.

`notify_saved` puts the signal on a queue and returns (microseconds); one daemon thread per process
takes it from there and sends it on the channels `channels()` picks:

- `event`: a Prefect event `ckptvault.checkpoint.saved` (resource `ckptvault.run.<run>`, the step and
  path in the payload and as resource labels), POSTed to the Prefect API's events endpoint from the
  thread (the standard library's HTTP: it works while the process exits). The ingest deployment's
  trigger (ckptvault_prefect/deployments/prefect.yaml) turns it into an ingest of that run and step.
- `ingest`: `ckptvault ingest --run R --step S` as a detached subprocess (its own session, so it
  finishes even when training exits first), its output appended to a log file per run. It runs on the
  training node's CPUs, so it must not take them from training: one at a time per run (a save signalled
  while its run's ingest is still going waits for it; bench/README.md "RPO" measured a save every few
  seconds piling up 15 ingests at once and training 1.7x slower), at a lower CPU priority (niceness +10).
  When it ends, the saves that waited meanwhile go to one ingest naming them all (`--step S1 --step S2`):
  one process start and one catalog read for the lot, not one process per save.

`CKPTVAULT_HOOK_SIGNAL` (or the hook's `signal=`) chooses: `auto` (the default) sends the event when a
Prefect API is configured (PREFECT_API_URL) and runs the subprocess otherwise; `event`, `ingest`, `both`
or `off` say it outright. Whatever the channel, the hook's word is a hint: ingest judges the step by its
format's commit rule as always (ckptvault/ingest/narrow.py).

Never raising into training: every failure in the thread is caught, and the first of each channel is
logged as one warning (`ckptvault.hooks` logger); later ones at debug level, so a dead API does not
fill the training log. A checkpoint whose signal was lost is still archived by the next scheduled ingest.
"""

from __future__ import annotations

import atexit
import base64
import json
import logging
import os
import queue
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from ckptvault.checkpoint.written_by import render
from ckptvault.hooks.runtime import runtime_versions

EVENT = "ckptvault.checkpoint.saved"
RESOURCE_PREFIX = "ckptvault.run."
SignalMode = Literal["auto", "event", "ingest", "both", "off"]
MODES: tuple[str, ...] = ("auto", "event", "ingest", "both", "off")
Channel = Literal["event", "ingest"]
THREAD_NAME = "ckptvault-hooks"
# At interpreter exit, how long the signals still queued get to be handed on (a subprocess start takes
# milliseconds; an event waits at most for one connection attempt)
EXIT_DRAIN_SECONDS = 10.0
EVENT_TIMEOUT_SECONDS = 5.0
# How much nicer than the training process its detached ingest runs: training keeps its CPU share, the
# ingest takes what is idle (CFS gives niceness 10 about a tenth of niceness 0's weight)
INGEST_NICENESS = 10

log = logging.getLogger("ckptvault.hooks")


@dataclass(frozen=True)
class Saved:
    """Run `run`, step `step` is committed at `path` (as the framework's save returned)."""

    run: str
    step: int
    path: str
    config: str | None = None  # the ckptvault config the subprocess ingest reads; None: $CKPTVAULT_CONFIG
    mode: str = "auto"
    # what the training process runs (ckptvault/hooks/runtime.py), as `KEY=VERSION` words: ingest records it
    written_by: str = ""


def channels(mode: str, env: Mapping[str, str]) -> tuple[Channel, ...]:
    """Where a signal goes. An unknown mode is treated as `auto`: a typo in an environment variable must
    not stop the signal (the hook warns about it once)."""
    if mode == "off":
        return ()
    if mode == "event":
        return ("event",)
    if mode == "ingest":
        return ("ingest",)
    if mode == "both":
        return ("event", "ingest")
    return ("event",) if env.get("PREFECT_API_URL") else ("ingest",)


def resolve_mode(given: str | None, env: Mapping[str, str]) -> str:
    """The hook's `signal=`, else $CKPTVAULT_HOOK_SIGNAL, else `auto`."""
    return given or env.get("CKPTVAULT_HOOK_SIGNAL") or "auto"


def is_rank_zero(env: Mapping[str, str]) -> bool:
    """Whether this process speaks for the job: global rank 0 as torchrun, SLURM or MPI number it (a
    process without any of these variables is a job of its own). Every rank returns from a DCP or
    Megatron save; one signal is enough."""
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        value = env.get(var)
        if value is not None and value.strip() != "":
            return value.strip() == "0"
    return True


def ingest_command(saved: Saved, *more: Saved) -> list[str]:
    """The detached ingest of `saved` (and of `more`, later saves of the same run and config, in the same
    pass): this interpreter's own ckptvault, so a venv without `ckptvault` on PATH works."""
    cmd = [sys.executable, "-m", "ckptvault_cli.main", "ingest", "--run", saved.run]
    for step in dict.fromkeys(s.step for s in (saved, *more)):
        cmd += ["--step", str(step)]
    if saved.config:
        cmd += ["--config", saved.config]
    if saved.written_by:  # one process saved them all: the first one's report stands for the batch
        cmd += ["--written-by", saved.written_by]
    return cmd


def log_path(run: str) -> Path:
    """Where the detached ingests of `run` append their output: $CKPTVAULT_HOOK_LOG_DIR, else the temp dir."""
    base = Path(os.environ.get("CKPTVAULT_HOOK_LOG_DIR") or Path(tempfile.gettempdir()) / "ckptvault-hooks")
    return base / f"{run}.log"


def start_ingest(saved: Saved, *more: Saved) -> subprocess.Popen[bytes]:
    path = log_path(saved.run)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as out:  # the child keeps its own descriptor; ours closes at once
        proc = subprocess.Popen(
            ingest_command(saved, *more),
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, close_fds=True,
        )  # fmt: skip
    lower_priority(proc.pid)
    return proc


def lower_priority(pid: int) -> None:
    """`pid` INGEST_NICENESS nicer than this process (at most 19), set from here rather than by a
    preexec_fn, which would make Popen fork instead of vfork a training process of gigabytes. The
    ingest's own children (its quality-gate child) start later and inherit it. Best effort: a system
    that refuses leaves the ingest as it is."""
    try:
        own = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, pid, min(own + INGEST_NICENESS, 19))
    except OSError as e:  # the child already exited, or a sandbox forbids it
        log.debug("ckptvault hook: could not lower the ingest's priority (%s)", e)


class Process(Protocol):
    pid: int

    def wait(self) -> int: ...


class Start(Protocol):
    """Starts the detached ingest of one or more saves of one run (start_ingest; a fake in tests)."""

    def __call__(self, saved: Saved, *more: Saved) -> Process: ...


def _steps_flags(batch: list[Saved]) -> str:
    return " ".join(f"--step {s.step}" for s in batch)


def take_batch(waiting: list[Saved]) -> list[Saved]:
    """The saves one ingest takes from a run's queue (removed from it): the first and every later one
    with its config (one command reads one config; a save with another waits for the next turn)."""
    config = waiting[0].config
    batch = [s for s in waiting if s.config == config]
    waiting[:] = [s for s in waiting if s.config != config]
    return batch


@dataclass
class Ingests:
    """The detached ingests of this process: one running per run at a time, the runs' later signals
    waiting their turn. Each running ingest is reaped by a thread of its own, which warns about an exit
    that is neither done (0) nor waiting (3) and starts the run's next one: one ingest naming every save
    that waited meanwhile (`take_batch`), so a burst of saves costs one process start and one pass, not
    one each. At interpreter exit the ones still waiting start at once (`start_waiting`, one ingest per
    run): the training is over, and a detached ingest outlives it."""

    start: Start = start_ingest
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _running: set[str] = field(default_factory=set)
    _waiting: dict[str, list[Saved]] = field(default_factory=dict)

    def submit(self, saved: Saved) -> None:
        """Start the ingest of `saved`, or queue it behind its run's running one. Raises what starting
        raises (the dispatcher warns)."""
        with self._lock:
            if saved.run in self._running:
                self._waiting.setdefault(saved.run, []).append(saved)
                return
            self._running.add(saved.run)
        try:
            self._launch([saved])
        except BaseException:
            self._next(saved.run)
            raise

    def waiting(self, run: str) -> list[Saved]:
        with self._lock:
            return list(self._waiting.get(run, ()))

    def _launch(self, batch: list[Saved]) -> None:
        proc = self.start(*batch)
        run = batch[0].run

        def reap() -> None:
            code = proc.wait()
            if code not in (0, 3):
                DISPATCHER._warn(
                    "ingest-exit",
                    f"ckptvault hook: `ckptvault ingest --run {run} {_steps_flags(batch)}` exited {code}; "
                    f"its output is in {log_path(run)}; the next scheduled ingest retries",
                )
            self._next(run)

        threading.Thread(target=reap, name=f"ckptvault-hooks-reap-{proc.pid}", daemon=True).start()

    def _next(self, run: str) -> None:
        """The run's ingest ended (or never started): start one ingest of every save of it waiting, if any."""
        while True:
            with self._lock:
                queue_ = self._waiting.get(run)
                if not queue_:
                    self._waiting.pop(run, None)
                    self._running.discard(run)
                    return
                batch = take_batch(queue_)
            try:
                self._launch(batch)
                return
            except Exception as e:  # these are lost (the scheduled ingest catches them); the next may start
                DISPATCHER._warn(
                    "ingest",
                    f"ckptvault hook: could not start the ingest of run {run!r} {_steps_flags(batch)} ({e})",
                )

    def start_waiting(self) -> None:
        """Start every waiting ingest now, unreaped: at interpreter exit, where nothing would reap them."""
        with self._lock:
            batches: list[list[Saved]] = []
            for q in self._waiting.values():
                while q:
                    batches.append(take_batch(q))
            self._waiting.clear()
        for batch in batches:
            try:
                self.start(*batch)
            except Exception as e:
                log.warning(
                    "ckptvault hook: could not start the ingest of %r %s (%s)", batch[0].run, _steps_flags(batch), e
                )


INGESTS = Ingests()


def run_ingest(saved: Saved, env: Mapping[str, str]) -> None:
    """The `ingest` channel: the detached ingest of `saved`, now or after its run's running one."""
    INGESTS.submit(saved)


def event_body(saved: Saved, occurred: datetime | None = None, event_id: str | None = None) -> dict[str, Any]:
    """The `ckptvault.checkpoint.saved` event of one save, as the Prefect events API takes it (JSON): what
    the ingest deployment's trigger matches (its resource id) and reads its run and step parameters from
    (its payload). Built without Prefect: it is sent from the training process, perhaps at its exit."""
    when = occurred or datetime.now(UTC)
    return {
        "id": event_id or str(uuid.uuid4()),
        "occurred": when.isoformat(),
        "event": EVENT,
        "resource": {
            "prefect.resource.id": f"{RESOURCE_PREFIX}{saved.run}",
            "prefect.resource.name": saved.run,
            "ckptvault.run": saved.run,
            "ckptvault.step": str(saved.step),
        },
        "related": [],
        "payload": {"run": saved.run, "step": saved.step, "path": saved.path, "written_by": saved.written_by},
    }


def send_event(saved: Saved, env: Mapping[str, str], timeout: float = EVENT_TIMEOUT_SECONDS) -> None:
    """One event, POSTed to the events endpoint of the API `env` names (`$PREFECT_API_URL/events`, with
    `$PREFECT_API_KEY` as the bearer token where set, else `$PREFECT_API_AUTH_STRING` as basic auth;
    a Prefect profile's settings and TLS options are not read: the environment only); a connection
    error or an error status raises here, in the hook's thread, which says it once.

    Plain HTTP from the standard library, not Prefect's events client: the last save's signal is often
    sent while the training process exits, when an asyncio client cannot start (its executor's
    `threading._register_atexit` is refused once interpreter shutdown has begun: the event was lost);
    and the training process neither imports Prefect nor could start an ephemeral server."""
    import urllib.request

    api = env.get("PREFECT_API_URL")
    if not api:
        raise RuntimeError("no PREFECT_API_URL: set it to the Prefect API that runs the ingest deployment")
    headers = {"Content-Type": "application/json"}
    key, auth = env.get("PREFECT_API_KEY"), env.get("PREFECT_API_AUTH_STRING")
    if key:  # Prefect Cloud
        headers["Authorization"] = f"Bearer {key}"
    elif auth:  # a self-hosted server with basic auth ("user:password"), as Prefect's own client sends it
        headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
    body = json.dumps([event_body(saved)]).encode()
    req = urllib.request.Request(f"{api.rstrip('/')}/events", data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # an error status raises HTTPError
        resp.read()


@dataclass
class Dispatcher:
    """The process's one queue and thread. `send` is what each channel runs (replaced only by tests
    that count calls); `warned` holds the channels that have had their one warning."""

    send: dict[str, Callable[[Saved, Mapping[str, str]], object]] = field(
        default_factory=lambda: {"event": send_event, "ingest": run_ingest}
    )
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)
    warned: set[str] = field(default_factory=set)
    _queue: queue.SimpleQueue[Saved | threading.Event] = field(default_factory=queue.SimpleQueue)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _last: dict[str, int] = field(default_factory=dict)  # each run's last signalled step
    _at_exit: bool = False

    def put(self, saved: Saved) -> None:
        """Queue the signal; a step already signalled for its run is dropped (Lightning's `last.ckpt`
        copy of the same step, a callback registered twice)."""
        with self._lock:
            if self._last.get(saved.run) == saved.step:
                return
            self._last[saved.run] = saved.step
            self._ensure_thread()
        self._queue.put(saved)

    def drain(self, timeout: float) -> bool:
        """Wait until every signal queued so far is handed on (tests, and a script that wants its last
        signal out before it exits); False when `timeout` passed first."""
        done = threading.Event()
        with self._lock:
            self._ensure_thread()
        self._queue.put(done)
        return done.wait(timeout)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
            self._thread.start()
            if not self._at_exit:
                # A script that saves its last checkpoint and exits would otherwise take that signal down
                # with the daemon thread: at exit, the queue gets a bounded time to be handed on, then the
                # ingests waiting for their run's running one start (atexit runs the later one first)
                atexit.register(INGESTS.start_waiting)
                atexit.register(self.drain, EXIT_DRAIN_SECONDS)
                self._at_exit = True

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                item.set()
            else:
                self.handle(item)

    def handle(self, saved: Saved) -> None:
        if saved.mode not in MODES:
            self._warn("mode", f"CKPTVAULT_HOOK_SIGNAL={saved.mode!r} is none of {', '.join(MODES)}; using auto")
        for channel in channels(saved.mode, self.env):
            try:
                self.send[channel](saved, self.env)
            except Exception as e:  # never into training: said once, the scheduled ingest catches the checkpoint
                self._warn(
                    channel,
                    f"ckptvault hook: could not signal run {saved.run!r} step {saved.step} by {channel} ({e}); "
                    "training goes on and the next scheduled ingest archives the checkpoint",
                )

    def _warn(self, key: str, message: str) -> None:
        if key in self.warned:
            log.debug("%s", message)
            return
        self.warned.add(key)
        log.warning("%s", message)


DISPATCHER = Dispatcher()


def notify_saved(
    run: str, step: int, path: str | os.PathLike[str], *, config: str | None = None, signal: str | None = None
) -> None:
    """Say "run `run`, step `step` is committed at `path`": call it after the framework's save has
    returned (DCP `dcp.save`, or an async save's future resolving; DeepSpeed `save_checkpoint`;
    Megatron `save_checkpoint`; Orbax `CheckpointManager.save` with `wait_until_finished`). Only global
    rank 0 sends (RANK / SLURM_PROCID / OMPI_COMM_WORLD_RANK / PMI_RANK); the others return at once.
    Never raises and never waits: the signal is sent from a background thread."""
    try:
        env = os.environ
        if not is_rank_zero(env):
            return
        cfg = config or env.get("CKPTVAULT_CONFIG")
        versions = render(runtime_versions())
        DISPATCHER.put(Saved(str(run), int(step), os.fspath(path), cfg, resolve_mode(signal, env), versions))
    except Exception as e:  # a bad argument must not end a training run either
        DISPATCHER._warn("call", f"ckptvault hook: notify_saved({run!r}, {step!r}, ...) failed ({e}); not signalled")
