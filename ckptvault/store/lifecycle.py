"""Our bucket lifecycle rules: their IDs and the prefix each one covers.

S3 keeps a bucket's lifecycle configuration as one document, in which rule IDs are unique. Two
ckptvault stores sharing a bucket under different prefixes (`prod`, `dev`) must not share a rule ID,
or each one's ingest rewrites the other's rule with its own prefix, and the other prefix's
incomplete uploads and tier transitions are silently dropped. So an ID names the prefix it covers.
The bucket root keeps the plain name, which is also the ID every prefix used before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptvault.store.port import ABORT_MPU_RULE_NAME, LifecycleRules


def rule_id(name: str, prefix: str) -> str:
    """`ckptvault-<name>` for the bucket root, `ckptvault-<name>-<prefix>` under a prefix."""
    prefix = prefix.strip("/")
    return f"ckptvault-{name}-{prefix}" if prefix else f"ckptvault-{name}"


def rule_prefix(rule: Mapping[str, Any]) -> str:
    """The key prefix a rule applies to, whichever of S3's three ways it is written in."""
    filt = rule.get("Filter") or {}
    if "And" in filt:
        return str(filt["And"].get("Prefix", ""))
    if "Prefix" in filt:
        return str(filt["Prefix"])
    # Compat: S3's legacy top-level Prefix; may go: when no supported server (Ceph does) returns it
    return str(rule.get("Prefix", ""))


def plain_id(rule: Mapping[str, Any]) -> str:
    """The ID versions before per-prefix IDs gave this rule of ours (its ID without the prefix)."""
    # Compat: finds rules those versions wrote to a bucket; may go: never, another prefix's may still run one
    prefix = rule_prefix(rule).strip("/")
    ident = str(rule.get("ID", ""))
    return ident.removesuffix(f"-{prefix}") if prefix else ident


def replaced_by(have: Mapping[str, Any], ours: Mapping[str, Any]) -> bool:
    """Whether the bucket's rule `have` is superseded by our rule `ours`: the same ID, or the plain ID
    an older version wrote for the same prefix. Another prefix's rule under the plain ID stays: it
    belongs to a store still running an older version."""
    if have.get("ID") == ours.get("ID"):
        return True
    return have.get("ID") == plain_id(ours) and rule_prefix(have) == rule_prefix(ours)


def with_abort_mpu_rule(rules: LifecycleRules, prefix: str, days: int) -> LifecycleRules | None:
    """`rules` with our rule aborting incomplete multipart uploads under `prefix` after `days` merged in
    (every other rule kept, other prefixes' included), or None when it is already in place: callers
    then leave the bucket's configuration unwritten."""
    covered = f"{prefix}/" if prefix else ""
    # Match the style of the rules already there: S3 rejects a configuration that mixes the legacy
    # top-level Prefix (which Ceph returns) with Filter.
    legacy = any("Prefix" in r and "Filter" not in r for r in rules)
    rule: dict[str, Any] = {
        "ID": rule_id(ABORT_MPU_RULE_NAME, prefix),
        "Status": "Enabled",
        **({"Prefix": covered} if legacy else {"Filter": {"Prefix": covered}}),
        "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": days},
    }
    mine = [r for r in rules if replaced_by(r, rule)]
    if len(mine) == 1 and mine[0].get("ID") == rule["ID"] and _same_rule(mine[0], rule):
        return None
    return [r for r in rules if r not in mine] + [rule]


def _same_rule(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    return bool(
        have.get("Status") == want["Status"]
        and rule_prefix(have) == rule_prefix(want)
        and have.get("AbortIncompleteMultipartUpload") == want["AbortIncompleteMultipartUpload"]
    )
