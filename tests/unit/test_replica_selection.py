"""Which saves a replica takes (`[[replicas]] takes`) and the `[[replicas]]` config's validation."""

from __future__ import annotations

import pytest

from ckptvault.config import ConfigError, PolicyConfig, ReplicaConfig, parse_config
from ckptvault.tiering.replica_selection import wanted
from tests.unit.test_policy import ck

POLICY = PolicyConfig(milestone_every_steps=100)


def replica(takes: str) -> ReplicaConfig:
    return ReplicaConfig(name="dr", bucket="dr-bucket", takes=takes)


def keys(takes: str, states: list) -> list[tuple[str, int, int]]:  # type: ignore[type-arg]
    return [s.key for s in wanted(states, replica(takes), POLICY)]


STATES = [
    ck(100, 9), ck(150, 8), ck(200, 7, superseded=True), ck(200, 6, save=2), ck(250, 5),
    ck(300, 4, last_event="expired", verified=False),  # gone from the primary: nothing to copy
    ck(350, 3, verified=False, last_event="invalid"),  # never committed
    ck(400, 2, run="s"), ck(500, 1, run="s"),
]  # fmt: skip


def test_all_takes_every_committed_save_superseded_ones_included() -> None:
    assert keys("all", STATES) == [("r", 100, 1), ("r", 150, 1), ("r", 200, 1), ("r", 200, 2), ("r", 250, 1),
                                   ("s", 400, 1), ("s", 500, 1)]  # fmt: skip


def test_milestones_take_the_current_save_of_each_step_the_policy_keeps_forever() -> None:
    assert keys("milestones", STATES) == [("r", 100, 1), ("r", 200, 2), ("s", 400, 1), ("s", 500, 1)]


def test_newest_n_takes_each_runs_n_newest_current_saves() -> None:
    assert keys("newest 2", STATES) == [("r", 200, 2), ("r", 250, 1), ("s", 400, 1), ("s", 500, 1)]
    assert keys("newest 1", STATES) == [("r", 250, 1), ("s", 500, 1)]
    assert keys("newest 1", []) == []


def _cfg(replicas: str) -> str:
    return '[store]\nbucket = "primary-bucket"\n' + replicas


def test_a_replica_entry_is_read_with_the_stores_keys_and_its_own() -> None:
    cfg = parse_config(_cfg(
        '[[replicas]]\nname = "ceph-dr"\nbucket = "dr-one"\nendpoint_url = "http://127.0.0.1:7480"\n'
        'profile = "dr"\nstorage_class = "COLD"\ntakes = " newest   3 "\nmax_lag_hours = 6\n'
    ))  # fmt: skip
    [r] = cfg.replicas
    assert (r.name, r.bucket, r.profile, r.storage_class, r.takes, r.newest, r.max_lag_hours) == (
        "ceph-dr", "dr-one", "dr", "COLD", "newest 3", 3, 6
    )  # fmt: skip
    assert r.part_size_mb == cfg.store.part_size_mb and parse_config(_cfg("")).replicas == []


B = 'name = "dr"\nbucket = "dr-one"\n'


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ('name = "primary"\nbucket = "dr-one"', "replicas[0].name: use lower-case letters"),
        ('name = "Dr"\nbucket = "dr-one"', "replicas[0].name"),
        (B + 'takes = "newest 0"', 'replicas[0].takes: write "all", "milestones" or "newest N"'),
        (B + 'takes = "some"', "replicas[0].takes"),
        (B + 'storage_class = "cold"', "replicas[0].storage_class: a storage class is spelt"),
        (B + 'compression = "auto"', "remove compression from this [[replicas]] entry"),
        ('name = "dr"\nbucket = "primary-bucket"', "[[replicas]] 'dr' is the same place as the [store]"),
        (B + '[[replicas]]\nname = "dr"\nbucket = "dr-two"', "two [[replicas]] are named 'dr'"),
        (
            'name = "a"\nbucket = "dr-one"\n[[replicas]]\nname = "b"\nbucket = "dr-one"',
            "the same place as [[replicas]] 'a'",
        ),
        (B + "max_lag_hours = 0", "replicas[0].max_lag_hours"),
        (B + 'buckett = "x"', "buckett"),
        ('bucket = "dr-one"', "replicas[0].name"),
    ],
)
def test_a_bad_replica_entry_names_the_key_and_the_fix(entry: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(_cfg("[[replicas]]\n" + entry + "\n"))
    assert says in str(e.value), str(e.value)
