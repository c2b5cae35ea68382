"""Which save a restore brings back: `latest` is the newest good; suspects need --force."""

from __future__ import annotations

import json

import pytest

from ckptvault.catalog import CheckpointState, Event, fold
from ckptvault.restore.resolve import RestoreError, parse_step, resolve


def life(*events: Event) -> list[CheckpointState]:
    return fold(list(events))


def v(step: int, save: int = 1, at: float = 1.0) -> Event:
    return Event("r", step, "verified", at, save=save, created_at=at)


def drilled(step: int, ok: bool, at: float = 50.0, save: int = 1) -> Event:
    return Event(
        "r", step, "drilled", at, save=save, ok=ok, detail=json.dumps({"problems": ["w.bin: CRC32C mismatch"]})
    )


def test_latest_is_the_newest_verified() -> None:
    r = resolve(life(v(100), v(200), v(300)), "r", "latest")
    assert (r.step, r.save, r.notes) == (300, 1, ())


def test_latest_skips_a_suspect_and_says_why() -> None:
    r = resolve(life(v(100), v(200), drilled(200, ok=False)), "r", "latest")
    assert (r.step, r.save) == (100, 1)
    assert len(r.notes) == 1 and "skipped step 200: suspect" in r.notes[0] and "CRC32C mismatch" in r.notes[0]


def test_a_later_passing_drill_clears_the_suspicion() -> None:
    r = resolve(life(v(100), v(200), drilled(200, False, 50.0), drilled(200, True, 60.0)), "r", "latest")
    assert (r.step, r.notes) == (200, ())


def test_latest_never_picks_a_superseded_save() -> None:
    states = life(v(300, 1, 1.0), v(300, 2, 5.0), v(400, 1, 2.0), Event("r", 300, "superseded", 6.0, save=1),
                  Event("r", 400, "superseded", 6.0))  # fmt: skip
    r = resolve(states, "r", "latest")
    assert (r.step, r.save) == (300, 2)
    # a step number means its newest save; --save names an older one
    assert resolve(states, "r", 300).save == 2
    old = resolve(states, "r", 300, save=1)
    assert old.save == 1 and "superseded" in old.notes[0]


def test_a_suspect_step_needs_force_and_says_why_first() -> None:
    states = life(v(100), v(200), drilled(200, ok=False))
    with pytest.raises(RestoreError, match=r"step 200 is suspect: its last drill failed .*Pass --force"):
        resolve(states, "r", 200)
    r = resolve(states, "r", 200, force=True)
    assert r.step == 200 and "anyway (--force)" in r.notes[0]


@pytest.mark.parametrize(
    ("run", "step", "save", "message"),
    [
        ("nosuchrun", "latest", None, "'nosuchrun' is not in the catalog"),
        ("r", 999, None, "no verified checkpoint at step 999 .verified steps: 100, 200."),
        ("r", 200, 7, "step 200 has no verified save 7 .verified saves: 1."),
        ("r", "latest", 2, "--save names a save of one step"),
    ],
)
def test_bad_choices_name_what_exists(run: str, step: int | str, save: int | None, message: str) -> None:
    with pytest.raises(RestoreError, match=message):
        resolve(life(v(100), v(200)), run, step, save)


def test_no_good_checkpoint_at_all() -> None:
    with pytest.raises(RestoreError, match="no good checkpoint"):
        resolve(life(v(100), drilled(100, ok=False)), "r", "latest")


def test_parse_step() -> None:
    assert parse_step("latest") == "latest" and parse_step("300") == 300
    with pytest.raises(RestoreError, match="'abc' is neither a step number nor 'latest'"):
        parse_step("abc")


def test_throughput_is_the_newest_large_restore_or_passing_drill() -> None:
    from ckptvault.restore.estimate import restore_throughput

    def ev(kind: str, at: float, mib_s: float, nbytes: int, ok: bool | None = None) -> Event:
        return Event("r", 1, kind, at, ok=ok, detail=json.dumps({"mib_per_s": mib_s, "bytes": nbytes}))

    big, small = 2**30, 2**20
    assert restore_throughput([]) is None
    assert restore_throughput([ev("restored", 1.0, 300.0, big), ev("drilled", 2.0, 200.0, big, ok=True)]) == 200.0
    # a failed drill, or a transfer too small to measure more than the fixed cost, does not count
    assert restore_throughput([ev("restored", 1.0, 300.0, big), ev("drilled", 2.0, 5.0, big, ok=False)]) == 300.0
    assert restore_throughput([ev("restored", 1.0, 300.0, big), ev("restored", 2.0, 9.0, small)]) == 300.0


def test_the_estimate_says_bytes_classes_thaw_download_and_cost() -> None:
    from ckptvault.checkpoint.manifest import FileEntry, Manifest
    from ckptvault.pricing import load_prices
    from ckptvault.restore.estimate import estimate
    from ckptvault.restore.plan import ObjectPlan

    gib = 2**30
    files = (FileEntry("a", 10 * gib, 1.0, "x"), FileEntry("b", 10 * gib, 1.0, "y"))
    m = Manifest("r", 300, "hf", files, 1.0, 2.0, "/x/checkpoint-300")
    plans = [
        ObjectPlan("k/a", "a", 10 * gib, "x", 1.0, "STANDARD", True),
        ObjectPlan("k/b", "b", 10 * gib, "y", 1.0, "GLACIER", False),
    ]
    est = estimate(m, plans, load_prices(), "Bulk", "internet", throughput_mib_s=512.0)
    assert est.download_seconds == 20 * 1024 / 512
    assert abs(est.egress_usd - 20 * 0.09) < 1e-9 and est.total_usd > est.egress_usd
    text = est.report()
    assert "STANDARD" in text and "GLACIER" in text and "1 archived objects with the Bulk tier" in text
    assert "about 40 s" in text and "egress (internet)" in text
    assert estimate(m, plans, load_prices(), "Bulk").egress_usd == 0.0  # in-region: free
    # a tensor-level restore reads 2 GiB of `b` (its blocks around the chosen ranges): egress on what it reads
    part = estimate(m, plans, load_prices(), "Bulk", "internet", reads={"b": 2 * gib})
    assert abs(part.egress_usd - 12 * 0.09) < 1e-9 and part.frozen == est.frozen  # the thaw is still the object's
    assert "no restore of this run measured yet" in estimate(m, plans, load_prices(), "Bulk").report()
