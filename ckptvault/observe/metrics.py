"""Prometheus metrics computed from the catalog (docs/metrics.md has the table of every name).

Pull, not push: `CatalogCollector.collect` reads the catalog's current state on each scrape (or each
`ckptvault metrics`), so a flow that crashed cannot leave a stale gauge behind, and a scrape that cannot
read the catalog says so (`ckptvault_catalog_up 0`) instead of repeating old numbers. Only gauges and one
histogram of what the catalog holds now: labels run, class, store and state, never a step or a key, so
the series are bounded by the fleet's runs, not its saves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import generate_latest, pushadd_to_gateway, start_http_server, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ckptvault.catalog import Catalog
from ckptvault.catalog.summary import FleetSummary, summarize
from ckptvault.config import Config
from ckptvault.errors import CkptvaultError
from ckptvault.observe import ledger as ledger_lib
from ckptvault.pricing import PriceError, PriceTable, load_prices

log = logging.getLogger("ckptvault.metrics")

PREFIX = "ckptvault"
# created -> verified, seconds: a save every few hours is archived within minutes when all is well
LAG_BUCKETS = (60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)


@dataclass(frozen=True)
class MetricsOptions:
    """What the configuration adds to the catalog's figures: the alert rules compare against these, so a
    threshold is set once, in the config the watch flow reads too."""

    cover_days: float | None = None  # [drill] cover_days: the drill coverage window (None: ever drilled)
    prices: PriceTable | None = None  # None: no cost metric
    stale_after: Mapping[str, float] = field(default_factory=dict)  # run -> seconds ([[sources]] stale_after_hours)
    budget_usd_per_month: float | None = None  # [notify] budget_usd_per_month


def options_for(cfg: Config) -> MetricsOptions:
    """The options a configuration gives (raises PriceError for a bad `[policy.prices]`)."""
    return MetricsOptions(
        cover_days=cfg.drill.cover_days,
        prices=load_prices(cfg.policy.prices),
        stale_after={s.run: s.stale_after_hours * 3600 for s in cfg.sources if s.stale_after_hours is not None},
        budget_usd_per_month=cfg.notify.budget_usd_per_month,
    )


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))


# ledger family -> (exported name without _total, help); docs/metrics.md, "What the flows did"
_LEDGER_COUNTERS: dict[str, tuple[str, str]] = {
    "alerts_sent": ("alerts_sent", "Alerts delivered, by kind."),
    "restore_bytes": ("restore_bytes", "Original bytes restored (restores that ended restored)."),
    "restore_seconds": ("restore_seconds", "Seconds those restores spent bringing the bytes back."),
    "drill_bytes": ("drill_bytes", "Original bytes of the saves drilled, passed or not."),
    "drill_seconds": ("drill_seconds", "Seconds those drills took (restore and load check)."),
    "upload_failures": ("upload_failures", "Failed upload attempts (each retrying pass counts), by error class."),
    "restore_failures": ("restore_failures", "Restores that failed, by error class."),
    "store_retries": ("store_retries", "Store calls retried after a transient error, by operation."),
}


def ledger_families(led: ledger_lib.Ledger) -> list[Metric]:
    """The counters and last successes the ledger holds (ckptvault/observe/ledger.py). Every counter family is
    sent, a labelled one with the labels it has seen (none before anything happened)."""
    totals = led.totals()
    out: list[Metric] = []
    for family, (name, doc) in _LEDGER_COUNTERS.items():
        label = ledger_lib.FAMILIES[family]
        c = _counter(name, doc, (label,) if label else ())
        if label:
            for key, v in sorted(totals.items()):
                f, value = ledger_lib.split_key(key)
                if f == family:
                    c.add_metric([value], v)
        else:
            c.add_metric([], totals.get(family, 0.0))
        out.append(c)
    last = _gauge("flow_last_success_timestamp_seconds", "When each flow last ended well (unix seconds).", ("flow",))
    for flow, t in sorted(led.last_success.items()):
        last.add_metric([flow], t)
    out.append(last)
    # the gauges a flow sets (ledger.GAUGES), each once a flow has set it: absent, nothing has measured it yet
    for name, doc in ledger_lib.GAUGES.items():
        if name in led.gauges:
            g = _gauge(name, doc)
            g.add_metric([], led.gauges[name][0])
            out.append(g)
    return out


def families(s: FleetSummary, now: float, options: MetricsOptions) -> list[Metric]:
    """The metric families of one summary, in the order docs/metrics.md lists them."""
    out: list[Metric] = []
    up = _gauge("catalog_up", "1 when the catalog's current state was read on this scrape, 0 when not.")
    up.add_metric([], 1.0)
    read = _gauge("catalog_read_seconds", "Seconds this scrape took to read the catalog's current state.")
    read.add_metric([], s.read_seconds)
    unreadable = _gauge("catalog_unreadable_objects", "Catalog objects the read skipped as unreadable.")
    unreadable.add_metric([], float(s.unreadable))
    computed = _gauge("metrics_timestamp_seconds", "When these metrics were computed (unix seconds).")
    computed.add_metric([], now)
    runs = _gauge("runs", "Runs the catalog knows.")
    runs.add_metric([], float(len(s.runs)))
    out += [up, read, unreadable, computed, runs]

    newest = _gauge(
        "run_newest_verified_timestamp_seconds",
        "Commit time (the manifest written, the verified event) of the run's newest good save.",
        ("run",),
    )
    created = _gauge(
        "run_newest_verified_created_timestamp_seconds",
        "When the trainer wrote the run's newest good save (its files' newest mtime).",
        ("run",),
    )
    lag = _gauge("run_newest_archive_lag_seconds", "Created to verified of the run's newest good save.", ("run",))
    rpo = _gauge(
        "run_newest_rpo_seconds",
        "Commit marker to verified manifest of the run's newest good save, as its ingest recorded it.",
        ("run",),
    )
    drill_at = _gauge("run_last_drill_timestamp_seconds", "When a save of the run was last drilled.", ("run",))
    drill_ok = _gauge("run_last_drill_success", "1 when the run's last drill passed, 0 when it failed.", ("run",))
    drill_pass = _gauge(
        "run_drill_last_success_timestamp_seconds", "When a drill of a save of the run last passed.", ("run",)
    )
    suspect = _gauge("run_suspect_saves", "Verified saves of the run whose last drill failed.", ("run",))
    for name, r in sorted(s.runs.items()):
        if r.newest_verified_at is not None:
            newest.add_metric([name], r.newest_verified_at)
        if r.newest_created_at is not None:
            created.add_metric([name], r.newest_created_at)
        if r.newest_lag_seconds is not None:
            lag.add_metric([name], r.newest_lag_seconds)
        if r.newest_rpo_seconds is not None:
            rpo.add_metric([name], r.newest_rpo_seconds)
        if r.last_drill_at is not None:
            drill_at.add_metric([name], r.last_drill_at)
            drill_ok.add_metric([name], 1.0 if r.last_drill_ok else 0.0)
        if r.last_drill_success_at is not None:
            drill_pass.add_metric([name], r.last_drill_success_at)
        suspect.add_metric([name], float(r.suspect))
    out += [newest, created, lag, rpo, drill_at, drill_ok, drill_pass, suspect]

    states = _gauge("saves", "Checkpoint saves per lifecycle state.", ("state",))
    for state, n in s.by_state.items():
        states.add_metric([state], float(n))
    out.append(states)
    writers = _gauge(
        "saves_by_writer",
        "Saves in the store whose checkpoint records this writer at this version (ls --json's written_by).",
        ("writer", "version"),
    )
    for (writer, version), n in sorted(s.by_writer.items()):
        writers.add_metric([writer, version], float(n))
    out.append(writers)

    saves = _gauge("class_saves", "Saves in the store per storage class.", ("class",))
    nbytes = _gauge("class_bytes", "Original bytes of the saves in the store per storage class.", ("class",))
    stored = _gauge("class_stored_bytes", "Bytes the store holds (and bills) per storage class.", ("class",))
    cost = _gauge(
        "class_monthly_cost_usd", "USD per month the saves in each storage class cost (pricing.py).", ("class",)
    )
    for c, cs in sorted(s.by_class.items()):
        saves.add_metric([c], float(cs.saves))
        nbytes.add_metric([c], float(cs.bytes))
        stored.add_metric([c], float(cs.stored_bytes))
        if options.prices is not None:
            try:
                cost.add_metric([c], options.prices.monthly_cost_total(cs.billed, c, cs.objects))
            except PriceError as e:  # a class with no price: the other metrics still go out
                log.warning("metrics: no monthly cost for class %s: %s", c, e)
    out += [saves, nbytes, stored]
    if options.prices is not None:
        out.append(cost)
    if options.budget_usd_per_month is not None:
        budget = _gauge("budget_usd_per_month", "[notify] budget_usd_per_month: what the storage may cost per month.")
        budget.add_metric([], options.budget_usd_per_month)
        out.append(budget)
    stale = _gauge(
        "run_stale_after_seconds",
        "[[sources]] stale_after_hours of each watched run, in seconds: CkptvaultRunStale's threshold.",
        ("run",),
    )
    for name, seconds in sorted(options.stale_after.items()):
        stale.add_metric([name], seconds)
    out.append(stale)

    hist = HistogramMetricFamily(
        f"{PREFIX}_archive_lag_seconds",
        "Created (by the trainer) to verified (in the store), over every save in the store now.",
    )
    lags = s.lag_seconds
    buckets = [(repr(float(b)), float((lags <= b).sum())) for b in LAG_BUCKETS] + [("+Inf", float(len(lags)))]
    hist.add_metric([], buckets, float(lags.sum()) if len(lags) else 0.0)
    out.append(hist)

    drillable = _gauge("drillable_saves", "Saves a drill may take: verified, not superseded, not expired.")
    drillable.add_metric([], float(s.drillable))
    never = _gauge("drill_never_drilled_saves", "Drillable saves never drilled.")
    never.add_metric([], float(s.never_drilled))
    cover = _gauge(
        "drill_coverage_ratio",
        "Share of drillable saves drilled within [drill] cover_days (ever, when unset); 1 with none drillable.",
    )
    cover.add_metric([], s.drill_covered / s.drillable if s.drillable else 1.0)
    out += [drillable, never, cover]

    replicas = _gauge("replica_saves", "Saves with a copy on each [[replicas]] store.", ("store",))
    for store, n in sorted(s.replica_saves.items()):
        replicas.add_metric([store], float(n))
    out.append(replicas)
    ingested = _counter("ingest_bytes", "Original bytes of every save committed to the store, per run.", ("run",))
    for name, b in sorted(s.ingested_bytes.items()):
        ingested.add_metric([name], float(b))
    out.append(ingested)
    return out


def down() -> list[Metric]:
    """What a scrape says when the catalog cannot be read: that, and nothing stale."""
    up = _gauge("catalog_up", "1 when the catalog's current state was read on this scrape, 0 when not.")
    up.add_metric([], 0.0)
    return [up]


class CatalogCollector(Collector):
    """A prometheus_client collector that reads the catalog on every `collect` (each scrape)."""

    def __init__(
        self, catalog: Callable[[], Catalog], options: MetricsOptions, clock: Callable[[], float] = time.time
    ) -> None:
        # a factory: a fresh Catalog per scrape, so nothing (its unreadable set, a cached combined
        # snapshot) carries over from one scrape to the next
        self._catalog = catalog
        self._options = options
        self._clock = clock

    def describe(self) -> Iterator[Metric]:
        return iter(())  # unchecked collector: registering it must not read the catalog

    def collect(self) -> Iterator[Metric]:
        got = compute(self._catalog(), self._options, self._clock())
        if got.error is not None:
            log.warning("metrics: the catalog could not be read: %s", got.error)
        return got.collect()


class Computed(Collector):
    """Metrics computed once and handed out as they are: `ckptvault metrics` writes one computation to
    a textfile, a Pushgateway and stdout alike, reading the catalog once."""

    def __init__(self, metrics: list[Metric], error: str | None = None) -> None:
        self.metrics = metrics
        self.error = error  # why the catalog could not be read (then `metrics` is catalog_up 0 alone)

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)

    @property
    def up(self) -> bool:
        return self.error is None


def compute(catalog: Catalog, options: MetricsOptions, now: float | None = None) -> Computed:
    """Every metric of the catalog now, once."""
    t = time.time() if now is None else now
    try:
        summary = summarize(catalog, t, options.cover_days)
    except (CkptvaultError, OSError) as e:
        return Computed(down(), str(e))
    out = families(summary, t, options)
    try:  # what the flows did: a ledger that cannot be read leaves out its metrics, not the catalog's
        out += ledger_families(ledger_lib.load(catalog.store, catalog.prefix))
    except (CkptvaultError, OSError) as e:
        log.warning("metrics: the ledger could not be read, its counters are left out: %s", e)
    return Computed(out)


def exposition(collector: Collector) -> bytes:
    """The text format Prometheus scrapes (0.0.4), as `/metrics` serves it."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return generate_latest(reg)


def write_textfile(path: str, collector: Collector) -> None:
    """For the node exporter's textfile collector: written to a temporary file beside `path` and
    renamed over it, so the collector never reads half a file (prometheus_client's write_to_textfile)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    write_to_textfile(path, reg)


def grouping_key(bucket: str, prefix: str) -> dict[str, str]:
    """A Pushgateway group per catalog, stable across runs and hosts: the group a push replaces. Never a
    flow-run id: the Pushgateway keeps every group it was sent until someone deletes it."""
    return {"config": f"{bucket}/{prefix.strip('/')}" if prefix.strip("/") else bucket}


def push(url: str, collector: Collector, grouping: dict[str, str], timeout: float = 10.0) -> None:
    """`pushadd` (POST: the group's other metrics kept, these replaced) under job="ckptvault"."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    pushadd_to_gateway(url, job=PREFIX, registry=reg, grouping_key=grouping, timeout=timeout)


def as_json(collector: Collector) -> list[dict[str, object]]:
    """The metrics as `ckptvault metrics --json` prints them (docs/commands.md)."""
    return [
        {
            "name": m.name, "type": m.type, "help": m.documentation,
            "samples": [{"name": s.name, "labels": dict(s.labels), "value": s.value} for s in m.samples],
        }
        for m in collector.collect()
    ]  # fmt: skip


class MetricsServerError(CkptvaultError):
    """The metrics server cannot listen where `[metrics]` says; the message names the address."""


def serve_metrics(
    bind_address: str, port: int, catalog: Callable[[], Catalog], options: MetricsOptions
) -> tuple[WSGIServer, threading.Thread]:
    """Serve `/metrics` on `bind_address:port` from a daemon thread (prometheus_client's server), every
    scrape computed from the catalog then; port 0 picks a free one (`server.server_port`). The caller
    stops it with `server.shutdown()`, or it ends with the process."""
    try:
        server, thread = start_http_server(port, bind_address, registry_for(catalog, options))
    except OSError as e:  # in use, an address this host does not have, one that does not resolve
        raise MetricsServerError(
            f"[metrics] cannot listen on {bind_address} port {port}: {e.strerror or e}. Free the port, or set "
            "another [metrics] port / bind_address"
        ) from None
    return server, thread


def registry_for(
    catalog: Callable[[], Catalog], options: MetricsOptions, clock: Callable[[], float] = time.time
) -> CollectorRegistry:
    """A registry holding only the catalog's metrics (no process or platform collectors: the same text
    from a cron's textfile and from `serve`)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(CatalogCollector(catalog, options, clock))
    return reg
