"""`ckptvault ls` filters and `ckptvault catalog stats` through the CLI, against a catalog on SeaweedFS."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog, Event
from ckptvault.config import StoreConfig
from ckptvault.store import open_store
from ckptvault_cli.main import main
from tests.helpers import write_config

DAY = 86400.0
NOV_1 = 1793491200.0  # 2026-11-01T00:00:00Z


def _life(run: str, step: int, created: float, cls: str = "STANDARD") -> list[Event]:
    return [
        Event(run, step, "discovered", created + 1, format="hf", created_at=created),
        Event(run, step, "uploaded", created + 2, bytes=1000 * step, files=3, storage_class=cls),
        Event(run, step, "verified", created + 3),
    ]


@pytest.fixture
def catalog_cfg(seaweedfs: Any, bucket_factory: Callable[[Any], str], tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Catalog]:  # fmt: skip
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [])
    store = open_store(StoreConfig(bucket=bucket, endpoint_url=seaweedfs.url, region=seaweedfs.region))
    return cfg, Catalog(store, "t")


def _ls(cfg: Path, capsys: pytest.CaptureFixture[str], *args: str) -> list[tuple[str, int]]:
    capsys.readouterr()
    assert main(["--config", str(cfg), "ls", *args, "--json"]) == 0
    return [(r["run"], r["step"]) for r in json.loads(capsys.readouterr().out)]


def test_ls_since_and_limit_filter_and_combine_with_run_and_state(
    catalog_cfg: tuple[Path, Catalog], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, cat = catalog_cfg
    now = time.time()
    events = [
        *_life("a", 100, NOV_1 - DAY), *_life("a", 200, NOV_1 + DAY), *_life("a", 300, now - 2 * DAY),
        *_life("b", 100, NOV_1 + 2 * DAY), *_life("b", 200, now - 3600),
        Event("b", 300, "discovered", now - 60, format="hf", created_at=now - 120),  # pending, the newest
    ]  # fmt: skip
    cat.append(events)
    everything = [("a", 100), ("a", 200), ("a", 300), ("b", 100), ("b", 200), ("b", 300)]
    assert _ls(cfg, capsys) == everything
    assert _ls(cfg, capsys, "--since", "2026-11-01") == everything[1:]
    assert _ls(cfg, capsys, "--since", "2026-11-02T12:00:00Z") == [("a", 300), ("b", 100), ("b", 200), ("b", 300)]
    assert _ls(cfg, capsys, "--since", "2026-11-02T13:00:00+01:00") == [("a", 300), ("b", 100), ("b", 200), ("b", 300)]
    assert _ls(cfg, capsys, "--since", "7d") == [("a", 300), ("b", 200), ("b", 300)]
    assert _ls(cfg, capsys, "--since", "12h") == [("b", 200), ("b", 300)]
    # the N newest, listed in the usual (run, step, save) order
    assert _ls(cfg, capsys, "--limit", "3") == [("a", 300), ("b", 200), ("b", 300)]
    assert _ls(cfg, capsys, "--limit", "100") == everything
    # they combine: the state and run first, then since, then the newest N of what is left
    assert _ls(cfg, capsys, "--state", "verified", "--limit", "2") == [("a", 300), ("b", 200)]
    assert _ls(cfg, capsys, "--run", "a", "--since", "2026-11-01", "--limit", "1") == [("a", 300)]
    assert _ls(cfg, capsys, "--run", "b", "--since", "2h", "--state", "verified") == [("b", 200)]
    # the table says the same
    capsys.readouterr()
    assert main(["--config", str(cfg), "ls", "--run", "a", "--since", "2026-11-01"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[:2] for ln in lines[1:]] == [["a", "200"], ["a", "300"]]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--since", "last tuesday"], "--since 'last tuesday' is neither a time nor a duration; give a date"),
        (["--since", "7x"], "duration back from now (7d, 12h, 30m)"),
        (["--since", "2026-13-01"], "--since '2026-13-01'"),
        (["--limit", "0"], "--limit 0: give a number of checkpoint saves, 1 or more (e.g. --limit 20)"),
        (["--limit", "ten"], "argument --limit: invalid int value: 'ten'"),
    ],
)
def test_ls_refuses_a_bad_since_or_limit_naming_the_flag(
    catalog_cfg: tuple[Path, Catalog], capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    cfg, _ = catalog_cfg
    capsys.readouterr()
    try:
        code = main(["--config", str(cfg), "ls", *args, "--json"])
    except SystemExit as e:  # argparse's own type check, also exit 2
        code = int(e.code or 0)
    out = capsys.readouterr()
    assert code == 2
    assert needle in out.err
    assert "Traceback" not in out.err
    assert out.out == ""


def test_catalog_stats_counts_runs_checkpoints_events_files_and_bytes_per_class(
    catalog_cfg: tuple[Path, Catalog], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, cat = catalog_cfg
    cat.append([*_life("a", 1, 1000.0), *_life("a", 2, 2000.0, "GLACIER_IR")])
    cat.append([*_life("b", 1, 3000.0), Event("b", 2, "discovered", 4000.0)])
    cat.append([Event("b", 1, "expired", 5000.0)])
    # one of a's files compacted into a snapshot, then an event after it; b stays uncompacted
    cat.compact(time.time() + 10, runs=["a"])
    cat.append([Event("a", 1, "drilled", 6000.0, ok=True)])
    capsys.readouterr()
    assert main(["--config", str(cfg), "catalog", "stats", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["runs"] == 2
    assert doc["checkpoints"] == 4
    assert doc["events"] == 6 + 4 + 1 + 1
    assert doc["files"] == {"events": 4, "snapshots": 1, "combined": 1, "flat": 0, "set_aside": 0}
    assert doc["catalog_bytes"] > 0
    assert doc["by_state"] == {"expired": 1, "pending": 1, "verified": 2}
    assert doc["by_class"] == {
        "GLACIER_IR": {"checkpoints": 1, "bytes": 2000, "stored_bytes": 2000},  # uncompressed: the same
        "STANDARD": {"checkpoints": 1, "bytes": 1000, "stored_bytes": 1000},
    }
    assert doc["unreadable"] == {}
    # no verified event here records what wrote its save: both saves in the store are unrecorded
    assert doc["by_writer"] == [] and doc["writer_unrecorded"] == 2
    capsys.readouterr()
    assert main(["--config", str(cfg), "catalog", "stats"]) == 0
    text = capsys.readouterr().out
    assert "2 runs, 4 checkpoint saves, 12 events" in text
    assert "1 snapshots, 1 combined," in text
    assert "GLACIER_IR" in text
    assert "by writer: -; recording none: 2" in text


def test_plan_and_catalog_stats_show_each_store_and_the_replicas_egress_only_with_replicas(
    catalog_cfg: tuple[Path, Catalog], capsys: pytest.CaptureFixture[str]
) -> None:
    from ckptvault.catalog import events as ev

    cfg, cat = catalog_cfg
    now = time.time()
    cat.append([*_life("a", 1, now - 3 * DAY), *_life("a", 2, now - 2 * DAY), *_life("a", 3, now - DAY)])

    def run(*args: str) -> str:
        capsys.readouterr()
        assert main(["--config", str(cfg), *args]) == 0
        return capsys.readouterr().out

    # without [[replicas]]: no section, no new key, no price looked at
    assert "per store" not in run("catalog", "stats") and "per store" not in run("plan")
    assert "stores" not in json.loads(run("catalog", "stats", "--json"))
    assert "stores" not in json.loads(run("plan", "--json"))
    cfg.write_text(
        cfg.read_text() + '\n[[replicas]]\nname = "ceph-dr"\nbucket = "dr-bucket"\n'
        'endpoint_url = "http://rgw.dr.invalid:7480"\nstorage_class = "COLD"\nprices = { COLD = 0.002 }\n'
    )
    cat.append([
        ev.replicated("a", s, 1, store="ceph-dr", key="k", nbytes=1000, seconds=0.1, storage_class="COLD")
        for s in (1, 2)
    ])  # fmt: skip
    for cmd in (("catalog", "stats", "--json"), ("plan", "--json")):
        doc = json.loads(run(*cmd))
        rows = {(r["store"], r["class"]): (r["saves"], r["bytes"]) for r in doc["stores"]}
        assert rows == {("primary", "STANDARD"): (3, 6000), ("ceph-dr", "COLD"): (2, 3000)}, cmd
        assert doc["stores_total"]["bytes"] == 9000
        [egress] = doc["egress"]
        # SeaweedFS runs on premises: another endpoint is the internet, and it bills no egress
        assert (egress["replica"], egress["route"], egress["usd_per_gb"]) == ("ceph-dr", "internet", 0.0)
        assert egress["last_30_days"] == {"saves": 2, "bytes": 3000}
        assert (egress["to_copy"]["saves"], egress["to_copy"]["bytes"]) == (1, 3000)
    assert doc["cost"] and "usd_month_before" in doc  # the plan's keys stay
    for text in (run("catalog", "stats"), run("plan")):
        assert "per store and storage class, now:" in text and "egress to ceph-dr (internet, $0.0000/GB" in text
