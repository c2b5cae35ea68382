"""`ckptvault metrics`: the Prometheus metrics of the catalog, computed once (docs/metrics.md), for a cron:
printed, written for the node exporter's textfile collector, or pushed to a Pushgateway. No Prefect."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from urllib.parse import urlsplit

from ckptvault_cli.output import emit_json, say
from ckptvault_cli.preflight import EXIT_FAILED, EXIT_OK, UsageError, preflight_store


def check_textfile(path: str) -> str:
    """The textfile's path, or a UsageError naming it: checked before the catalog is read."""
    p = Path(path).expanduser()
    if not p.name.endswith(".prom"):
        raise UsageError(
            f"--textfile {path}: the node exporter's textfile collector reads only *.prom files; name it e.g. "
            f"{p.with_name(p.name + '.prom') if p.name else 'ckptvault.prom'}"
        )
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"--textfile {path}: the directory {parent} does not exist; create it or name another")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--textfile {path}: the directory {parent} is not writable by this user")
    if p.is_dir():
        raise UsageError(f"--textfile {path}: is a directory; name a file in it, e.g. {p / 'ckptvault.prom'}")
    return str(p)


def check_push_url(url: str) -> str:
    """The Pushgateway's address (http://host:port, or host:port as prometheus_client takes it)."""
    full = url if "://" in url else f"http://{url}"
    try:
        parts = urlsplit(full)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # a port that is not a number raises here
    except ValueError:
        ok = False
    if not ok:
        raise UsageError(f"--push {url}: not a Pushgateway address; give http://HOST:PORT, e.g. http://127.0.0.1:9091")
    return full


def cmd_metrics(args: argparse.Namespace) -> int:
    from ckptvault.catalog import Catalog
    from ckptvault.observe import metrics
    from ckptvault.pricing import PriceError

    textfile = check_textfile(args.textfile) if args.textfile else None
    url = check_push_url(args.push) if args.push else None
    cfg, store = preflight_store(args, need_sources=False)
    try:
        options = metrics.options_for(cfg)
    except PriceError as e:
        raise UsageError(str(e)) from None
    got = metrics.compute(Catalog(store, cfg.store.prefix), options)
    if textfile is not None:
        try:
            metrics.write_textfile(textfile, got)
        except OSError as e:
            raise UsageError(f"--textfile {textfile}: cannot be written ({e})") from None
        say(f"metrics written to {textfile}")
    if url is not None:
        group = metrics.grouping_key(cfg.store.bucket, cfg.store.prefix)
        try:
            metrics.push(url, got, group)
        except OSError as e:  # refused, unresolvable, a timeout, an HTTP error status (URLError, HTTPError)
            raise UsageError(f"--push {args.push}: the Pushgateway did not take the metrics ({e})") from None
        say(f"metrics pushed to {url} (job=ckptvault, config={group['config']})")
    if args.json:
        emit_json({"catalog_up": got.up, "metrics": metrics.as_json(got)})
    elif textfile is None and url is None:
        print(metrics.exposition(got).decode(), end="", flush=True)
    if not got.up:
        say(f"ckptvault: the catalog could not be read, so ckptvault_catalog_up is 0: {got.error}")
        return EXIT_FAILED
    return EXIT_OK
