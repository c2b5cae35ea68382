"""Makes docs/img/prometheus-lag.png, the README's picture of the archive lag in Prometheus: a real
Prometheus (Debian's, on loopback: tests/prometheus.py) scraping the `/metrics` server `ckptvault serve`
runs (ckptvault.observe.metrics.serve_metrics) every second for 90 s, over a catalog that three runs keep
committing saves to (one healthy, one whose uplink falls behind, one slow but steady), then its graph
page of `ckptvault_run_newest_archive_lag_seconds` shot in headless Chromium (tests/browser.py).

    PYTHONPATH=. python docs/screenshot_lag.py [--seconds 90] [--out docs/img/prometheus-lag.png]

The catalog is the in-memory store's, fed with `verified` events as the ingest flow records them: what
the picture shows is the metrics' own computation and Prometheus's own page, not a drawing."""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

from ckptvault.catalog import Catalog, Event
from ckptvault.observe.metrics import MetricsOptions, serve_metrics
from ckptvault.store import MemoryStore
from tests import prometheus
from tests.browser import chromium

EXPR = "ckptvault_run_newest_archive_lag_seconds"


def lag_of(run: str, i: int) -> float:
    """Seconds from the trainer's write to the commit of run's i-th save in this picture."""
    if run == "llama-70b":  # healthy: a few minutes, a little jitter
        return 180.0 + 40.0 * ((i * 7) % 5)
    if run == "mistral-7b":  # the uplink saturates: each save waits behind the last
        return 240.0 + 160.0 * i
    return 1500.0 + 100.0 * (i % 3)  # gpt-small: slow storage, steady


def feed(catalog: Catalog, stop: threading.Event, every: float) -> None:
    i = 0
    while not stop.is_set():
        now = time.time()
        catalog.append([
            Event(run, 1000 * (i + 1), "verified", now, format="hf", bytes=2**30, files=4, storage_class="STANDARD",
                  created_at=now - lag_of(run, i))
            for run in ("llama-70b", "mistral-7b", "gpt-small")
        ])  # fmt: skip
        i += 1
        stop.wait(every)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=90.0, help="how long Prometheus scrapes before the shot")
    ap.add_argument("--out", default="docs/img/prometheus-lag.png", help="where the PNG goes")
    args = ap.parse_args()
    store = MemoryStore("ckpts")
    server, _ = serve_metrics("127.0.0.1", 0, lambda: Catalog(store, "t"), MetricsOptions())
    stop = threading.Event()
    feeder = threading.Thread(target=feed, args=(Catalog(store, "t"), stop, args.seconds / 12), daemon=True)
    feeder.start()
    work = Path(tempfile.mkdtemp(prefix="ckptvault-shot-"))
    prom = prometheus.start(work, [f"127.0.0.1:{server.server_port}"])
    try:
        time.sleep(args.seconds)
        query = urllib.parse.urlencode(
            {"g0.expr": EXPR, "g0.tab": "0", "g0.stacked": "0", "g0.range_input": f"{int(args.seconds)}s"}
        )
        out = Path(args.out).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        with chromium(work) as browser:
            browser.set_window_size(1400, 1000)
            browser.get(f"{prom.url}/graph?{query}")
            time.sleep(5)  # the classic UI draws after its query returns
            browser.save_screenshot(str(out))
        print(f"wrote {out}")
    finally:
        stop.set()
        prometheus.stop(prom)
        server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
