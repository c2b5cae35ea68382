"""A replica's own retention (`[[replicas]] expire_after_days`; docs/FORMAT.md, "Replicas", "Deletes never
travel"): one lifecycle rule on the replica's bucket, under the replica's prefix, that deletes its objects
that many days after they were copied. Nothing the primary does reaches it, and it reaches nothing but the
replica's prefix (config.py refuses a replica whose prefix shares a bucket with another store's).

The rule, not the pass, deletes: a replica has no catalog of its own, and a rule keeps working while no
ckptvault runs. Its objects are written within one copy, the manifest last, so they expire together, the
manifest no earlier than the rest. On a versioned bucket (Object Lock needs one) the expiry leaves a delete
marker and the rule's `NoncurrentVersionExpiration` removes the versions a day later, which S3 does only once
their lock has passed: the config keeps `expire_after_days` past `[lock]`'s date, and `retention_problem`
refuses a bucket whose default retention outlasts it."""

from __future__ import annotations

from typing import Any

from ckptvault.config import ReplicaConfig
from ckptvault.store import LockStatus, ObjectStore, StoreError, lifecycle

RULE_NAME = "replica-expire"


def retention_rule(replica: ReplicaConfig, legacy: bool = False) -> dict[str, Any] | None:
    """The lifecycle rule of `replica`'s retention, None without one. `legacy`: written with S3's
    top-level Prefix, as a bucket whose other rules are (Ceph returns them so, and S3 refuses a
    configuration that mixes the two styles)."""
    if replica.expire_after_days is None:
        return None
    prefix = replica.prefix.strip("/")
    covered = f"{prefix}/" if prefix else ""
    return {
        "ID": lifecycle.rule_id(RULE_NAME, prefix),
        "Status": "Enabled",
        **({"Prefix": covered} if legacy else {"Filter": {"Prefix": covered}}),
        "Expiration": {"Days": replica.expire_after_days},
        # a versioned bucket keeps what the expiry hid as noncurrent versions: gone a day later
        "NoncurrentVersionExpiration": {"NoncurrentDays": 1},
    }


def retention_problem(replica: ReplicaConfig, status: LockStatus) -> str | None:
    """Why the rule must not be installed on this bucket, with the fix: a default retention longer than
    the replica keeps its objects would hide them behind delete markers while they stay locked (and
    billed). None when nothing stands in the way (or the replica has no retention)."""
    days = replica.expire_after_days
    if days is None or not status.enabled or status.default_mode is None:
        return None
    default = status.default_days if status.default_years is None else status.default_years * 365
    if default is not None and default > days:
        return (
            f"expire_after_days = {days}, but bucket {replica.bucket} locks every object for {default} days by "
            "default (its Object Lock default retention): the rule would hide locked objects behind delete "
            f"markers. Set expire_after_days to at least {default}, or shorten the bucket's default retention"
        )
    return None


def install_retention(store: ObjectStore, replica: ReplicaConfig) -> str:
    """Put the replica's retention rule in its bucket's lifecycle configuration, every other rule kept;
    without `expire_after_days`, take ours out (turning retention off works; a bucket whose rules cannot be
    read is left alone then). Writes only on a change; a StoreError says why it could not.
    Returns what it did: "installed", "removed" or "unchanged". With the replica's `lifecycle = "external"`
    it writes nothing (its credentials cannot: Terraform's replica_expire_after_days installs the rule) and
    returns "missing" when the rule the config asks for is not there as the config says."""
    if not replica.manages_lifecycle:
        want = retention_rule(replica)
        if want is None:
            return "unchanged"  # whatever rules Terraform keeps there are its own business
        ident = lifecycle.rule_id(RULE_NAME, replica.prefix)
        found = [r for r in store.get_lifecycle() if r.get("ID") == ident]
        return "unchanged" if len(found) == 1 and _same(found[0], want) else "missing"
    try:
        rules = store.get_lifecycle()
    except StoreError:
        if replica.expire_after_days is None:
            return "unchanged"  # a bucket whose rules cannot be read holds none of ours to take out
        raise
    ident = lifecycle.rule_id(RULE_NAME, replica.prefix)
    theirs = [r for r in rules if r.get("ID") != ident]
    legacy = any("Prefix" in r and "Filter" not in r for r in theirs)
    want = retention_rule(replica, legacy)
    mine = [r for r in rules if r.get("ID") == ident]
    if want is None:
        if not mine:
            return "unchanged"
        store.put_lifecycle(theirs)
        return "removed"
    if len(mine) == 1 and _same(mine[0], want):
        return "unchanged"
    store.put_lifecycle([*theirs, want])
    return "installed"


def _same(have: dict[str, Any], want: dict[str, Any]) -> bool:
    """The same rule as a server returns it (Ceph in the legacy Prefix style, others with defaults added)."""
    noncurrent = have.get("NoncurrentVersionExpiration") or {}
    return bool(
        have.get("Status") == want["Status"]
        and lifecycle.rule_prefix(have) == lifecycle.rule_prefix(want)
        and (have.get("Expiration") or {}).get("Days") == want["Expiration"]["Days"]
        and noncurrent.get("NoncurrentDays") == want["NoncurrentVersionExpiration"]["NoncurrentDays"]
    )
