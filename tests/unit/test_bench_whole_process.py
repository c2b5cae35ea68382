"""bench/whole_process.py's pure part: the interleaving order, medians over the good reps, the ratios and
the report. No server, no timing (the numbers below are made up)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.whole_process import (
    median_seconds,
    parse_args,
    profile_columns,
    profile_gap,
    ratio,
    render,
    rotated,
    summarize,
    targets,
)


def run(tool: str, seconds: float, op: str = "ingest", ok: bool = True, **kw: Any) -> dict[str, Any]:
    return {"server": "ceph", "gib": 4.0, "op": op, "tool": tool, "seconds": seconds, "ok": ok, "load1": 2.0, **kw}


def test_rotated_runs_every_tool_once_per_rep_and_each_first_once() -> None:
    tools = ["ckptvault", "awscli", "s5cmd"]
    orders = [rotated(tools, rep) for rep in range(3)]
    assert all(sorted(o) == sorted(tools) for o in orders)
    assert [o[0] for o in orders] == tools
    assert rotated(tools, 3) == tools
    assert rotated([], 5) == []


def test_median_leaves_failed_runs_out() -> None:
    assert median_seconds([run("s5cmd", 10), run("s5cmd", 1, ok=False), run("s5cmd", 12)]) == 11
    assert median_seconds([run("s5cmd", 1, ok=False)]) is None


def test_ratio_is_peer_seconds_over_ours() -> None:
    assert ratio(30.0, 20.0) == 1.5
    assert ratio(None, 20.0) is None
    assert ratio(30.0, None) is None


def test_summarize_one_row_per_ckptvault_contender_with_the_peers_medians() -> None:
    runs = [
        run("ckptvault", 20),
        run("ckptvault@before", 40),
        run("awscli", 30),
        run("s5cmd", 25),
        run("ckptvault", 22),
        run("ckptvault@before", 44, ok=False),
        run("awscli", 32),
        run("s5cmd", 27),
        run("ckptvault+warm", 18),
    ]
    rows = summarize(runs)
    assert [r.tool for r in rows] == ["ckptvault", "ckptvault@before", "ckptvault+warm"]
    now, before, warm = rows
    assert warm.seconds == 18 and warm.ratios["s5cmd"] == pytest.approx(26 / 18)
    assert now.seconds == 21 and now.spread == (20, 22)
    assert now.peers == {"awscli": 31, "s5cmd": 26}
    assert now.ratios["awscli"] == pytest.approx(31 / 21)
    assert before.seconds == 40 and before.failed == 1 and before.reps == 2


def test_render_and_targets() -> None:
    runs = [run("ckptvault", 20), run("awscli", 30), run("s5cmd", 18)]
    runs += [run("ckptvault", 10, op="restore"), run("awscli", 12, op="restore"), run("s5cmd", 5, op="restore")]
    runs += [run("s5cmd+sync", 11, op="restore")]
    rows = summarize(runs)
    text = render(rows)
    ingest, restore = text.splitlines()[2:]
    assert ingest.startswith("| ceph | 4 | ingest | ckptvault | 20.0 (20.0-20.0) | 30.0 | 18.0 |  | 1.50 | 0.90 |  |")
    assert "| 10.0 (10.0-10.0) | 12.0 | 5.0 | 11.0 | 1.20 | 0.50 | 1.10 |" in restore
    assert targets(rows) == [
        "- [x] ceph: ckptvault ingest >= 1.0x awscli at 4 GiB (1.50)",
        "- [ ] ceph: ckptvault ingest >= 1.0x s5cmd at 4 GiB (0.90)",
        "- [x] ceph: ckptvault restore >= 1.0x s5cmd+sync at 4 GiB (1.10)",
    ]
    assert targets(rows, gib=1) == []


def test_profile_columns_and_gap() -> None:
    prof = {"total_s": 9.9, "phases": [{"phase": "transfer", "seconds": 9.9}], "alongside": []}
    runs = [run("ckptvault", 10, profile=prof), run("s5cmd", 5), run("ckptvault", 3, ok=False, profile=prof)]
    assert profile_columns(runs, 4.0) == {"ceph ingest (ckptvault)": [{"wall": 10, "profile": prof}]}
    assert profile_gap(runs) == pytest.approx(0.01)
    assert profile_gap([run("s5cmd", 5)]) is None


def test_tree_must_be_a_checkout(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--tree", f"before={tmp_path}"])
    (tmp_path / "ckptvault_cli").mkdir()
    a = parse_args(["--tree", f"before={tmp_path}", "--sizes", "1,4"])
    assert a.trees == [("ckptvault@before", tmp_path.resolve())] and a.sizes == [1.0, 4.0]
