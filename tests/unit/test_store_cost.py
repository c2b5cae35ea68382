"""Bytes and $/month per store and storage class, and the replicas' egress from the primary
(ckptvault/tiering/store_cost.py: `plan` and `catalog stats` with `[[replicas]]`), against hand
computations from the packaged AWS prices."""

from __future__ import annotations

import time

import pytest

from ckptvault.catalog import Event, ReplicaCopy, fold
from ckptvault.catalog import events as ev
from ckptvault.config import ConfigError, PolicyConfig, ReplicaConfig, StoreConfig, TierStep, parse_config
from ckptvault.pricing import GB, PriceError, load_prices
from ckptvault.tiering.policy import plan
from ckptvault.tiering.report import plan_record, render_text
from ckptvault.tiering.store_cost import copy_route, plan_primary_rows, store_costs
from tests.unit.test_policy import DAY, NOW, ck

PRIMARY = StoreConfig(bucket="primary-bucket")  # AWS, us-east-1
POLICY = PolicyConfig()
PRICES = load_prices({})
CEPH_DR = ReplicaConfig(
    name="ceph-dr", bucket="dr-one", endpoint_url="http://rgw.dr:7480", storage_class="COLD", prices={"COLD": 0.002}
)
AWS_WEST = ReplicaConfig(name="aws-west", bucket="dr-two", region="us-west-2", storage_class="DEEP_ARCHIVE",
                         takes="newest 1")  # fmt: skip


def copy(store: str, cls: str, days_ago: float) -> ReplicaCopy:
    return ReplicaCopy(store, cls, NOW - days_ago * DAY)


STATES = [
    ck(1, 60, replicas=(copy("ceph-dr", "COLD", 40),)),  # copied 40 days ago: not this month's egress
    ck(2, 20, stored_bytes=50 * GB, replicas=(copy("ceph-dr", "COLD", 10), copy("aws-west", "DEEP_ARCHIVE", 5))),
    ck(3, 1),  # on no replica yet
    # expired on the primary by its retention; deletes never travel, so ceph-dr still holds (and bills) it
    ck(4, 400, last_event="expired", verified=False, replicas=(copy("ceph-dr", "COLD", 300),)),
]


def deep_archive(nbytes: float, objects: int) -> float:
    """DEEP_ARCHIVE by hand: the bytes, plus per object 32 KiB of index at its price and 8 KiB at STANDARD's."""
    return nbytes / GB * 0.00099 + objects * (32768 / GB * 0.00099 + 8192 / GB * 0.023)


def test_each_store_bills_its_copies_stored_bytes_in_the_class_recorded_at_its_own_prices() -> None:
    costs = store_costs(STATES, PRIMARY, POLICY, [CEPH_DR, AWS_WEST], PRICES, "aws", NOW)
    assert costs is not None
    rows = {(r.store, r.storage_class): (r.saves, r.bytes / GB, r.usd_per_month) for r in costs.rows}
    assert rows.keys() == {("primary", "STANDARD"), ("ceph-dr", "COLD"), ("aws-west", "DEEP_ARCHIVE")}
    # the primary: saves 1-3 (4 expired there), save 2 billed for its 50 GB stored, not its 100 GB of files
    assert rows["primary", "STANDARD"] == (3, 250, pytest.approx(250 * 0.023))
    # ceph-dr: COLD priced by its own `prices` (no AWS price exists), the expired save 4 included
    assert rows["ceph-dr", "COLD"] == (3, 250, pytest.approx(250 * 0.002))
    assert rows["aws-west", "DEEP_ARCHIVE"] == (1, 50, pytest.approx(deep_archive(50 * GB, 10)))
    assert [r.store for r in costs.rows] == ["primary", "ceph-dr", "aws-west"]  # the primary, then as configured
    assert (costs.saves, costs.bytes) == (7, 550 * GB)
    assert costs.usd_per_month == pytest.approx(250 * 0.023 + 250 * 0.002 + deep_archive(50 * GB, 10))
    assert costs.unpriced == ()


def test_egress_is_the_primarys_price_on_the_route_per_month_at_the_last_30_days_rate_and_once_to_catch_up() -> None:
    costs = store_costs(STATES, PRIMARY, POLICY, [CEPH_DR, AWS_WEST], PRICES, "aws", NOW)
    assert costs is not None
    ceph, west = costs.egress
    # another endpoint: over the internet, $0.09/GB out of AWS
    assert (ceph.replica, ceph.route, ceph.usd_per_gb) == ("ceph-dr", "internet", 0.09)
    assert (ceph.month_saves, ceph.month_bytes) == (1, 50 * GB)  # save 2 only: save 1 was 40 days ago
    assert ceph.usd_per_month == pytest.approx(50 * 0.09)
    assert (ceph.to_copy_saves, ceph.to_copy_bytes) == (1, 100 * GB)  # save 3; the expired save 4 is not wanted
    assert ceph.to_copy_usd == pytest.approx(100 * 0.09)
    assert ceph.to_copy_adds_usd_per_month == pytest.approx(100 * 0.002)
    # AWS to AWS in another region: inter-region, $0.02/GB; `newest 1` wants only save 3
    assert (west.route, west.usd_per_gb, west.month_bytes, west.to_copy_bytes) == (
        "inter-region", 0.02, 50 * GB, 100 * GB
    )  # fmt: skip
    assert west.to_copy_usd == pytest.approx(2.0)
    assert west.to_copy_adds_usd_per_month == pytest.approx(deep_archive(100 * GB, 10))
    text = "\n".join(costs.lines())
    assert (
        "egress to ceph-dr (internet, $0.0900/GB out of the primary):\n"
        "  per month at the current rate: 50.0 GiB in 1 saves copied in the last 30 days, $4.50/month\n"
        "  to catch up: 100.0 GiB in 1 saves still to copy, $9.00 once, then $0.2000/month more stored in COLD"
    ) in text
    doc = costs.as_dict()
    assert doc["egress"][0]["last_30_days"] == {"saves": 1, "bytes": 50 * GB}
    assert doc["egress"][0]["to_copy"]["usd_once"] == pytest.approx(9.0)
    assert doc["stores_total"] == {"saves": 7, "bytes": 550 * GB, "usd_per_month": costs.usd_per_month}
    assert doc["stores"][1] == {
        "store": "ceph-dr", "class": "COLD", "saves": 3, "bytes": 250 * GB, "usd_per_month": pytest.approx(0.5)
    }  # fmt: skip


def test_the_route_is_guessed_from_endpoint_and_region_or_named_and_an_on_prem_primary_bills_none() -> None:
    here = StoreConfig(bucket="primary-bucket", endpoint_url="http://rgw.a:7480/", region="default")

    def route(**kw: object) -> str:
        return copy_route(here, ReplicaConfig.model_validate({"name": "dr", "bucket": "dr-one", **kw}))

    assert route(endpoint_url="http://rgw.a:7480", region="default") == "in-region"  # the slash does not matter
    assert route(endpoint_url="http://rgw.a:7480", region="other") == "inter-region"
    assert route(endpoint_url="http://rgw.b:7480", region="default") == "internet"
    assert route(endpoint_url="http://rgw.b:7480", copy_egress="in-region") == "in-region"  # the operator knows
    assert [PRICES.transfer_per_gb(k, "internet") for k in ("aws", "moto", "ceph", "seaweedfs", "minio")] == [
        0.09, 0.09, 0.0, 0.0, 0.0
    ]  # fmt: skip
    assert [PRICES.transfer_per_gb("aws", r) for r in ("in-region", "inter-region")] == [0.0, 0.02]
    with pytest.raises(PriceError, match="egress 'lan' has no price; use one of in-region, inter-region, internet"):
        PRICES.transfer_per_gb("aws", "lan")
    costs = store_costs(STATES, PRIMARY, POLICY, [CEPH_DR], PRICES, "seaweedfs", NOW)
    assert costs is not None and costs.egress[0].route == "internet"
    assert (costs.egress[0].usd_per_month, costs.egress[0].to_copy_usd) == (0.0, 0.0)


def test_a_class_without_a_price_is_shown_unpriced_with_the_key_that_prices_it() -> None:
    unpriced = ReplicaConfig(name="ceph-dr", bucket="dr-one", endpoint_url="http://rgw.dr:7480", storage_class="COLD")
    costs = store_costs(STATES, PRIMARY, POLICY, [unpriced], PRICES, "aws", NOW)
    assert costs is not None
    [row] = [r for r in costs.rows if r.store == "ceph-dr"]
    assert row.usd_per_month is None and row.bytes == 250 * GB
    assert costs.usd_per_month is None  # a partial total would read as the whole
    assert costs.egress[0].to_copy_adds_usd_per_month is None
    assert costs.unpriced == (
        'COLD on ceph-dr: add prices = { COLD = 0.01 } (USD per GB-month) to the [[replicas]] entry named "ceph-dr", '
        "or COLD to [policy.prices]",
    )
    assert "ceph-dr   COLD" in "\n".join(costs.lines()) and "unpriced: COLD on ceph-dr" in "\n".join(costs.lines())
    # [policy.prices] prices every store; a replica's own `prices` win for that replica
    policy = PolicyConfig(prices={"COLD": 0.004, "STANDARD": 0.01})
    costs = store_costs(STATES, PRIMARY, policy, [unpriced, CEPH_DR.model_copy(update={"name": "b"})],
                        load_prices(policy.prices), "aws", NOW)  # fmt: skip
    assert costs is not None
    assert [r.usd_per_month for r in costs.rows if r.store == "ceph-dr"] == [pytest.approx(250 * 0.004)]
    assert costs.egress[1].to_copy_adds_usd_per_month == pytest.approx(250 * 0.002)  # b: its own COLD price


def test_no_replica_no_section_and_a_copy_on_a_replica_gone_from_the_config_is_still_counted() -> None:
    plain = [ck(1, 3), ck(2, 1)]
    assert store_costs(plain, PRIMARY, POLICY, [], PRICES, "aws", NOW) is None
    gone = [ck(1, 3, replicas=(copy("old-dr", "STANDARD", 2),))]
    costs = store_costs(gone, PRIMARY, POLICY, [], PRICES, "aws", NOW)
    assert costs is not None and costs.egress == ()  # no route known for it: no egress
    assert [(r.store, r.saves, r.usd_per_month) for r in costs.rows] == [
        ("primary", 1, pytest.approx(100 * 0.023)), ("old-dr", 1, pytest.approx(100 * 0.023))
    ]  # fmt: skip
    cold = [ck(1, 3, replicas=(copy("old-dr", "COLD", 2),))]
    costs = store_costs(cold, PRIMARY, POLICY, [], PRICES, "aws", NOW)
    assert costs is not None and costs.unpriced == (
        "COLD on old-dr (no longer in [[replicas]]): add [policy.prices] COLD = 0.01 (USD per GB-month)",
    )


def test_plan_adds_the_section_with_the_primary_as_the_plan_costs_it_and_keeps_its_keys() -> None:
    policy = PolicyConfig(keep_hot=1, tiers=[TierStep(after_days=7, tier="warm")])
    p = plan(STATES, policy, PRICES, "aws", NOW)
    costs = store_costs(STATES, PRIMARY, policy, [CEPH_DR], PRICES, "aws", NOW, plan_primary_rows(p.summary))
    assert costs is not None
    primary = [r for r in costs.rows if r.store == "primary"]
    assert sum(r.usd_per_month or 0 for r in primary) == pytest.approx(p.summary.total_before)
    assert sum(r.saves for r in primary) == 3
    before, after = plan_record(p), plan_record(p, stores=costs)
    assert {k: v for k, v in after.items() if k in before} == before  # every key as it was
    assert set(after) - set(before) == {"stores", "stores_total", "egress", "unpriced"}
    assert render_text(p, stores=None) == render_text(p)
    text = render_text(p, stores=costs)
    assert text.startswith(render_text(p)) and "per store and storage class, now:" in text
    assert "ceph-dr   COLD" in text and "egress to ceph-dr" in text
    assert "aws-west  DEEP_ARCHIVE" in text and "egress to aws-west" not in text  # recorded, not configured


def test_the_copies_come_from_the_catalogs_replicated_events() -> None:
    now = time.time()
    events = [
        Event("r", 1, "verified", now - 60, bytes=3 * GB, files=2, storage_class="STANDARD", created_at=now - 90),
        Event("r", 1, "uploaded", now - 61, bytes=3 * GB, files=2, storage_class="STANDARD"),
        ev.replicated("r", 1, 1, store="ceph-dr", key="k", nbytes=3 * GB, seconds=1.0, storage_class="COLD"),
    ]
    costs = store_costs(fold(events), PRIMARY, POLICY, [CEPH_DR], PRICES, "aws", now)
    assert costs is not None
    assert [(r.store, r.storage_class, r.bytes) for r in costs.rows] == [
        ("primary", "STANDARD", 3 * GB), ("ceph-dr", "COLD", 3 * GB)
    ]  # fmt: skip
    assert (costs.egress[0].month_bytes, costs.egress[0].to_copy_saves) == (3 * GB, 0)
    assert costs.egress[0].lines()[-1] == "  to catch up: nothing left to copy"


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("prices = { cold = 0.01 }", "replicas[0].prices: 'cold': a storage class is spelt in upper case"),
        ("prices = { COLD = -1 }", "replicas[0].prices: COLD = -1.0: write a non-negative USD per GB-month"),
        ("prices = { COLD = nan }", "replicas[0].prices: COLD = nan"),
        ('copy_egress = "lan"', "replicas[0].copy_egress"),
    ],
)
def test_a_bad_price_or_route_names_the_replicas_key(entry: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(f'[store]\nbucket = "primary-bucket"\n[[replicas]]\nname = "dr"\nbucket = "dr-one"\n{entry}\n')
    assert says in str(e.value), str(e.value)
    ok = parse_config('[store]\nbucket = "p-b"\n[[replicas]]\nname = "dr"\nbucket = "d-o"\nprices = { COLD = 0.002 }\n')
    assert ok.replicas[0].prices == {"COLD": 0.002} and ok.replicas[0].copy_egress == "auto"
