"""`lifecycle = "external"` ([store] and each [[replicas]]; docs/configuration.md): Terraform owns the bucket's
lifecycle configuration, and the ingest and replica roles have no s3:PutLifecycleConfiguration (a leaked key
could install an expiration rule). No flow writes the lifecycle then: the ingest's abort rule, the tier flow's
server-mode rules and a replica's abort and retention rules are left to Terraform, and the tier flow and
replicate check that the rules they rely on are there. On MemoryStores whose lifecycle writes are refused as
an IAM deny refuses them (MemoryStore.put_lifecycle called on the class stands for Terraform's own write)."""

from __future__ import annotations

from typing import Any

import pytest

from ckptvault.command import memo
from ckptvault.config import ConfigError, ReplicaConfig, StoreConfig, parse_config
from ckptvault.replication import replicate
from ckptvault.replication.result import ReplicateResult
from ckptvault.replication.retention import install_retention, retention_rule
from ckptvault.store import StoreError, lifecycle
from ckptvault.store.memory import MemoryStore
from ckptvault.tiering.apply import TieringError, install_lifecycle, lifecycle_rules
from tests.unit.test_replication import DST, NO_LOCK, SRC, TRANSFER, _objects, _primary

EXTERNAL = StoreConfig(bucket="ckpts", prefix="prod", lifecycle="external")
DR = ReplicaConfig(name="dr", bucket="replica", prefix="dr", lifecycle="external", expire_after_days=30)


def deny_lifecycle_writes(store: MemoryStore) -> list[Any]:
    """The store answers every lifecycle write as IAM does for credentials without
    s3:PutLifecycleConfiguration; returns the list each attempted configuration is appended to."""
    attempted: list[Any] = []

    def put_lifecycle(rules: Any) -> None:
        attempted.append(rules)
        raise StoreError("putting the lifecycle configuration: AccessDenied (no s3:PutLifecycleConfiguration)")

    store.put_lifecycle = put_lifecycle  # type: ignore[method-assign]
    return attempted


def test_the_switch_parses_defaults_to_managed_and_refuses_anything_else() -> None:
    base = '[store]\nbucket = "ckpts"\n'
    assert parse_config(base).store.manages_lifecycle
    assert not parse_config(base + 'lifecycle = "external"\n').store.manages_lifecycle
    cfg = parse_config(base + '[[replicas]]\nname = "dr"\nbucket = "dr-bucket"\nlifecycle = "external"\n')
    assert cfg.store.manages_lifecycle and not cfg.replicas[0].manages_lifecycle  # each bucket its own owner
    with pytest.raises(ConfigError, match="lifecycle"):
        parse_config(base + 'lifecycle = "terraform"\n')


def test_the_ingest_neither_reads_nor_writes_the_abort_rule_where_terraform_owns_it() -> None:
    store = MemoryStore("ckpts", prefix="prod")
    attempted = deny_lifecycle_writes(store)
    reads: list[int] = []
    plain_get = store.get_lifecycle

    def get_lifecycle() -> Any:
        reads.append(1)
        return plain_get()

    store.get_lifecycle = get_lifecycle  # type: ignore[method-assign]
    assert memo.ensure_abort_rule(store, EXTERNAL) is False
    assert attempted == [] and reads == []
    # the same store under "managed" tries the write, and the deny stops it: the test above is not vacuous
    with pytest.raises(StoreError, match="AccessDenied"):
        memo.ensure_abort_rule(store, EXTERNAL.model_copy(update={"lifecycle": "managed"}))
    assert len(attempted) == 1


def test_tier_in_server_mode_checks_terraforms_rules_and_writes_none() -> None:
    store = MemoryStore("ckpts", prefix="prod")
    attempted = deny_lifecycle_writes(store)
    rules = lifecycle_rules("prod", {"cold": "GLACIER", "archive": "DEEP_ARCHIVE"}, ["cold", "archive"])

    with pytest.raises(TieringError, match="ckptvault-tier-cold-prod, ckptvault-tier-archive-prod") as e:
        install_lifecycle(store, rules, managed=False)
    assert "enable_tier_lifecycle" in str(e.value)
    # Terraform's rules carry the same IDs (its days may differ: 30 before STANDARD_IA): enough
    MemoryStore.put_lifecycle(store, [{**r, "Transition": {"Days": 30, "StorageClass": "GLACIER"}} for r in rules])
    assert install_lifecycle(store, rules, managed=False) == 0
    assert attempted == []
    with pytest.raises(StoreError, match="AccessDenied"):
        install_lifecycle(store, rules)  # managed: it would write, which this role may not


def test_a_replica_under_terraform_is_copied_without_a_lifecycle_write_and_a_missing_rule_is_reported() -> None:
    primary, catalog, states = _primary()
    replica_store = MemoryStore("replica", transfer=TRANSFER)
    attempted = deny_lifecycle_writes(replica_store)

    got = replicate(primary, "ck", replica_store, DR, states, NO_LOCK, catalog=catalog)
    assert got.failed == {} and len(got.copied) == 1 and _objects(replica_store, DST) == _objects(primary, SRC)
    assert attempted == [] and replica_store.get_lifecycle() == []  # neither the abort nor the retention rule
    assert got.retention == "missing"
    lines = ReplicateResult((got,)).lines()
    assert (True, lines[0][1]) == lines[0] and "replica_expire_after_days = 30" in lines[0][1]

    # what replica.tf installs with replica_expire_after_days = 30: the rule retention_rule describes
    rule = retention_rule(DR)
    assert rule is not None and rule["ID"] == lifecycle.rule_id("replica-expire", "dr")
    MemoryStore.put_lifecycle(replica_store, [rule])
    assert install_retention(replica_store, DR) == "unchanged"
    assert install_retention(replica_store, DR.model_copy(update={"expire_after_days": 90})) == "missing"
    assert install_retention(replica_store, DR.model_copy(update={"expire_after_days": None})) == "unchanged"
    assert attempted == []
