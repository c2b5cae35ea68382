"""The price table and billing rules, checked against hand computations from AWS list prices."""

from __future__ import annotations

import pytest

from ckptvault.config import PolicyConfig, TierStep
from ckptvault.pricing import GB, PriceError, PriceTable, load_prices
from ckptvault.tiering.cost import Holding, class_map, summarize
from ckptvault.tiering.policy import plan
from tests.unit.test_policy import DAY, NOW, ck

KB = 1024
TB = 1024 * GB


@pytest.fixture(scope="module")
def prices() -> PriceTable:
    return load_prices({})


def test_packaged_prices_match_the_design_table(prices: PriceTable) -> None:
    table = {
        "STANDARD": (0.023, 0),
        "STANDARD_IA": (0.0125, 30),
        "GLACIER_IR": (0.004, 90),
        "GLACIER": (0.0036, 90),
        "DEEP_ARCHIVE": (0.00099, 180),
    }
    for name, (usd, days) in table.items():
        c = prices.get(name)
        assert (c.usd_per_gb_month, c.min_days) == (usd, days), name
    assert prices.get("STANDARD_IA").min_billable_bytes == 128 * KB
    assert prices.get("GLACIER").overhead_bytes + prices.get("GLACIER").overhead_standard_bytes == 40 * KB
    assert prices.get("GLACIER").frozen and prices.get("DEEP_ARCHIVE").frozen
    assert not prices.get("GLACIER_IR").frozen


def test_monthly_cost_of_a_terabyte(prices: PriceTable) -> None:
    assert prices.monthly_cost(TB, "STANDARD") == pytest.approx(1024 * 0.023)
    assert prices.monthly_cost(TB, "DEEP_ARCHIVE", objects=0) == pytest.approx(1024 * 0.00099)


def test_glacier_bills_40kb_per_object_overhead(prices: PriceTable) -> None:
    # 1,000,000 empty objects: 32 KB each at the GLACIER price, 8 KB each at the STANDARD price.
    n = 1_000_000
    expected = n * 32 * KB / GB * 0.0036 + n * 8 * KB / GB * 0.023
    assert prices.monthly_cost(0, "GLACIER", objects=n) == pytest.approx(expected)


def test_small_objects_bill_the_minimum_size_in_ia(prices: PriceTable) -> None:
    # 10 objects of 1 KB are billed as 10 x 128 KB.
    assert prices.monthly_cost(10 * KB, "STANDARD_IA", objects=10) == pytest.approx(10 * 128 * KB / GB * 0.0125)
    # Large objects are billed by size.
    assert prices.monthly_cost(GB, "STANDARD_IA", objects=2) == pytest.approx(0.0125)


def test_transition_cost_is_requests_plus_early_deletion(prices: PriceTable) -> None:
    # 100 objects, 100 GB, from STANDARD_IA after 10 of its 30 days, to GLACIER: the planner's fee.
    requests = 100 * 0.03 / 1000
    early = 100 * 0.0125 * 20 / 30
    pol = PolicyConfig(keep_hot=1, tiers=[TierStep(after_days=30, tier="cold")], horizon_days=365)

    def fee(days_in_class: float) -> float:
        old = ck(1, 60, files=100, storage_class="STANDARD_IA", class_since=NOW - days_in_class * DAY)
        [a] = [a for a in plan([old, ck(2, 0)], pol, prices, "aws", NOW).actions if a.step == 1]
        assert (a.kind, a.to_class) == ("transition", "GLACIER")
        return a.fee_usd

    assert fee(10) == pytest.approx(requests + early)
    # After the minimum duration only the requests remain.
    assert fee(31) == pytest.approx(requests)


def test_restore_estimate_glacier_and_deep_archive(prices: PriceTable) -> None:
    usd, smin, smax = prices.restore_estimate({"GLACIER": (10, 100 * GB), "DEEP_ARCHIVE": (5, 50 * GB)}, "Standard")
    expected = (
        10 * 0.0004 / 1000 + 10 * 0.05 / 1000 + 100 * 0.01  # GLACIER: GET + restore requests + retrieval
        + 5 * 0.0004 / 1000 + 5 * 0.10 / 1000 + 50 * 0.02  # DEEP_ARCHIVE
    )  # fmt: skip
    assert usd == pytest.approx(expected)
    assert (smin, smax) == (3 * 3600, 12 * 3600)  # the slowest class sets the time


def test_restore_of_readable_classes_costs_retrieval_and_no_wait(prices: PriceTable) -> None:
    usd, smin, smax = prices.restore_estimate({"GLACIER_IR": (1, 10 * GB)}, "Bulk")
    assert usd == pytest.approx(0.01 / 1000 + 10 * 0.03)
    assert (smin, smax) == (0, 0)


def test_deep_archive_has_no_expedited_restore(prices: PriceTable) -> None:
    with pytest.raises(PriceError, match="DEEP_ARCHIVE has no Expedited restore; choose one of Bulk, Standard"):
        prices.restore_estimate({"DEEP_ARCHIVE": (1, GB)}, "Expedited")
    with pytest.raises(PriceError, match="restore tier 'Fast'"):
        prices.restore_estimate({"GLACIER": (1, GB)}, "Fast")


def test_unpriced_class_names_the_fix(prices: PriceTable) -> None:
    with pytest.raises(PriceError, match=r"'COLD' has no price.*\[policy\.prices\] COLD = 0\.01"):
        prices.monthly_cost(GB, "COLD")


def test_overrides_price_ceph_classes_and_reprice_known_ones() -> None:
    p = load_prices({"COLD": 0.002, "STANDARD": 0.01})
    assert p.monthly_cost(GB, "COLD", objects=1000) == pytest.approx(0.002)  # no minimums on-prem
    assert p.get("COLD").min_days == 0 and p.get("COLD").transition_per_1000 == 0
    assert p.get("STANDARD").usd_per_gb_month == 0.01
    assert p.get("STANDARD").put_per_1000 == 0.005  # only the storage price changes


@pytest.mark.parametrize("bad", [-0.01, float("nan"), True])
def test_bad_override_is_rejected(bad: float) -> None:
    with pytest.raises(PriceError, match=r"\[policy\.prices\] COLD"):
        load_prices({"COLD": bad})


def test_class_map_defaults_and_overrides() -> None:
    assert class_map("aws")["cold"] == "GLACIER"
    assert class_map("seaweedfs")["archive"] == "DEEP_ARCHIVE"
    ceph = class_map("ceph")
    assert ceph == {"hot": "STANDARD", "cold": "COLD"}
    assert class_map("aws", {"warm": "GLACIER_IR"})["warm"] == "GLACIER_IR"
    assert class_map("ceph", {"archive": "TAPE"})["archive"] == "TAPE"
    with pytest.raises(PriceError, match="unknown tier; use one of hot, warm, cold, archive"):
        class_map("aws", {"frozen": "X"})
    with pytest.raises(PriceError, match="resolve `auto`"):
        class_map("auto")


def test_summary_matches_hand_computation(prices: PriceTable) -> None:
    holdings = [
        Holding("r1", 100 * GB, 10, "STANDARD", "GLACIER", fee_usd=0.5),
        Holding("r1", 50 * GB, 10, "STANDARD", "STANDARD"),
        Holding("r2", 200 * GB, 1, "GLACIER", None, fee_usd=1.25),
    ]
    s = summarize(holdings, prices, hot_fs_usd_per_gb_month=0.10)
    glacier_100 = 100 * 0.0036 + 10 * (32 * KB * 0.0036 + 8 * KB * 0.023) / GB
    glacier_200 = 200 * 0.0036 + (32 * KB * 0.0036 + 8 * KB * 0.023) / GB
    assert s.monthly_before["r1"]["STANDARD"] == pytest.approx(150 * 0.023)
    assert s.monthly_before["r2"]["GLACIER"] == pytest.approx(glacier_200)
    assert s.monthly_after["r1"] == pytest.approx({"GLACIER": glacier_100, "STANDARD": 50 * 0.023})
    assert "r2" not in s.monthly_after
    assert s.one_time_fees_usd == pytest.approx(1.75)
    assert s.hot_fs_monthly_usd == pytest.approx(350 * 0.10)
    assert s.saving_vs_hot_fs == pytest.approx(35 - glacier_100 - 50 * 0.023)
    assert s.monthly_saving == pytest.approx(150 * 0.023 + glacier_200 - glacier_100 - 50 * 0.023)
