"""Acknowledge a response's first bytes at once (Linux's TCP_QUICKACK) on every connection of our clients.

Why: a server that writes a response's headers and its body in two sends with Nagle's algorithm on
(Ceph RGW 16.2's frontend does) holds the body until the headers are acknowledged, and Linux delays
that acknowledgement up to 40 ms on a connection that has just sent a request. Every response with a
body (a GET, a LIST, a multipart upload's start and completion) then took ~44 ms against Ceph RGW on
loopback, and 2-4 ms with the option set before the response is read (bench/README.md, "Measured changes
that hold").
The kernel leaves quick-ack mode again on its own, so it is asked before every response, one
setsockopt each; a response whose body is large (a ranged GET of a restore) is read with the delayed
acknowledgements again once its headers are in: acknowledging each segment of a bulk body at once cost
a 1 GiB restore from SeaweedFS ~6% (6 of 6 interleaved pairs slower), and a big body is not held by
Nagle's algorithm anyway. Nothing changes in what is sent or checked; where the option does not exist
(not Linux) or botocore builds its connections elsewhere, `install` changes nothing and returns False
(the client then works as before; tests/unit/test_quick_ack.py fails on `installed`).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from functools import partial
from typing import Any

from botocore.awsrequest import (
    AWSHTTPConnection,
    AWSHTTPConnectionPool,
    AWSHTTPSConnection,
    AWSHTTPSConnectionPool,
)

_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)
# A body at least this long is bulk: read with the kernel's delayed acknowledgements (a Nagle-held
# tail is under one segment; loopback's is 64 KiB)
BULK_BYTES = 1 << 20


def _ask(sock: socket.socket | None, quick: bool = True) -> None:
    if sock is not None and _QUICKACK is not None:
        with contextlib.suppress(OSError):  # a closed or foreign socket: the response is read as before
            sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1 if quick else 0)


def _is_bulk(response: Any) -> bool:
    headers = getattr(response, "headers", None)
    length = headers.get("Content-Length") if headers is not None else None
    try:
        return length is not None and int(length) >= BULK_BYTES
    except ValueError:
        return False


def _answered(sock: socket.socket | None, read: Callable[[], Any]) -> Any:
    """`read()` (the connection's own getresponse) with quick acks asked first, and off again for a bulk body."""
    _ask(sock)
    response = read()
    if _is_bulk(response):
        _ask(sock, quick=False)
    return response


class QuickAckHTTPConnection(AWSHTTPConnection):
    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        return _answered(self.sock, partial(super().getresponse, *args, **kwargs))


class QuickAckHTTPSConnection(AWSHTTPSConnection):
    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        return _answered(self.sock, partial(super().getresponse, *args, **kwargs))


class QuickAckHTTPConnectionPool(AWSHTTPConnectionPool):
    ConnectionCls = QuickAckHTTPConnection


class QuickAckHTTPSConnectionPool(AWSHTTPSConnectionPool):
    ConnectionCls = QuickAckHTTPSConnection


def _pool_classes(client: Any) -> dict[str, Any] | None:
    """botocore's URLLib3Session keeps the pool class per scheme in one dict its pool managers share."""
    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    classes = getattr(session, "_pool_classes_by_scheme", None)
    return classes if isinstance(classes, dict) and set(classes) == {"http", "https"} else None


def install(client: Any) -> bool:
    """Make `client`'s connections quick-ack ones; False (nothing changed) where that is not possible.
    Call it before the client's first request: pools made earlier keep their connections' class."""
    classes = _pool_classes(client)
    if _QUICKACK is None or classes is None:
        return False
    classes["http"] = QuickAckHTTPConnectionPool
    classes["https"] = QuickAckHTTPSConnectionPool
    return True


def installed(client: Any) -> bool:
    classes = _pool_classes(client)
    return classes is not None and classes["http"] is QuickAckHTTPConnectionPool
