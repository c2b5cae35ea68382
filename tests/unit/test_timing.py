"""The phase recorder behind `--profile` (ckptvault/clock/timing.py): exclusive time on one timeline, worker
threads beside it, the remainder as "other", and nothing at all while it is off. Sums are checked
with a clock under the test's control, never against real durations."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from ckptvault.clock import timing
from ckptvault.clock.timing import OTHER, Recorder


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    c = Clock()
    monkeypatch.setattr(timing.time, "perf_counter", c)
    yield c


def test_off_records_nothing(clock: Clock) -> None:
    r = Recorder()
    with r.phase("transfer"):
        clock.now += 5
    r.charge("imports", clock.now)
    assert not r.enabled
    assert r._on == {} and r._stacks == {}


def test_nesting_charges_the_innermost_phase_and_the_rest_to_other(clock: Clock) -> None:
    r = Recorder()
    r.enable(origin=90.0)  # the process started 10 s before the recorder was on
    r.charge("process start", 93.0)
    r.charge("imports", 100.0)
    clock.now = 101.0  # 1 s no phase covers
    with r.phase("prefect flow run"):
        clock.now += 2  # the flow run's own overhead
        with r.phase("transfer"):
            clock.now += 7
            with r.phase("verification"):
                clock.now += 3
            clock.now += 1
        clock.now += 0.5
    with r.phase("transfer"):  # entered again: added up
        clock.now += 2
    clock.now += 0.25
    b = r.report()
    assert dict(b.phases) == {
        "process start": 3.0,
        "imports": 7.0,
        "prefect flow run": 2.5,
        "transfer": 10.0,
        "verification": 3.0,
        OTHER: 1.25,
    }
    assert [n for n, _ in b.phases] == [
        "process start",
        "imports",
        "prefect flow run",
        "transfer",
        "verification",
        OTHER,
    ]
    assert b.total == pytest.approx(26.75)
    assert sum(s for _, s in b.phases) == pytest.approx(b.total)


def test_an_open_phase_is_charged_up_to_the_report(clock: Clock) -> None:
    r = Recorder()
    r.enable()
    with r.phase("shutdown"):
        clock.now += 4
        b = r.report(end=clock.now + 1)
    assert b.seconds("shutdown") == pytest.approx(5.0)
    assert b.total == pytest.approx(5.0)


def test_other_threads_are_summed_beside_the_timeline_not_into_it(clock: Clock) -> None:
    r = Recorder()
    r.enable()
    entered, release = threading.Event(), threading.Event()

    def worker() -> None:
        with r.phase("upload"):
            entered.set()
            release.wait(10)
            with r.phase("verification"):
                clock.now += 0.0  # no time of its own: the outer phase keeps it all
        with r.phase("upload"):
            pass

    with r.phase("transfer"):
        t = threading.Thread(target=worker)
        t.start()
        assert entered.wait(10)
        clock.now += 6  # the main thread waits while the worker uploads
        release.set()
        t.join(10)
    b = r.report()
    assert dict(b.phases) == {"transfer": 6.0, OTHER: 0.0}
    assert b.total == pytest.approx(6.0)
    assert dict(b.alongside) == {"upload": 6.0, "verification": 0.0}
    assert "upload" in "\n".join(b.table())


def test_many_threads_at_once_lose_no_time(clock: Clock) -> None:
    r = Recorder()
    r.enable()
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait(10)
        for _ in range(200):
            with r.phase("hash"):
                pass

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    clock.now += 3
    b = r.report()
    # every enter and leave was taken under the lock: the per-thread stacks all emptied
    assert all(not s.names for s in r._stacks.values())
    assert len(r._stacks) == 9
    assert dict(b.phases) == {OTHER: 3.0}


def test_the_table_and_dict_carry_every_phase_and_the_total() -> None:
    b = timing.Breakdown((("imports", 1.0), ("transfer", 2.5), (OTHER, 0.5)), 4.0, (("upload", 5.0),))
    text = "\n".join(b.table())
    for name in ("imports", "transfer", OTHER, "total", "upload"):
        assert name in text
    d = b.as_dict()
    assert d["total_s"] == 4.0
    assert [p["phase"] for p in d["phases"]] == ["imports", "transfer", OTHER]  # type: ignore[attr-defined,union-attr]


def test_expected_names_come_first_in_order_with_zeros(clock: Clock) -> None:
    r = Recorder()
    r.enable()
    with r.phase("transfer"):
        clock.now += 2
    with r.phase("unplanned"):
        clock.now += 1
    b = r.report(expected=["imports", "transfer", "alerts"])
    assert b.phases == (("imports", 0.0), ("transfer", 2.0), ("alerts", 0.0), ("unplanned", 1.0), (OTHER, 0.0))


def test_a_noted_duration_goes_beside_the_timeline(clock: Clock) -> None:
    r = Recorder()
    r.note("gate child: evaluation", 9.0)  # off: dropped
    r.enable()
    with r.phase("quality gates"):
        clock.now += 2
        r.note("gate child: evaluation", 1.5)
        r.note("gate child: evaluation", 0.5)
    b = r.report()
    assert dict(b.alongside) == {"gate child: evaluation": 2.0}
    assert b.total == pytest.approx(2.0) and b.seconds("quality gates") == pytest.approx(2.0)


def test_process_age_is_read_from_proc() -> None:
    from ckptvault.command import process_clock

    age = process_clock.process_age()
    assert age is not None and age >= 0  # this test's own interpreter started before it


def test_a_mark_keeps_its_first_instant_from_any_thread_and_adds_no_time(clock: Clock) -> None:
    r = Recorder()
    r.mark("first_byte")  # off: nothing
    r.enable(origin=90.0)
    with r.phase("transfer"):
        clock.now = 101.5
        worker = threading.Thread(target=r.mark, args=("first_byte",))
        worker.start()
        worker.join()
        clock.now = 104.0
        r.mark("first_byte")  # later marks of it are ignored
    b = r.report()
    assert b.marks == (("first_byte", 11.5),)
    assert sum(s for _, s in b.phases) == pytest.approx(b.total) == 14.0
    assert b.as_dict()["marks"] == {"first_byte": 11.5}
    assert b.table()[-1] == "first_byte at 11.500 s from the process's start"


def test_a_progress_bar_marks_the_first_bytes_only(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from ckptvault.transfer.progress import ProgressBar

    r = Recorder()
    monkeypatch.setattr(timing, "RECORDER", r)
    r.enable(origin=100.0)
    ProgressBar(10, "files", io.StringIO(), unit="files")(1)  # a count, not bytes
    bar = ProgressBar(10, "restore", io.StringIO())
    bar(0)
    assert r.report().marks == ()
    clock.now = 100.25
    bar(4)
    assert r.report().marks == (("first_byte", 0.25),)
