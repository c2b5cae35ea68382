"""Quick acknowledgements on our S3 clients' connections (ckptvault/store/quick_ack.py): every client
make_client builds asks for TCP_QUICKACK before reading each response, on the socket it is read from,
turns it off again for a bulk body once the headers are in, and the response is read as before. (What
it saves against Ceph RGW is measured in bench/, not here.)"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ckptvault.config import StoreConfig
from ckptvault.store import quick_ack
from ckptvault.store.s3_client import make_client

LISTING = (
    b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
    b"<Name>bkt</Name><Prefix>p/</Prefix><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>"
    b"<Contents><Key>p/a</Key><LastModified>2026-12-05T08:00:00.000Z</LastModified><ETag>&quot;x&quot;</ETag>"
    b"<Size>3</Size><StorageClass>STANDARD</StorageClass></Contents></ListBucketResult>"
)


BULK = bytes(range(256)) * (quick_ack.BULK_BYTES // 256 + 1)


class _Listing(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the second request reuses the connection

    def do_GET(self) -> None:
        # headers and body in two sends, as Ceph RGW's frontend writes them
        body = BULK if self.path.startswith("/bkt/big") else LISTING
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream" if body is BULK else "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.flush()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Listing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_QUICKACK is Linux's")
def test_every_response_is_read_after_asking_for_quick_acks(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[bool, int]] = []
    real = quick_ack._ask

    def ask(sock: socket.socket | None, quick: bool = True) -> None:
        assert isinstance(sock, socket.socket)
        real(sock, quick)
        # the option as set when the response (or, for a bulk body, the rest of it) is read; the kernel
        # clears it again by itself later
        asked.append((quick, sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK)))

    monkeypatch.setattr(quick_ack, "_ask", ask)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    client = make_client(StoreConfig(bucket="bkt", endpoint_url=endpoint), 2)
    assert quick_ack.installed(client)
    for _ in range(2):
        listing = client.list_objects_v2(Bucket="bkt", Prefix="p/")
        assert [o["Key"] for o in listing["Contents"]] == ["p/a"]
    assert asked == [(True, 1), (True, 1)]
    asked.clear()
    assert client.get_object(Bucket="bkt", Key="big")["Body"].read() == BULK
    assert asked == [(True, 1), (False, 0)]  # a bulk body is read with delayed acknowledgements again


def test_a_client_botocore_builds_otherwise_is_left_as_it_is() -> None:
    class Elsewhere:
        _endpoint = None

    assert quick_ack.install(Elsewhere()) is False
