"""The warm process's address and messages (ckptvault_cli/warm/protocol.py) and which commands the console
script hands over (warm_client.command_of): no server, no fork. The forked commands themselves are
tests/integration/test_warm_cli.py's."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from ckptvault_cli.warm import client as warm_client
from ckptvault_cli.warm import protocol as proto


def test_the_fingerprint_ignores_the_shells_bookkeeping_and_nothing_else() -> None:
    env = {"PATH": "/usr/bin", "AWS_PROFILE": "a", "PWD": "/x", "SHLVL": "1"}
    same = {**env, "PWD": "/y", "OLDPWD": "/x", "SHLVL": "3", "_": "/usr/bin/ckptvault", proto.OFF_ENV: "1"}
    assert proto.fingerprint(env) == proto.fingerprint(same)
    assert proto.fingerprint(env) != proto.fingerprint({**env, "AWS_PROFILE": "b"})
    assert proto.fingerprint(env) != proto.fingerprint({**env, "PREFECT_API_URL": "http://h/api"})
    assert proto.fingerprint(env) != proto.fingerprint({k: v for k, v in env.items() if k != "AWS_PROFILE"})


def test_the_socket_lives_in_a_directory_of_the_users_choosing_or_the_runtime_dir(tmp_path: Path) -> None:
    assert proto.runtime_dir({proto.DIR_ENV: str(tmp_path)}) == str(tmp_path)
    assert proto.runtime_dir({"XDG_RUNTIME_DIR": "/run/user/7"}) == "/run/user/7/ckptvault"
    assert proto.runtime_dir({}) == f"/tmp/ckptvault-{os.getuid()}"
    env = {proto.DIR_ENV: str(tmp_path), "A": "1"}
    assert proto.socket_path(env) == str(tmp_path / f"warm-{proto.fingerprint(env)}.sock")


def test_a_directory_open_to_others_is_not_used(tmp_path: Path) -> None:
    d = tmp_path / "w"
    d.mkdir(mode=0o700)
    d.chmod(0o700)
    assert proto.private_dir_ok(str(d))
    d.chmod(0o770)
    assert not proto.private_dir_ok(str(d))
    assert not proto.private_dir_ok(str(tmp_path / "missing"))


def test_messages_round_trip_with_descriptors() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r, w = os.pipe()
    try:
        proto.send(a, {"op": "run", "argv": ["ls", "ü"]}, [r])
        doc, fds = proto.receive(b, max_fds=3)
        assert doc == {"op": "run", "argv": ["ls", "ü"]} and len(fds) == 1
        os.write(w, b"x")
        assert os.read(fds[0], 1) == b"x"  # the very pipe, through another descriptor
        os.close(fds[0])
        a.close()
        with pytest.raises(EOFError):
            proto.receive(b)
    finally:
        for fd in (r, w):
            os.close(fd)
        b.close()


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["restore", "r", "--dest", "d"], "restore"),
        (["--config", "c.toml", "ingest"], "ingest"),
        (["--config", "warm", "ls"], "ls"),  # a config file named like a command is still the config
        (["--conf", "serve", "ls"], "ls"),  # argparse's abbreviation of --config
        (["--version"], None),
        (["warm", "--stop"], "warm"),
    ],
)
def test_the_command_is_the_first_word_past_the_global_options(argv: list[str], command: str | None) -> None:
    assert warm_client.command_of(argv) == command


def test_warm_and_serve_are_never_handed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """A listening socket that records what reaches it and refuses it (so each command runs cold)."""
    directory = tempfile.mkdtemp(prefix="cvw-")  # short: a socket's path is limited to 107 bytes
    os.chmod(directory, 0o700)
    monkeypatch.setenv(proto.DIR_ENV, directory)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(proto.socket_path())
    server.listen(8)
    server.settimeout(0.05)
    got: list[list[str]] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                doc, fds = proto.receive(conn, max_fds=3)
                for fd in fds:
                    os.close(fd)
                got.append(doc["argv"])
                proto.send(conn, {"refused": "a test"})

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        assert warm_client.hand_off(["serve"], 0.0) is None
        assert warm_client.hand_off(["--conf", "c.toml", "warm"], 0.0) is None
        assert warm_client.hand_off(["--config", "c.toml", "ls"], 0.0) is None  # asked, refused: cold
        monkeypatch.setenv(proto.OFF_ENV, "0")
        assert warm_client.hand_off(["ls"], 0.0) is None
    finally:
        stop.set()
        t.join(5)
        server.close()
        shutil.rmtree(directory, ignore_errors=True)
    assert got == [["--config", "c.toml", "ls"]]  # only the one command it may run reached it


_RELEASING = """
import os, sys
from ckptvault_cli.warm import early_exit
pipe, log = int(sys.argv[1]), os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND)
assert not early_exit.release(5)  # not armed: a cold process ends as it always did
early_exit.arm(pipe, log)
assert early_exit.armed() and early_exit.released() is None
print("the result", flush=True)
print("said on stderr", file=sys.stderr)
assert early_exit.release(3)
assert not early_exit.armed() and early_exit.released() == 3 and not early_exit.release(4)
print("after the release")
print("an error after it", file=sys.stderr)
import signal
os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C relayed late: the user already has the result
print("still here")
"""


def test_a_released_command_is_given_its_code_and_nothing_more_reaches_its_streams(tmp_path: Path) -> None:
    import subprocess
    import sys

    log = tmp_path / "warm.log"
    log.write_text("")
    read_end, write_end = os.pipe()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _RELEASING, str(write_end), str(log)], pass_fds=(write_end,),
            capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip
    finally:
        os.close(write_end)
    try:
        got = os.read(read_end, 64)
    finally:
        os.close(read_end)
    assert done.returncode == 0, done.stderr
    assert got == b"3\n"  # what the warm process sends the command
    assert done.stdout == "the result\n" and done.stderr == "said on stderr\n"
    assert log.read_text() == "after the release\nan error after it\nstill here\n"
