"""What the `ckptvault` command and its warm process (`ckptvault warm`) say to each other, and where.

Standard library only: the command imports this before anything else, and a command that finds no warm
process must have paid almost nothing for looking (docs/warm.md).

The address is one Unix socket per user and environment: `<dir>/warm-<fingerprint>.sock`, the
directory private to the user (mode 0700, checked before every use). The fingerprint hashes the
interpreter and every environment variable but the shell's own bookkeeping (`VOLATILE`): a warm process
imported Prefect's settings, the AWS and ckptvault variables as they were when it started, so a command
from any other environment finds no socket of its own and runs cold, as before.

A message is 4 bytes of length, then that many bytes of JSON. The command's first message carries its
three standard streams as file descriptors (SCM_RIGHTS): the forked child writes to the very terminal,
pipe or file the command was given.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import sys
from typing import Any

VERSION = 1
DIR_ENV = "CKPTVAULT_WARM_DIR"  # where the sockets are; default: $XDG_RUNTIME_DIR/ckptvault, /tmp/ckptvault-<uid>
OFF_ENV = "CKPTVAULT_WARM"  # "0": never hand a command to a warm process
# Set by the shell per command or per directory, or (OFF_ENV) read before the hand-off only: never read by
# ckptvault's commands, Prefect or boto3.
VOLATILE = frozenset({"_", "PWD", "OLDPWD", "SHLVL", OFF_ENV})
MAX_MESSAGE = 1 << 20


def runtime_dir(env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    if env.get(DIR_ENV):
        return env[DIR_ENV]
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "ckptvault")
    return f"/tmp/ckptvault-{os.getuid()}"


def comparable(env: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The environment as it decides what a warm process may run: all of it but `VOLATILE`."""
    return {k: v for k, v in env.items() if k not in VOLATILE}


def fingerprint(env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    h = hashlib.sha256(sys.executable.encode())
    for k, v in sorted(comparable(env).items()):
        h.update(b"\0" + k.encode("utf-8", "surrogateescape") + b"=" + v.encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:20]


def socket_path(env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    return os.path.join(runtime_dir(env), f"warm-{fingerprint(env)}.sock")


def log_path(socket: str) -> str:
    """The warm process's log, beside its socket: each command it ran, its exit code and duration."""
    return socket.removesuffix(".sock") + ".log"


def private_dir_ok(path: str) -> bool:
    """The directory is ours alone: owned by this user, no access for group or others."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid == os.getuid() and st.st_mode & 0o077 == 0


def send(sock: socket.socket, doc: dict[str, Any], fds: list[int] | None = None) -> None:
    body = json.dumps(doc).encode()
    data = struct.pack("!I", len(body)) + body
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


def _exactly(sock: socket.socket, n: int, got: bytes) -> bytes:
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            raise EOFError("the other side closed the connection mid-message")
        got += chunk
    return got


def receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    """One message and the descriptors sent with it; EOFError when the other side has gone."""
    if max_fds:
        head, fds, _flags, _addr = socket.recv_fds(sock, 4, max_fds)
        if not head:
            raise EOFError("the other side closed the connection")
    else:
        head, fds = sock.recv(4), []
        if not head:
            raise EOFError("the other side closed the connection")
    (n,) = struct.unpack("!I", _exactly(sock, 4, head))
    if n > MAX_MESSAGE:
        raise ValueError(f"a message of {n} bytes: not ckptvault's")
    doc = json.loads(_exactly(sock, n, b""))
    if not isinstance(doc, dict):
        raise ValueError("a message that is not a JSON object")
    return doc, list(fds)
