"""`ls` rendering and the catalog read's GC pause: the fast paths say exactly what the plain ones did."""

from __future__ import annotations

import gc
import json
import threading
from datetime import UTC, datetime

from ckptvault.catalog import Event, fold
from ckptvault.catalog.listing import _iso, as_record, render_json, render_table
from ckptvault.catalog.reading import gc_paused


def test_render_json_is_one_list_a_save_per_line_equal_to_the_records() -> None:
    events = [
        Event("r", 1, "uploaded", 1.7e9, bytes=5, storage_class="STANDARD", created_at=1.7e9 - 3.25),
        Event("r", 1, "verified", 1.7e9 + 1),
        Event('r\u00e9/"x', 2, "discovered", 1.7e9 + 2.999),
        Event("r", 3, "drilled", 1.7e9 + 3, ok=False),
    ]
    states = fold(events)
    text = render_json(states)
    assert json.loads(text) == [as_record(s) for s in states]
    assert text.splitlines()[0] == "[" and text.splitlines()[-1] == "]"
    assert len(text.splitlines()) == len(states) + 2
    assert render_json([]) == "[]"
    for t in (0.0, 1.7e9 + 0.999, -1.5, 4102444799.9):
        assert _iso(t) == datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_gc_paused_nests_across_threads_and_restores_what_was_there() -> None:
    assert gc.isenabled()
    inside = threading.Event()
    leave = threading.Event()

    def other() -> None:
        with gc_paused():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    with gc_paused():
        t.start()
        inside.wait(10)
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread is still inside
    leave.set()
    t.join(10)
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # off before, off after
    finally:
        gc.enable()


def test_an_empty_listing_with_filters_names_them_not_an_empty_catalog() -> None:
    assert render_table([]) == "(no checkpoints in the catalog yet)"
    text = render_table([], ["--run llama-8b", "--state verified"])
    assert "no checkpoint save matches --run llama-8b --state verified" in text
    assert "catalog yet" not in text
    assert "`ckptvault ls` without them" in text


def test_ls_shows_the_copies_only_where_a_save_has_replicas() -> None:
    from ckptvault.catalog import events as ev

    rep = ev.replicated("r", 2, 1, store="ceph-dr", key="k", nbytes=1, seconds=0.1, storage_class="COLD")
    states = fold([Event("r", 1, "verified", 1.0, bytes=5), Event("r", 2, "verified", 1.0, bytes=5), rep])
    one, two = states
    assert (one.copies, two.copies) == (1, 2)
    rec = as_record(two)
    assert rec["copies"] == 2 and rec["last_event"] == "verified"
    assert rec["replicas"] == [
        {"store": "ceph-dr", "storage_class": "COLD", "verified_at": _iso(rep.at), "retain_until": None}
    ]
    table = render_table(states).splitlines()
    assert (
        table[0].endswith("COPIES") and table[2].endswith("2 (primary, ceph-dr)") and table[1].endswith("1 (primary)")
    )
    assert "COPIES" not in render_table(states[:1])  # no replica anywhere: the columns of before


def test_ls_shows_the_rpo_only_where_a_save_has_one() -> None:
    from ckptvault.catalog.listing import rpo_text

    states = fold(
        [
            Event("r", 1, "verified", 1.0, bytes=5),  # before rpo_seconds was recorded (or a rebuild)
            Event("r", 2, "verified", 2.0, bytes=5, detail='{"rpo_seconds": 4.25}'),
            Event("r", 3, "verified", 3.0, bytes=5, detail='{"rpo_seconds": 754.0}'),
        ]
    )
    table = render_table(states).splitlines()
    assert table[0].split()[-1] == "RPO"
    assert [line.rsplit("  ", 1)[-1].strip() for line in table[1:]] == ["-", "4.2 s", "13 min"]
    assert "RPO" not in render_table(states[:1])  # none recorded anywhere: the columns of before
    assert [as_record(s)["rpo_ms"] for s in states] == [None, 4250, 754000]
    assert (rpo_text(59.94), rpo_text(60.0), rpo_text(0.0)) == ("59.9 s", "60 s", "0.0 s")
