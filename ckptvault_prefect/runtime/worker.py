"""A Prefect process worker that stops when it is told to: `make up`'s two workers (infra/local/worker.sh).

    python -m ckptvault_prefect.runtime.worker --pool POOL [--work-queue QUEUE] --name NAME

The same worker as `prefect worker start --pool POOL --type process` (Prefect's own `ProcessWorker`, its
polling, heartbeats and flow-run handling unchanged), started under a cancel scope of ours. Why not
Prefect's command: its SIGTERM handler turns the signal into a SIGINT, which cancels the asyncio main task
once; on prefect 3.9.1 with anyio 4.16 that one native cancellation is lost inside the worker's task group
and the worker goes on polling (measured: still there 15 s and more after SIGTERM, and after SIGINT alike;
its second SIGTERM is a SIGKILL it sends itself). An anyio cancel scope is delivered again at every await
until the scope exits, so the worker's own teardown runs and the process ends (~0.6 s here).

On SIGTERM or SIGINT the worker stops polling and exits; flow runs it started run in sessions of their
own and are signalled by whoever stops the worker (worker.sh signals each one's group).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

import anyio


async def _serve(pool: str, queues: list[str], name: str) -> None:
    from prefect.settings import PREFECT_WORKER_HEARTBEAT_SECONDS
    from prefect.workers.process import ProcessWorker

    async with anyio.create_task_group() as group:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
                async for signum in received:
                    print(f"worker {name}: {signal.Signals(signum).name} received; stopping", flush=True)
                    group.cancel_scope.cancel()
                    return

        group.start_soon(stop_on_signal)
        worker = ProcessWorker(
            work_pool_name=pool,
            work_queues=queues or None,
            name=name,
            heartbeat_interval_seconds=int(PREFECT_WORKER_HEARTBEAT_SECONDS.value()),
        )
        await worker.start(printer=lambda *a: print(*a, flush=True))
        group.cancel_scope.cancel()  # the worker ended by itself (its API gone for good): so does the signal watch


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckptvault_prefect.runtime.worker", description="a process worker")
    parser.add_argument("--pool", required=True, help="the work pool to poll")
    parser.add_argument("--work-queue", action="append", default=[], help="a queue of the pool (repeatable; none: all)")
    parser.add_argument("--name", required=True, help="the worker's name, as the API lists it")
    args = parser.parse_args(argv)
    anyio.run(_serve, args.pool, args.work_queue, args.name)
    print(f"worker {args.name}: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
