"""Deletes never travel (docs/FORMAT.md, "Replicas"): the primary's expiry leaves a replica's copy whole, and
a replica expires only by its own retention (`[[replicas]] expire_after_days`), a lifecycle rule on its own
bucket under its own prefix (ckptvault/replication/retention.py). On MemoryStores, which keep rules."""

from __future__ import annotations

import time

import pytest

from ckptvault.catalog import events
from ckptvault.checkpoint.manifest import Manifest
from ckptvault.config import ConfigError, PolicyConfig, ReplicaConfig, TierStep, parse_config
from ckptvault.pricing import load_prices
from ckptvault.replication import replicate
from ckptvault.replication.retention import install_retention, retention_problem, retention_rule
from ckptvault.store import LockStatus, lifecycle
from ckptvault.store.memory import MemoryStore
from ckptvault.tiering.apply import expire
from ckptvault.tiering.policy import plan
from ckptvault.tiering.replica_selection import unreplicated, wanted
from tests.unit.test_policy import DAY, NOW, ck
from tests.unit.test_replication import DST, NO_LOCK, SRC, TRANSFER, _objects, _primary

KEEP = ReplicaConfig(name="dr", bucket="primary", prefix="dr", expire_after_days=30)


def test_the_primarys_expiry_never_deletes_the_replicas_copy() -> None:
    """The replica shares the primary's bucket under its own prefix (the closest it can be): the tier plan
    expires the save on the primary once the copy is recorded, and every object of the copy stays."""
    primary, catalog, _ = _primary()
    later = time.time() + 10 * DAY  # the save was created at t=1.0: long due for expiry
    catalog.append([events.verified(Manifest("r1", 20, "hf", (), later, later, "/hot/r1/step-20"))])  # the newest
    states = catalog.current()
    replica_store = primary.under("dr")
    replica = KEEP.model_copy(update={"expire_after_days": None})
    pol = PolicyConfig(keep_hot=1, expire_after_days=1)
    assert unreplicated(states, [replica], pol, later)[("r1", 10, 1)] == ("dr",)  # the plan waits for it
    [old] = [s for s in wanted(states, replica, pol, later) if s.step == 10]  # step 20 has no objects
    replicate(primary, "ck", replica_store, replica, [old], NO_LOCK, catalog=catalog)
    copy = _objects(primary, DST)
    assert copy == _objects(primary, SRC) and copy

    states = catalog.current()
    p = plan(states, pol, load_prices(), "aws", later, unreplicated=unreplicated(states, [replica], pol, later))
    assert [(a.kind, a.step) for a in p.actions] == [("expire", 10), ("keep", 20)] and p.waits == []
    done = expire(primary, "ck", "r1", 10)
    assert done.kind == "expire" and _objects(primary, SRC) == {}  # every object of the save, gone
    assert _objects(primary, DST) == copy  # byte for byte, the manifest included


def test_the_retention_rule_is_installed_on_the_replicas_bucket_under_its_prefix_only() -> None:
    bucket = MemoryStore("dr-bucket", transfer=TRANSFER)
    bucket.ensure_abort_incomplete_mpu_rule(1)  # another rule of the bucket: kept
    theirs = bucket.get_lifecycle()
    assert install_retention(bucket, KEEP) == "installed"
    rules = bucket.get_lifecycle()
    assert rules[: len(theirs)] == theirs
    [rule] = [r for r in rules if r["ID"] == lifecycle.rule_id("replica-expire", "dr")]
    assert lifecycle.rule_prefix(rule) == "dr/"
    assert rule["Expiration"] == {"Days": 30} and rule["NoncurrentVersionExpiration"] == {"NoncurrentDays": 1}
    assert install_retention(bucket, KEEP) == "unchanged"
    longer = KEEP.model_copy(update={"expire_after_days": 90})
    assert install_retention(bucket, longer) == "installed"
    assert [r["Expiration"] for r in bucket.get_lifecycle() if "Expiration" in r] == [{"Days": 90}]
    # retention taken out of the config: our rule goes, the others stay
    assert install_retention(bucket, KEEP.model_copy(update={"expire_after_days": None})) == "removed"
    assert bucket.get_lifecycle() == theirs
    assert install_retention(bucket, KEEP.model_copy(update={"expire_after_days": None})) == "unchanged"


def test_a_bucket_of_legacy_rules_gets_a_legacy_rule_and_a_root_replica_covers_the_bucket() -> None:
    bucket = MemoryStore("dr-bucket", transfer=TRANSFER)
    bucket.put_lifecycle([{"ID": "theirs", "Status": "Enabled", "Prefix": "logs/", "Expiration": {"Days": 7}}])
    install_retention(bucket, KEEP)
    ours = bucket.get_lifecycle()[1]
    assert ours["Prefix"] == "dr/" and "Filter" not in ours  # S3 refuses a mix of the two styles
    root = retention_rule(KEEP.model_copy(update={"prefix": ""}))
    assert root is not None and root["ID"] == "ckptvault-replica-expire" and root["Filter"] == {"Prefix": ""}


def test_a_default_retention_longer_than_the_replicas_is_refused_with_the_fix() -> None:
    assert retention_problem(KEEP, LockStatus(enabled=False)) is None
    assert retention_problem(KEEP, LockStatus(True, "GOVERNANCE", default_days=30)) is None
    why = retention_problem(KEEP, LockStatus(True, "COMPLIANCE", default_years=1))
    assert why is not None and "locks every object for 365 days" in why and "at least 365" in why
    assert (
        retention_problem(KEEP.model_copy(update={"expire_after_days": None}), LockStatus(True, "GOVERNANCE", 99))
        is None
    )


def test_a_save_older_than_the_replicas_retention_is_not_copied_nor_waited_for() -> None:
    """Copying it would only feed the replica's rule: copied, expired, copied again at each pass."""
    pol = PolicyConfig(keep_hot=1, tiers=[TierStep(after_days=10, tier="archive")])
    states = [ck(1, 45), ck(2, 20), ck(3, 0)]
    assert [s.step for s in wanted(states, KEEP, pol, NOW)] == [2, 3]
    assert [s.step for s in wanted(states, KEEP, pol, NOW + 11 * DAY)] == [3]
    assert unreplicated(states, [KEEP], pol, NOW) == {("r", 2, 1): ("dr",), ("r", 3, 1): ("dr",)}


def _cfg(extra: str) -> str:
    return '[store]\nbucket = "primary-bucket"\nprefix = "prod"\n' + extra


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ('bucket = "dr-one"\nexpire_after_days = 0', "replicas[0].expire_after_days"),
        ('bucket = "dr-one"\nexpire_after_days = "a year"', "replicas[0].expire_after_days"),
        ('bucket = "primary-bucket"\nprefix = ""\nexpire_after_days = 30', "where the [store] keeps objects too"),
        ('bucket = "primary-bucket"\nprefix = "prod/dr"\nexpire_after_days = 30', "where the [store] keeps"),
        ('bucket = "dr-one"\nexpire_after_days = 30\n[lock]\nmode = "governance"\ndays = 30', "at least 32"),
    ],
)
def test_a_bad_retention_is_a_config_error_naming_the_key(entry: str, says: str) -> None:
    with pytest.raises(ConfigError, match="expire_after_days") as e:
        parse_config(_cfg('[[replicas]]\nname = "dr"\n' + entry))
    assert says in str(e.value)


def test_a_retention_beside_the_primary_in_its_bucket_is_accepted() -> None:
    cfg = parse_config(
        _cfg('[[replicas]]\nname = "dr"\nbucket = "primary-bucket"\nprefix = "dr"\nexpire_after_days = 30')
    )
    assert cfg.replicas[0].expire_after_days == 30
    locked = (
        '[[replicas]]\nname = "dr"\nbucket = "dr-one"\nexpire_after_days = 32\n[lock]\nmode = "governance"\ndays = 30'
    )
    assert parse_config(_cfg(locked)).replicas[0].expire_after_days == 32
