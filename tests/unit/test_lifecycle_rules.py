"""Our bucket lifecycle rules' IDs and prefixes (ckptvault/store/lifecycle.py): pure functions."""

from __future__ import annotations

from ckptvault.store import ABORT_MPU_RULE_NAME
from ckptvault.store.lifecycle import plain_id, replaced_by, rule_id, rule_prefix
from ckptvault.tiering.apply import lifecycle_rules


def test_ids_name_the_prefix_and_the_root_keeps_the_plain_id() -> None:
    assert rule_id(ABORT_MPU_RULE_NAME, "") == "ckptvault-abort-incomplete-mpu"
    assert rule_id(ABORT_MPU_RULE_NAME, "prod") == "ckptvault-abort-incomplete-mpu-prod"
    assert rule_id("tier-cold", "/team/prod/") == "ckptvault-tier-cold-team/prod"
    assert rule_id("x", "a") != rule_id("x", "b")


def test_rule_prefix_reads_all_three_forms() -> None:
    assert rule_prefix({"ID": "r", "Filter": {"Prefix": "a/"}}) == "a/"
    assert rule_prefix({"ID": "r", "Filter": {"And": {"Prefix": "b/", "Tags": []}}}) == "b/"
    assert rule_prefix({"ID": "r", "Prefix": "c/"}) == "c/"
    assert rule_prefix({"ID": "r", "Filter": {}}) == ""


def test_a_rule_replaces_its_own_id_and_the_plain_id_of_its_prefix_only() -> None:
    (ours,) = lifecycle_rules("prod", {"cold": "COLD"}, ["cold"])
    assert ours["ID"] == "ckptvault-tier-cold-prod"
    assert plain_id(ours) == "ckptvault-tier-cold"
    legacy_same = {"ID": "ckptvault-tier-cold", "Filter": {"And": {"Prefix": "prod/", "Tags": []}}}
    legacy_other = {"ID": "ckptvault-tier-cold", "Filter": {"And": {"Prefix": "dev/", "Tags": []}}}
    other_prefix = {"ID": "ckptvault-tier-cold-dev", "Filter": {"And": {"Prefix": "dev/", "Tags": []}}}
    users = {"ID": "users-own", "Filter": {"Prefix": "prod/"}}
    assert replaced_by(dict(ours), ours)
    assert replaced_by(legacy_same, ours)
    assert not replaced_by(legacy_other, ours)
    assert not replaced_by(other_prefix, ours)
    assert not replaced_by(users, ours)


def test_at_the_bucket_root_the_plain_id_is_the_id() -> None:
    (ours,) = lifecycle_rules("", {"cold": "COLD"}, ["cold"])
    assert ours["ID"] == plain_id(ours) == "ckptvault-tier-cold"
    assert replaced_by({"ID": "ckptvault-tier-cold", "Filter": {"Prefix": "x/"}}, ours)
