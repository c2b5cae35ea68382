"""The point-in-time decisions (ckptvault/history/): which moment a TIME names, which version of a key
was current then, and what changed since."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ckptvault.errors import CkptvaultError
from ckptvault.history.as_of import AsOfError, parse_as_of
from ckptvault.history.recovery import (
    KeyRole,
    committed_saves,
    key_role,
    plan_recovery,
    read_as_then,
    references,
    save_dir_of,
)
from ckptvault.history.versions import ChangeKind, by_key, changes_since, current_at, first_written
from ckptvault.store.port import ObjectVersion

NOW = datetime(2026, 12, 7, 12, 0, 0, 500_000, tzinfo=UTC)
T0 = 1_800_000_000.0  # the moment the tests read at


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("2h", datetime(2026, 12, 7, 10, 0, 0, tzinfo=UTC)),
        ("3d", datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)),
        ("1d12h", datetime(2026, 12, 6, 0, 0, 0, tzinfo=UTC)),
        ("90s", datetime(2026, 12, 7, 11, 58, 30, tzinfo=UTC)),
        ("1w", datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)),
        ("2026-12-07T08:00:00Z", datetime(2026, 12, 7, 8, 0, 0, tzinfo=UTC)),
        ("2026-12-07T09:30:15.75+02:00", datetime(2026, 12, 7, 7, 30, 15, tzinfo=UTC)),
        (" 2026-12-07 08:00z ", datetime(2026, 12, 7, 8, 0, 0, tzinfo=UTC)),
    ],
)
def test_a_time_or_a_duration_names_a_utc_moment_to_the_second(text: str, expect: datetime) -> None:
    got = parse_as_of(text, NOW)
    assert got == expect
    assert got.tzinfo is not None and got.utcoffset() == expect.utcoffset()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("2026-12-07T08:00:00", "--as-of 2026-12-07T08:00:00: no zone; add one (Z for UTC"),
        ("yesterday", "--as-of yesterday: not a time; give an ISO 8601 time with a zone"),
        ("0h", "a duration of zero is now"),
        ("2h-", "not a time"),
        ("2027-01-01T00:00:00Z", "in the future (now is 2026-12-07T12:00:00Z)"),
    ],
)
def test_a_time_that_names_no_moment_is_refused_naming_it_and_the_forms(text: str, says: str) -> None:
    with pytest.raises(AsOfError, match=None) as caught:
        parse_as_of(text, NOW)
    assert says in str(caught.value)
    assert isinstance(caught.value, CkptvaultError) and isinstance(caught.value, ValueError)


def test_the_flag_is_named_as_the_user_typed_it() -> None:
    with pytest.raises(AsOfError, match=r"^--since soon: not a time"):
        parse_as_of("soon", NOW, flag="--since")


def v(key: str, vid: str, t: float, *, marker: bool = False, etag: str = "", latest: bool = False) -> ObjectVersion:
    return ObjectVersion(key, vid, t, 0 if marker else 10, "" if marker else (etag or f'"{vid}"'), marker, latest)


def test_the_version_current_at_a_moment_is_the_newest_written_by_its_second() -> None:
    entries = by_key([v("k", "v3", T0 + 1), v("k", "v2", T0 + 0.9), v("k", "v1", T0 - 50)])["k"]
    assert current_at(entries, T0).version_id == "v2"  # type: ignore[union-attr]  # same second counts
    assert current_at(entries, T0 - 1).version_id == "v1"  # type: ignore[union-attr]
    assert current_at(entries, T0 - 51) is None  # not yet written
    assert current_at(entries, T0 + 1.2).version_id == "v3"  # type: ignore[union-attr]


def test_a_delete_marker_on_top_means_nothing_was_current() -> None:
    entries = by_key([v("k", "m", T0 - 5, marker=True), v("k", "v1", T0 - 50)])["k"]
    assert current_at(entries, T0) is None
    assert current_at(entries, T0 - 10).version_id == "v1"  # type: ignore[union-attr]


def test_by_key_orders_newest_first_and_keeps_the_servers_order_within_a_second() -> None:
    listed = [v("a", "old", T0 - 9), v("a", "new-1", T0 + 0.2), v("a", "new-2", T0), v("b", "x", T0)]
    grouped = by_key(listed)
    assert [e.version_id for e in grouped["a"]] == ["new-1", "new-2", "old"]
    assert list(grouped) == ["a", "b"]


def test_the_first_written_version_is_the_reference_not_the_current_one() -> None:
    entries = by_key([v("m", "m2", T0 + 9, marker=True), v("m", "junk", T0 + 5), v("m", "commit", T0 - 5)])["m"]
    assert first_written(entries).version_id == "commit"  # type: ignore[union-attr]
    assert first_written([v("m", "x", T0, marker=True)]) is None


def test_changes_since_tells_a_delete_an_overwrite_and_a_creation_apart() -> None:
    listing = [
        # deleted: a marker over what was current
        v("deleted", "d-m", T0 + 10, marker=True, latest=True),
        v("deleted", "d-1", T0 - 10),
        # overwritten: junk on top
        v("overwritten", "o-junk", T0 + 10, latest=True),
        v("overwritten", "o-1", T0 - 10),
        # overwritten then deleted: removing the marker would uncover the junk
        v("both", "b-m", T0 + 20, marker=True, latest=True),
        v("both", "b-junk", T0 + 10),
        v("both", "b-1", T0 - 10),
        # created after the moment
        v("created", "c-1", T0 + 10, latest=True),
        # made and deleted since: absent then and now
        v("gone", "g-m", T0 + 20, marker=True, latest=True),
        v("gone", "g-1", T0 + 10),
        # untouched
        v("same", "s-1", T0 - 10, latest=True),
        # deleted before the moment and still deleted: reads the same
        v("old-delete", "od-m", T0 - 5, marker=True, latest=True),
        v("old-delete", "od-1", T0 - 10),
    ]
    changes = {c.key: c for c in changes_since(listing, T0)}
    assert {k: c.kind for k, c in changes.items()} == {
        "both": ChangeKind.OVERWRITTEN,
        "created": ChangeKind.CREATED,
        "deleted": ChangeKind.DELETED,
        "overwritten": ChangeKind.OVERWRITTEN,
    }
    assert changes["deleted"].then.version_id == "d-1"  # type: ignore[union-attr]
    assert [m.version_id for m in changes["deleted"].markers_after] == ["d-m"]
    assert [d.version_id for d in changes["both"].versions_after] == ["b-junk"]
    assert changes["both"].now.delete_marker and changes["created"].then is None
    assert list(changes) == sorted(changes)


def test_an_undone_overwrite_is_no_change_so_a_second_undo_does_nothing() -> None:
    listing = [
        v("k", "copy", T0 + 30, etag='"same"', latest=True),  # the old version put back by a copy
        v("k", "junk", T0 + 10),
        v("k", "orig", T0 - 10, etag='"same"'),
    ]
    assert changes_since(listing, T0) == []
    # a caller that compares the manifest's CRC32C decides instead of the ETag (multipart copies differ)
    assert [c.kind for c in changes_since(listing, T0, same_content=lambda a, b: False)] == [ChangeKind.OVERWRITTEN]


# ---------------------------------------------------------------------------------------------- recovery

P = "prod"
SAVE = "prod/llama/step-0000000100/"
NEW_SAVE = "prod/llama/step-0000000200/"
UNCOMMITTED = "prod/llama/step-0000000150/"


def test_each_key_is_known_by_its_role_in_the_layout() -> None:
    assert key_role(SAVE + "_MANIFEST.json", P) is KeyRole.MANIFEST
    assert key_role(SAVE + "model/shard-0.safetensors", P) is KeyRole.SAVE_OBJECT
    assert key_role("prod/llama/step-0000000100.save-2/_MANIFEST.json", P) is KeyRole.MANIFEST
    assert key_role("prod/_catalog/run=llama/events/1-a.parquet", P) is KeyRole.CATALOG
    assert key_role("prod/_state/alerts/state.json", P) is KeyRole.STATE
    assert key_role("prod/llama/notes.txt", P) is KeyRole.OTHER
    assert key_role("llama/step-0000000100/_MANIFEST.json", "") is KeyRole.MANIFEST
    assert save_dir_of(SAVE + "a/b.bin", P) == SAVE and save_dir_of("prod/_catalog/x", P) is None


def attack_listing() -> list[ObjectVersion]:
    """One run's save committed before the moment, then every key deleted, one data object and the
    manifest overwritten with junk, and a new save and a new catalog event written after it."""
    return [
        v(SAVE + "_MANIFEST.json", "m-junk-del", T0 + 30, marker=True, latest=True),
        v(SAVE + "_MANIFEST.json", "m-junk", T0 + 20),
        v(SAVE + "_MANIFEST.json", "m-1", T0 - 100),
        v(SAVE + "model.bin", "d-del", T0 + 30, marker=True, latest=True),
        v(SAVE + "model.bin", "d-1", T0 - 110),
        v(SAVE + "optim.bin", "o-junk", T0 + 20, latest=True),
        v(SAVE + "optim.bin", "o-1", T0 - 110),
        v("prod/_catalog/run=llama/events/1-a.parquet", "c-del", T0 + 30, marker=True, latest=True),
        v("prod/_catalog/run=llama/events/1-a.parquet", "c-1", T0 - 90),
        v("prod/_catalog/run=llama/snapshot.parquet", "s-2", T0 + 10, latest=True),  # a compaction since
        v("prod/_catalog/run=llama/snapshot.parquet", "s-1", T0 - 90),
        v(UNCOMMITTED + "part.bin", "u-2", T0 + 10, latest=True),  # an upload in flight at the moment
        v(UNCOMMITTED + "part.bin", "u-1", T0 - 5),
        v(NEW_SAVE + "_MANIFEST.json", "n-1", T0 + 40, latest=True),
        v("prod/_catalog/run=llama/events/2-b.parquet", "e-1", T0 + 40, latest=True),
    ]


def test_the_plan_removes_markers_puts_committed_objects_back_and_keeps_whatever_is_new() -> None:
    listing = attack_listing()
    committed = committed_saves(listing, T0, P)
    assert committed == frozenset({SAVE})
    plan = plan_recovery(changes_since(listing, T0), P, committed)
    assert [(r.key, [m.version_id for m in r.markers], r.uncovers.version_id) for r in plan.remove_markers] == [
        ("prod/_catalog/run=llama/events/1-a.parquet", ["c-del"], "c-1"),
        (SAVE + "model.bin", ["d-del"], "d-1"),
    ]
    # the manifest was overwritten, then deleted: removing the marker would uncover junk, so it is copied back
    assert [(p.key, p.role, p.version.version_id, p.over.version_id) for p in plan.put_back] == [
        (SAVE + "_MANIFEST.json", KeyRole.MANIFEST, "m-1", "m-junk-del"),
        (SAVE + "optim.bin", KeyRole.SAVE_OBJECT, "o-1", "o-junk"),
    ]
    assert [c.key for c in plan.created] == ["prod/_catalog/run=llama/events/2-b.parquet", NEW_SAVE + "_MANIFEST.json"]
    assert [(x.key, x.role) for x in plan.left] == [
        ("prod/_catalog/run=llama/snapshot.parquet", KeyRole.CATALOG),
        (UNCOMMITTED + "part.bin", KeyRole.SAVE_OBJECT),
    ]
    assert "not committed then" in plan.left[1].why and not plan.empty


def test_after_the_plan_is_carried_out_a_second_plan_is_empty() -> None:
    listing = attack_listing()
    plan = plan_recovery(changes_since(listing, T0), P, committed_saves(listing, T0, P))
    done = [e for e in listing if e.version_id not in {m.version_id for r in plan.remove_markers for m in r.markers}]
    done += [v(p.key, f"{p.version.version_id}-copy", T0 + 60, etag=p.version.etag) for p in plan.put_back]
    again = plan_recovery(changes_since(done, T0), P, committed_saves(done, T0, P))
    assert again.empty
    assert [c.key for c in again.created] == [c.key for c in plan.created]  # still reported, never deleted


def test_each_committed_save_is_checked_against_its_first_manifest_version() -> None:
    listing = attack_listing()
    found = references(listing, committed_saves(listing, T0, P), P)
    assert {save: ref.version_id for save, ref in found.items()} == {SAVE: "m-1"}  # not the junk over it


def test_a_put_back_copy_reads_as_then_and_is_checked_for_its_lock_on_the_next_run() -> None:
    listing = attack_listing()
    plan = plan_recovery(changes_since(listing, T0), P, committed_saves(listing, T0, P))
    done = [e for e in listing if e.version_id not in {m.version_id for r in plan.remove_markers for m in r.markers}]
    done += [v(p.key, f"{p.version.version_id}-copy", T0 + 60, etag=p.version.etag) for p in plan.put_back]
    changed = {c.key for c in changes_since(done, T0)}
    pairs = read_as_then(done, T0, P, committed_saves(done, T0, P), changed)
    assert [(then.version_id, now.version_id) for then, now in pairs] == [("m-1", "m-1-copy"), ("o-1", "o-1-copy")]


def test_a_marker_over_a_key_that_is_not_ckptvaults_is_left_as_it_is() -> None:
    listing = [
        v("prod/_ckptvault_probe/p1", "p-del", T0 + 5, marker=True, latest=True),
        v("prod/_ckptvault_probe/p1", "p-1", T0 - 5),
    ]
    plan = plan_recovery(changes_since(listing, T0), P, frozenset())
    assert plan.remove_markers == () and [(x.key, x.role) for x in plan.left] == [
        ("prod/_ckptvault_probe/p1", KeyRole.OTHER)
    ]
    assert "lock probe" in plan.left[0].why
