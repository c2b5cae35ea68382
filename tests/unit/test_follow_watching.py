"""`ckptvault follow`'s mechanism per source (ckptvault/ingest/watching.py): inotify on a local file system,
polling on a network or FUSE one or an unknown type, decided from /proc/self/mountinfo; the inotify
watcher itself on a real directory (a new step directory is watched as it appears, a save's burst of
files is one change); and when a run is scanned with no event (ckptvault/ingest/follow.py `scan_at`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ckptvault.ingest.follow import RESCAN_SECONDS, ROOT_RETRY_SECONDS, scan_at
from ckptvault.ingest.watching import Inotify, TreeWatcher, decide, mechanism_for, mount_of, parse_mountinfo

# A compute node's mounts: the root on ext4, a tmpfs, Lustre scratch, NFS home, GPFS, an sshfs FUSE mount,
# a path with a space (written \040), an overlay container root stacked over "/" last.
MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:27 / /dev/shm rw,relatime - tmpfs tmpfs rw
41 22 0:40 / /lustre/scratch rw,relatime shared:20 - lustre 10.0.0.1@o2ib:/scratch rw,flock
42 22 0:41 / /home rw,relatime - nfs4 nfs:/home rw,vers=4.2
43 22 0:42 / /gpfs/proj rw,relatime - gpfs proj rw
44 42 0:43 / /home/me/remote rw,nosuid - fuse.sshfs me@host:/data rw
45 22 0:44 / /mnt/my\\040ckpt rw - xfs /dev/vdb rw
46 22 0:45 / /mnt/odd rw - weirdfs none rw
"""


@pytest.mark.parametrize(
    ("root", "mechanism", "fstype"),
    [
        ("/data/run-a", "inotify", "ext4"),
        ("/dev/shm/ckpt", "inotify", "tmpfs"),
        ("/mnt/my ckpt/run", "inotify", "xfs"),  # the \\040 in mountinfo is a space
        ("/lustre/scratch/llama/run", "poll", "lustre"),
        ("/home/me/ckpt", "poll", "nfs4"),
        ("/home/me/remote/ckpt", "poll", "fuse.sshfs"),  # the deeper mount wins over /home
        ("/gpfs/proj/x", "poll", "gpfs"),
        ("/mnt/odd/x", "poll", "weirdfs"),  # unknown: polled, to be safe
        ("/lustre/scratchy", "inotify", "ext4"),  # a prefix of a mount point's name is not under it
    ],
)
def test_each_source_gets_inotify_only_on_a_local_file_system(root: str, mechanism: str, fstype: str) -> None:
    c = decide(Path(root), MOUNTINFO)
    assert (c.mechanism, c.fstype) == (mechanism, fstype), c


def test_the_reason_names_the_file_system_and_the_choice_can_be_forced() -> None:
    assert "network or FUSE" in mechanism_for("nfs4")[1] and "network or FUSE" in mechanism_for("fuse.juicefs")[1]
    assert "not known to be local" in mechanism_for("weirdfs")[1]
    assert decide(Path("/home/me"), MOUNTINFO, "inotify").mechanism == "inotify"  # the operator knows better
    assert decide(Path("/data"), MOUNTINFO, "poll").mechanism == "poll"
    # no mountinfo (not Linux, /proc not mounted): polling, which works everywhere
    c = decide(Path("/data"), None)
    assert c.mechanism == "poll" and "not Linux" in c.reason


def test_stacked_mounts_the_last_one_on_top_counts_and_bad_lines_are_skipped() -> None:
    text = MOUNTINFO + "50 22 0:50 / / rw - overlay overlay rw\nnonsense line\n"
    mounts = parse_mountinfo(text)
    assert len(mounts) == 9
    m = mount_of("/data/x", mounts)
    assert m is not None and m.fstype == "overlay"


def test_this_machines_own_mountinfo_is_read(tmp_path: Path) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("Linux's /proc/self/mountinfo")
    c = decide(tmp_path, Path("/proc/self/mountinfo").read_text())
    assert c.fstype and c.point and tmp_path.as_posix().startswith(c.point.rstrip("/"))


@pytest.fixture
def watcher() -> TreeWatcher:
    if not sys.platform.startswith("linux"):
        pytest.skip("inotify is Linux's")
    return TreeWatcher(Inotify())


def test_the_watcher_sees_a_save_in_a_new_step_directory_and_the_marker_after_it(
    watcher: TreeWatcher, tmp_path: Path
) -> None:
    root, other = tmp_path / "a", tmp_path / "b"
    root.mkdir()
    other.mkdir()
    watcher.watch("a", root)
    watcher.watch("b", other)
    assert watcher.wait(0.05) == set()  # nothing happened: nothing changed
    step = root / "checkpoint-2"
    step.mkdir()
    assert watcher.wait(5) == {"a"}  # the new directory, now watched itself
    (step / "model.safetensors").write_bytes(b"x" * 1000)
    (step / "optimizer.pt").write_bytes(b"y" * 1000)
    assert watcher.wait(5) == {"a"}  # a burst of files is one change
    (step / "trainer_state.json").write_text("{}")  # the commit marker, inside the watched step directory
    assert watcher.wait(5) == {"a"}
    (other / "x.ckpt.tmp").write_bytes(b"z")
    (other / "x.ckpt.tmp").rename(other / "epoch=0-step=2.ckpt")  # renamed into place
    assert watcher.wait(5) == {"b"}
    watcher.close()


def test_a_root_that_appears_later_is_watched_once_it_is_there(watcher: TreeWatcher, tmp_path: Path) -> None:
    root = tmp_path / "later" / "root"
    watcher.watch("r", root)
    assert watcher.watched["r"] is False and watcher.retry_roots() == []
    (root / "lightning_logs" / "version_0" / "checkpoints").mkdir(parents=True)
    assert watcher.retry_roots() == ["r"] and watcher.watched["r"]
    # Lightning's deepest layout: the file three directories down is seen
    (root / "lightning_logs" / "version_0" / "checkpoints" / "epoch=0-step=4.ckpt").write_bytes(b"PK")
    assert watcher.wait(5) == {"r"}
    watcher.forget("r")
    (root / "lightning_logs" / "version_0" / "checkpoints" / "epoch=0-step=6.ckpt").write_bytes(b"PK")
    assert watcher.wait(0.3) == set()  # forgotten: its source is polled instead
    watcher.close()


def test_when_a_run_is_scanned_with_no_event() -> None:
    # polled: every --poll-seconds
    assert scan_at("poll", False, 100.0, 5.0, []) == 105.0
    # inotify: a slow rescan as insurance, or --poll-seconds when that is longer
    assert scan_at("inotify", True, 100.0, 5.0, []) == 100.0 + RESCAN_SECONDS
    assert scan_at("inotify", True, 100.0, 3600.0, []) == 3700.0
    # a root not there yet is looked for often
    assert scan_at("inotify", False, 100.0, 3600.0, []) == 100.0 + ROOT_RETRY_SECONDS
    # a waiting step's retry time set since the last scan comes first; an older one was acted on
    assert scan_at("inotify", True, 100.0, 5.0, [130.0, 99.0]) == 130.0
    assert scan_at("poll", False, 100.0, 5.0, [99.0]) == 105.0
