"""Bad input through the real command line: each gives a message that names the thing and the fix, a
non-zero exit (2 for configuration and environment), and deletes nothing.

Configuration and environment problems are caught by the CLI's preflight, before any flow starts, so
most cases run `ckptvault_cli.main.main([...])` in this process; the ones that need a Prefect flow
(and its log output) run the CLI as a subprocess.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config
from tests.reliability.conftest import MiB, all_keys, cli_cmd, cli_env, run_cli, tree


def _digest(root: Path) -> dict[str, str]:
    """Every entry under root (files, dirs, symlinks as their target): what 'nothing deleted' compares."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


@pytest.fixture
def hot(tmp_path: Path) -> Path:
    root = tmp_path / "hot"
    write_checkpoint(root, "deepspeed", 10, 1 * MiB)
    return root


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out + out.err


def _base_config(tmp_path: Path, hot: Path, endpoint_url: str = "http://127.0.0.1:9", bucket: str = "ckpts") -> str:
    return (
        f'[store]\nbucket = "{bucket}"\nendpoint_url = "{endpoint_url}"\npart_size_mb = 5\n\n'
        f'[[sources]]\nrun = "r"\npath = "{hot}"\nformat = "deepspeed"\nsettle_seconds = 0\n'
    )


CONFIG_CASES: dict[str, tuple[Callable[[str], str], list[str]]] = {
    # name: (how the good config is broken, what the message must say)
    "malformed TOML": (
        lambda t: t.replace('bucket = "ckpts"', "bucket = ckpts ="),
        ["not valid TOML", "Fix the syntax"],
    ),
    "wrong type": (
        lambda t: t.replace("part_size_mb = 5", 'part_size_mb = "big"'),
        ["store.part_size_mb", "valid integer"],
    ),
    "wrong type in a source": (
        lambda t: t.replace("settle_seconds = 0", 'settle_seconds = "soon"'),
        ["sources[0].settle_seconds"],
    ),
    "value out of range": (lambda t: t.replace("part_size_mb = 5", "part_size_mb = 1"), ["store.part_size_mb", "5"]),
    "unknown key": (
        lambda t: t.replace('bucket = "ckpts"', 'bucket = "ckpts"\nbukket = "x"'),
        ["store.bukket", "unknown key"],
    ),
    "unknown section": (lambda t: t + "\n[stroe]\nbucket = 'x'\n", ["stroe", "unknown key"]),
    "missing key": (lambda t: t.replace('bucket = "ckpts"\n', ""), ["store.bucket", "required"]),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_config_exits_2_naming_the_key(
    case: str, tmp_path: Path, hot: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    breaks, must_say = CONFIG_CASES[case]
    cfg = tmp_path / "c.toml"
    cfg.write_text(breaks(_base_config(tmp_path, hot)))
    before = _digest(tmp_path)
    for command in (["ingest"], ["restore", "r", "--dest", str(tmp_path / "out")], ["ls"]):
        code, text = _run(["--config", str(cfg), *command], capsys)
        assert code == 2, f"{case} / {command}: exit {code}\n{text}"
        assert str(cfg) in text, f"{case}: the message does not name the file\n{text}"
        for phrase in must_say:
            assert phrase in text, f"{case}: {phrase!r} missing from\n{text}"
    assert _digest(tmp_path) == before, "a failed command changed files"


def test_missing_and_unreadable_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = _run(["--config", str(tmp_path / "nope.toml"), "ingest"], capsys)
    assert code == 2 and "nope.toml does not exist" in text and "--config" in text
    (tmp_path / "adir.toml").mkdir()
    code, text = _run(["--config", str(tmp_path / "adir.toml"), "ingest"], capsys)
    assert code == 2 and "adir.toml cannot be read" in text
    os.environ.pop("CKPTVAULT_CONFIG", None)
    code, text = _run(["ingest"], capsys)
    assert code == 2 and "--config" in text and "CKPTVAULT_CONFIG" in text


def test_bad_source_paths_exit_2_naming_the_path(tmp_path: Path, hot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)  # a symlink loop as the run root
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    before = _digest(tmp_path)
    cases = {
        tmp_path / "nowhere": ["does not exist", "sources[0].path"],
        loop: ["symbolic link", "loop", "sources[0].path"],
        a_file: ["is not a directory", "sources[0].path"],
    }
    for path, must_say in cases.items():
        cfg = tmp_path / "c.toml"
        cfg.write_text(_base_config(tmp_path, hot).replace(str(hot), str(path)))
        code, text = _run(["--config", str(cfg), "ingest"], capsys)
        assert code == 2, text
        assert str(path) in text, text
        for phrase in must_say:
            assert phrase in text, f"{phrase!r} missing from\n{text}"
        cfg.unlink()
    assert _digest(tmp_path) == before, "a failed command changed files"


def test_unreadable_source_path_exits_2(tmp_path: Path, hot: Path, seaweedfs: Any) -> None:
    """chmod 000 on the run root. As root (CI) permissions do not bind, so the CLI runs with the
    capabilities that bypass them dropped (setpriv): a real permission check, not a simulated one."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(_base_config(tmp_path, hot, seaweedfs.url))
    before = _digest(hot)
    hot.chmod(0)
    try:
        cmd = cli_cmd(cfg, "ingest")
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                pytest.fail("running as root needs setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
            drop = "-dac_override,-dac_read_search"
            cmd = ["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}", "--", *cmd]
        env = {**os.environ, **seaweedfs.env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    finally:
        hot.chmod(0o755)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{hot} is not readable" in done.stderr and "permissions" in done.stderr, done.stderr
    assert _digest(hot) == before


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_store_problems_exit_2_before_touching_anything(
    tmp_path: Path, hot: Path, seaweedfs: Any, bucket_factory: Any, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    bucket = bucket_factory(seaweedfs)
    before = _digest(tmp_path)
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    dead = f"http://127.0.0.1:{_dead_port()}"
    cases: list[tuple[str, str, str, dict[str, str], list[str]]] = [
        ("missing bucket", seaweedfs.url, "no-such-bucket-ckv", {}, ["no-such-bucket-ckv does not exist", "Create it"]),
        ("endpoint down", dead, bucket, {}, [dead, "cannot reach", "Is the server running", "endpoint_url"]),
        (
            "bad credentials",
            seaweedfs.url,
            bucket,
            {"AWS_SECRET_ACCESS_KEY": "wrong-secret-0xDEADBEEF"},
            ["denied", "AWS_SECRET_ACCESS_KEY", bucket],
        ),
        ("unknown access key", seaweedfs.url, bucket, {"AWS_ACCESS_KEY_ID": "nobody-ckv"}, ["denied", bucket]),
    ]
    for name, url, bkt, env, must_say in cases:
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            cfg = tmp_path / "c.toml"
            cfg.write_text(_base_config(tmp_path, hot, url, bkt))
            for command in (["ingest"], ["ls"], ["restore", "r", "--dest", str(tmp_path / "out")], ["drill"]):
                code, text = _run(["--config", str(cfg), *command], capsys)
                assert code == 2, f"{name} / {command}: exit {code}\n{text}"
                for phrase in must_say:
                    assert phrase in text, f"{name} / {command}: {phrase!r} missing from\n{text}"
                assert "wrong-secret-0xDEADBEEF" not in text
                assert "Traceback" not in text
            cfg.unlink()
    assert _digest(tmp_path) == before, "a failed command changed local files"
    assert all_keys(seaweedfs.client(), bucket) == {}, "a failed command wrote to the bucket"


@pytest.mark.slow
def test_awkward_names_and_symlinks_upload_and_restore(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path
) -> None:
    """Spaces and non-ASCII in file names round-trip byte for byte; symlinks (a loop, one to a file
    outside the checkpoint, one inside) are named and not followed, and nothing is deleted."""
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    ckpt = write_checkpoint(root, "deepspeed", 10, 2 * MiB)
    odd = {
        "notes dir/résumé ü 数据.txt": "naïve café ☕\n".encode() * 1000,
        "with  two  spaces.json": b'{"a": 1}',
        "Ωmega/ünïcödé/€ + % & = ?.txt": os.urandom(7 * MiB),  # multipart, and characters URLs escape
    }
    for rel, data in odd.items():
        (ckpt / rel).parent.mkdir(parents=True, exist_ok=True)
        (ckpt / rel).write_bytes(data)
    secret = tmp_path / "outside-secret.txt"
    secret.write_text("must never be uploaded")
    (ckpt / "link-outside").symlink_to(secret)
    (ckpt / "loop-a").symlink_to(ckpt / "loop-b")
    (ckpt / "loop-b").symlink_to(ckpt / "loop-a")
    (ckpt / "self-loop-dir").symlink_to(".")
    for p in ckpt.iterdir():  # settle: nothing changed "just now"
        os.utime(p, (0, 1_700_000_000), follow_symlinks=False)
    before = _digest(tmp_path)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "deepspeed")])
    env = cli_env(seaweedfs)

    done = run_cli(cfg, "ingest", env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    for link in ("link-outside", "loop-a", "loop-b", "self-loop-dir"):
        assert f"{ckpt / link}" in out and "not followed" in out, f"{link} not reported:\n{out[-3000:]}"
    assert "points outside the checkpoint" in out
    keys = all_keys(seaweedfs.client(), bucket)
    base = checkpoint_prefix("t", "r", 10)
    for rel, data in odd.items():
        assert keys.get(base + rel) == len(data), f"{rel} not stored under its own name"
    assert not [k for k in keys if "link" in k or "loop" in k], "a symlink was followed and uploaded"
    assert base + MANIFEST_NAME in keys

    dest = tmp_path / "restored"
    done = run_cli(cfg, "restore", "r", "--dest", str(dest), env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    got = tree(dest / ckpt.name)
    want = {k: v for k, v in tree(ckpt).items() if not k.startswith(("link", "loop", "self-loop"))}
    assert got == want
    for rel, data in odd.items():
        assert got[rel] == data
    after = _digest(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before, "ingest or restore changed the hot tier"
    assert secret.read_text() == "must never be uploaded"
