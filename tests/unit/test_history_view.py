"""Opening the store as it was (ckptvault/history/view.py): refused on a bucket without versions, and a
moment older than the bucket keeps noncurrent versions read with a warning that says what it means."""

from __future__ import annotations

import time

import pytest

from ckptvault.history.as_of import AsOfError
from ckptvault.history.view import open_at
from ckptvault.store.memory import MemoryStore


class Versioned(MemoryStore):
    """The memory store saying its bucket is versioned: what the view decides is the subject here, the
    reads of a real versioned bucket are tests/integration/test_object_versions.py's."""

    def versioning(self) -> str | None:
        return "Enabled"

    def as_of(self, at: float) -> MemoryStore:
        return self


def test_a_bucket_without_versions_is_refused_naming_it_and_the_flag() -> None:
    with pytest.raises(AsOfError, match=r"^--since: s3://b keeps no versions \(versioning never turned on\)"):
        open_at(MemoryStore("b"), "2h", "prod", flag="--since")


def test_a_moment_older_than_the_kept_noncurrent_versions_warns_and_a_recent_one_does_not() -> None:
    store = Versioned("b")
    rule = {"ID": "nc", "Status": "Enabled", "Filter": {"Prefix": "prod/"},
            "NoncurrentVersionExpiration": {"NoncurrentDays": 30}}  # fmt: skip
    store.put_lifecycle([rule])
    old = open_at(store, "31d", "prod")
    assert len(old.warnings) == 1 and "older than the 30 days s3://b keeps noncurrent versions" in old.warnings[0]
    assert open_at(store, "29d", "prod").warnings == ()
    assert open_at(store, "31d", "other").warnings == ()  # the rule is another prefix's
    assert abs(old.at - (time.time() - 31 * 86400)) < 5
