"""Which task runner an ingest pass gets, decided from the flags and `[scale]` (no network), and
the one check that needs the network: the scheduler answers and has workers.

Kept apart from ckptvault_prefect/runtime/runners.py, which imports prefect-dask and distributed (~1 s): the default
path (no Dask at all) decides here without paying for them.

A Dask runner is chosen only where Dask imports (`require_dask`): without the `dask` extra, the
flag or key that asked for one is named with the fix.

Precedence: a command-line flag wins over `[scale]`, and either flag replaces the whole section
(`--dask-workers 2` on a host whose config names a cluster runs locally): a flag is what the
operator typed for this one run. Both flags at once is an error, as are both keys in the config.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ckptvault.config import ScaleConfig, parse_dask_address
from ckptvault.errors import CkptvaultError

RunnerKind = Literal["threads", "local", "cluster"]


class RunnerChoiceError(CkptvaultError, ValueError):
    """The flags and [scale] do not name a runner that can work: the message says which and the fix."""


class SchedulerUnreachable(CkptvaultError, RuntimeError):
    """The Dask scheduler did not answer, or has no workers: the message names the address and the fix."""


@dataclass(frozen=True)
class RunnerChoice:
    kind: RunnerKind  # threads: the flow's own ThreadPoolTaskRunner; local: a new LocalCluster; cluster: address
    origin: str  # what decided it, for messages: "--dask-address", "[scale] local_workers", "default"
    address: str | None = None
    workers: int = 0
    processes: bool = False  # local only: worker processes (need a Prefect API) or threads in this process
    connect_timeout: float = 10.0

    @property
    def from_flag(self) -> bool:
        """Typed for this one command (--dask-address, --dask-workers), not read from [scale]."""
        return self.origin.startswith("--")

    @property
    def needs_prefect(self) -> bool:
        """Dask workers run Prefect task runs: the flow must be a flow run, not direct mode."""
        return self.kind != "threads"


def choose_runner(
    scale: ScaleConfig, *, address_flag: str | None, workers_flag: int | None, api_url: str | None
) -> RunnerChoice:
    """The runner for one ingest pass. `api_url`: PREFECT_API_URL as configured (None or empty: none).

    Worker processes report their task runs to the Prefect API of the settings they carry, so they
    need a real server; without one a LocalCluster runs as threads in this process (a temporary API
    lives in this process only), and an existing cluster is refused."""
    timeout = scale.connect_timeout_seconds
    if address_flag is not None and workers_flag is not None:
        raise RunnerChoiceError(
            "--dask-address and --dask-workers both given: the first runs on an existing cluster, the "
            "second starts one here; give one of them"
        )
    if address_flag is not None:
        try:
            address = parse_dask_address(address_flag)
        except ValueError as e:
            raise RunnerChoiceError(f"--dask-address: {e}") from None
        require_dask("--dask-address")
        return _cluster(address, "--dask-address", api_url, timeout)
    if workers_flag is not None:
        if workers_flag < 1:
            raise RunnerChoiceError(f"--dask-workers {workers_flag}: give 1 or more workers")
        require_dask("--dask-workers")
        return RunnerChoice("local", "--dask-workers", workers=workers_flag, processes=bool(api_url))
    if scale.dask_address is not None:
        require_dask("[scale] dask_address")
        return _cluster(scale.dask_address, "[scale] dask_address", api_url, timeout)
    if scale.local_workers is not None:
        require_dask("[scale] local_workers")
        return RunnerChoice("local", "[scale] local_workers", workers=scale.local_workers, processes=bool(api_url))
    return RunnerChoice("threads", "default")


def require_dask(origin: str) -> None:
    """RunnerChoiceError naming the fix when the `dask` extra is not installed: without it a Dask runner
    ends in a ModuleNotFoundError deep in the flow run. Imported here, not looked up: a Dask run
    imports both anyway (~1 s, paid here instead of later), and a broken install fails the same way."""
    try:
        import distributed  # noqa: F401
        import prefect_dask  # noqa: F401
    except ImportError as e:
        raise RunnerChoiceError(
            f"{origin} runs the work on Dask, which this environment cannot import ({e}): install the dask "
            "extra, pip install 'ckptvault[dask]', or leave the option out to run on this host's threads"
        ) from None


def _cluster(address: str, origin: str, api_url: str | None, timeout: float) -> RunnerChoice:
    if not api_url:
        raise RunnerChoiceError(
            f"{origin} = {address}: the cluster's workers record their task runs in Prefect, so they need a "
            "Prefect server: set PREFECT_API_URL to one that this host and every worker reach (`make up` "
            "prints it), or run here with --dask-workers N"
        )
    return RunnerChoice("cluster", origin, address=address, connect_timeout=timeout)


def check_scheduler(choice: RunnerChoice) -> int:
    """For a cluster choice: the number of workers its scheduler has, after one bounded handshake
    (`connect_timeout`). SchedulerUnreachable if it does not answer or has none: tasks sent to a
    scheduler without workers would wait for one forever."""
    assert choice.kind == "cluster" and choice.address is not None
    import logging

    from distributed import Client

    problem = security_problem(choice.address)
    if problem:
        raise RunnerChoiceError(f"{choice.origin} {choice.address}: {problem}")

    # distributed logs every failed connection attempt at WARNING/ERROR with a traceback; the operator
    # gets our one message instead
    comm_log = logging.getLogger("distributed")
    level = comm_log.level
    comm_log.setLevel(logging.CRITICAL)
    try:
        with Client(  # type: ignore[no-untyped-call]
            choice.address, timeout=choice.connect_timeout, set_as_default=False
        ) as client:
            workers = len(client.scheduler_info(n_workers=-1)["workers"])
    except (OSError, TimeoutError) as e:
        raise SchedulerUnreachable(
            f"{choice.origin}: no Dask scheduler answered at {choice.address} within {choice.connect_timeout:g} s "
            f"({type(e).__name__}: {e}). Start it (`dask scheduler`, or infra/local/dask.sh up) or fix the "
            "address; [scale] connect_timeout_seconds sets the wait"
        ) from None
    finally:
        comm_log.setLevel(level)
    if workers == 0:
        raise SchedulerUnreachable(
            f"{choice.origin}: the Dask scheduler at {choice.address} has no workers: start some "
            f"(`dask worker {choice.address}` on each node, or infra/local/dask.sh up), or run here with "
            "--dask-workers N"
        )
    return workers


def security_problem(address: str) -> str | None:
    """Why this host's Dask security config (`distributed.comm.tls.*`, `distributed.comm.require-encryption`:
    DASK_DISTRIBUTED__COMM__... variables or a Dask config file) cannot talk to `address`, or None.

    Every Client ckptvault makes takes distributed's default Security, which reads that config; left to
    itself, a tls:// address without a client certificate ends in a TypeError from deep in distributed,
    and a tcp:// address under require-encryption in a RuntimeError, both tracebacks. Checked before the
    first connection instead, naming the settings."""
    from distributed.security import Security

    scheme = address.partition("://")[0]
    try:
        security = Security()  # type: ignore[no-untyped-call]
        context = security.get_connection_args("client")["ssl_context"]  # type: ignore[no-untyped-call]
    except OSError as e:  # a certificate or key that is missing or unreadable (ssl.SSLError is one too)
        return f"the Dask TLS settings name a file that cannot be loaded ({e}): fix distributed.comm.tls.*"
    if scheme == "tls" and context is None:
        return (
            "a tls:// scheduler needs this host's client certificate: set DASK_DISTRIBUTED__COMM__TLS__CA_FILE, "
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT and DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY (or "
            "distributed.comm.tls.* in a Dask config file)"
        )
    if scheme != "tls" and security.require_encryption:
        return (
            "this host's Dask config requires encryption (distributed.comm.require-encryption), so a "
            f"{scheme}:// address is refused: use the scheduler's tls:// address"
        )
    return None


def for_restore(choice: RunnerChoice, blind: Sequence[str], where: Path) -> RunnerChoice:
    """The runner for a restore into `where`, given the cluster's workers that cannot see it (`blind`).

    The workers write into a staging directory that this process then renames into place, so every
    worker must see the destination's file system at the same path. A cluster the operator named on
    the command line that cannot is an error; `[scale]`'s cluster, set for ingest, is not what this
    restore asked for, so the restore runs from this host instead (the caller says so)."""
    if not blind:
        return choice
    if choice.from_flag:
        raise RunnerChoiceError(
            f"{choice.origin} {choice.address}: its worker(s) {', '.join(blind)} do not see {where}, where the "
            "restore stages its files: restore to a directory every worker mounts at the same path (a "
            "shared file system), or drop --dask-address (--dask-workers N runs the downloads on this host)"
        )
    return RunnerChoice("threads", f"{choice.origin}, whose worker(s) {', '.join(blind)} do not see {where}")


class ProbeError(CkptvaultError, RuntimeError):
    """The shared-destination check could not be made (the marker could not be written, or the
    cluster went away): the message names the path or the address."""


def sees_and_writes(marker: str) -> bool:
    """On a worker: whether it sees the marker this host wrote, and may create a file beside it."""
    import tempfile

    if not os.path.exists(marker):
        return False
    try:
        with tempfile.NamedTemporaryFile(dir=os.path.dirname(marker), prefix=".ckptvault-visible-"):
            return True
    except OSError:
        return False


def workers_not_seeing(choice: RunnerChoice, where: Path, answer_s: float = 30.0) -> list[str]:
    """The cluster's workers that do not see `where` (an existing directory) or may not write in it,
    by name, with why: a marker file written here, looked for by every worker, then removed. A worker
    that does not answer within `answer_s` (a hung mount) counts as not seeing it."""
    assert choice.kind == "cluster" and choice.address is not None
    import threading
    import uuid

    from distributed import Client

    marker = where / f".ckptvault-visible-{uuid.uuid4().hex[:12]}"
    try:
        marker.write_bytes(b"")
    except OSError as e:
        raise ProbeError(f"cannot write in {where}, where the restore stages its files: {e.strerror or e}") from None
    answers: dict[str, object] = {}
    try:
        client = Client(choice.address, timeout=choice.connect_timeout, set_as_default=False)  # type: ignore[no-untyped-call]
        try:
            info = client.scheduler_info(n_workers=-1)["workers"]

            def ask(addr: str) -> None:
                try:
                    answers[addr] = client.run(sees_and_writes, str(marker), workers=[addr], on_error="return")[addr]
                except Exception as e:  # the worker left, or the comm broke: not seeing it
                    answers[addr] = e

            askers = [threading.Thread(target=ask, args=(a,), daemon=True) for a in info]
            for t in askers:
                t.start()
            deadline = time.monotonic() + answer_s
            for t in askers:
                t.join(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            client.close(timeout=2)  # type: ignore[no-untyped-call]
    except (OSError, TimeoutError) as e:
        raise ProbeError(f"the Dask scheduler at {choice.address} went away while checking {where}: {e}") from None
    finally:
        marker.unlink(missing_ok=True)
    blind = []
    for addr, w in info.items():
        name = str(w.get("name", addr))
        got = answers.get(addr)
        if got is None:
            blind.append(f"{name} (no answer in {answer_s:g} s)")
        elif got is not True:
            blind.append(name if got is False else f"{name} ({got})")
    return sorted(blind)


def worker_resources() -> list[dict[str, float]] | None:
    """The resources of every worker of this flow run's Dask cluster (node-0=1 ...), or None when the
    flow's tasks do not run on Dask (threads, or direct mode): node-local sources need Dask."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    runner = ctx.task_runner if ctx is not None else None
    if hasattr(runner, "resolved"):  # ckptvault_prefect.runtime.configured: the runner the run's [scale] chose
        runner = runner.resolved()  # type: ignore[union-attr]
    if runner is None or type(runner).__name__ not in ("DaskTaskRunner", "CkptvaultDaskTaskRunner"):
        return None
    info = runner.client.scheduler_info(n_workers=-1)["workers"]  # type: ignore[attr-defined]
    return [dict(w.get("resources") or {}) for w in info.values()]


def pinned(resource: str) -> AbstractContextManager[None]:
    """Tasks submitted inside run only on a worker that has `resource` (Dask worker resources: the
    Prefect Dask client's submit merges dask.annotate's annotations into each task's)."""
    from dask.base import annotate

    return annotate(resources={resource: 1})
