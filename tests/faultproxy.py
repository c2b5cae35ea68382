"""A fault-injecting HTTP proxy for S3 tests: 127.0.0.1, in front of one real S3 server.

boto3 reaches it through `endpoint_url = proxy.url` (path-style). Each request is forwarded unchanged,
Host header included: SigV4 signs the Host the client sees (the proxy's host:port), and the servers
we test (SeaweedFS, Ceph RGW, moto) check the signature against the Host header they receive, so the
signature still holds. `Expect: 100-continue` is answered by the proxy itself and not forwarded
(botocore never signs it).

Faults, each at its own seeded rate (a fraction of requests), decided per request:
  error_500        the request is not forwarded; 500 InternalError with S3's XML error body
  slowdown_503     the request is not forwarded; 503 SlowDown with S3's XML error body
  reset_request    half the request body is read, then the connection is reset (RST): the server
                   never sees the request
  reset_response   the request IS forwarded and applied by the server, then the client gets half of the
                   response body (or nothing, for an empty body) and a reset: the hard case, where a
                   retry repeats something that already happened (a conditional PUT, a
                   CompleteMultipartUpload)
  latency          the request is delayed by `latency_s` seconds, then forwarded normally
`hold(op, ..., first=n, under=s)` makes every request of those operations (or only the first n of them,
or only those whose path contains s) wait,
unforwarded, until `release()`; `held` lists their clients' (host, port), so a test can tell which
process is in the middle of one.
`counts` says what was injected (per kind and per kind/S3 operation); `requests` counts every request;
`peak_in_flight` is the most requests of each S3 operation the proxy was handling at the same moment.
The same seed gives the same sequence of decisions (thread timing decides which request gets which).
"""

from __future__ import annotations

import contextlib
import http.client
import random
import socket
import ssl
import struct
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULT_KINDS = ("error_500", "slowdown_503", "reset_request", "reset_response", "latency")
_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "expect", "upgrade", "te"})

_ERRORS = {
    "error_500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "slowdown_503": (503, "SlowDown", "Please reduce your request rate."),
}


@dataclass
class FaultRates:
    """Fraction of requests that get each fault (their sum is the total fault rate)."""

    error_500: float = 0.0
    slowdown_503: float = 0.0
    reset_request: float = 0.0
    reset_response: float = 0.0
    latency: float = 0.0
    latency_s: float = 0.2

    @classmethod
    def spread(cls, total: float, latency_s: float = 0.2) -> FaultRates:
        """`total` split evenly over the five kinds."""
        each = total / len(FAULT_KINDS)
        return cls(each, each, each, each, each, latency_s)

    def total(self) -> float:
        return sum(getattr(self, k) for k in FAULT_KINDS)


def s3_operation(method: str, path: str) -> str:
    """A coarse S3 operation name from method and path, for the per-operation counts."""
    url = urllib.parse.urlsplit(path)
    q = urllib.parse.parse_qs(url.query, keep_blank_values=True)
    parts = [p for p in url.path.split("/") if p]
    on_object = len(parts) >= 2
    if "uploads" in q:
        return "CreateMultipartUpload" if method == "POST" else "ListMultipartUploads"
    if "uploadId" in q:
        return {"PUT": "UploadPart", "POST": "CompleteMultipartUpload", "DELETE": "AbortMultipartUpload"}.get(
            method, "ListParts"
        )
    if "tagging" in q:
        return f"{method} tagging"
    if "lifecycle" in q:
        return f"{method} lifecycle"
    if "restore" in q:
        return "RestoreObject"
    if "delete" in q:
        return "DeleteObjects"
    if not on_object:
        return {"GET": "ListObjects", "HEAD": "HeadBucket", "PUT": "CreateBucket"}.get(method, f"{method} bucket")
    return {"GET": "GetObject", "HEAD": "HeadObject", "PUT": "PutObject", "DELETE": "DeleteObject"}.get(method, method)


@dataclass
class FaultProxy:
    upstream: str  # http://127.0.0.1:PORT of the real server
    rates: FaultRates = field(default_factory=FaultRates)
    seed: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    requests: Counter[str] = field(default_factory=Counter)  # every request, per S3 operation
    tls: tuple[str, str] | None = None  # (certfile, keyfile): serve HTTPS (a TLS front for the server)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        up = urllib.parse.urlsplit(self.upstream)
        self._up_host, self._up_port = up.hostname or "127.0.0.1", up.port or 80
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.enabled = True
        self.in_flight: Counter[str] = Counter()
        self.peak_in_flight: Counter[str] = Counter()
        self.hold_ops: frozenset[str] = frozenset()
        self._hold_left: int | None = None  # how many more requests of hold_ops to hold (None: all)
        self._hold_under = ""
        self.held: list[tuple[str, int]] = []
        self.first_held = threading.Event()
        self._released = threading.Event()

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "proxy not started"
        host, port = self._server.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{host}:{port}"

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(_Handler):
            owner = proxy

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        if self.tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self.tls)
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="faultproxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No faults inside the block (set-up and checks through the proxy)."""
        was, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = was

    def hold(self, *ops: str, first: int | None = None, under: str = "") -> None:
        """Requests of `ops` (only the first `first` of them, if given; only those whose path contains
        `under`, e.g. a checkpoint's key prefix and not the capability probe's) wait before they are
        read or forwarded, until release()."""
        self._released.clear()
        self._hold_left = first
        self._hold_under = under
        self.hold_ops = frozenset(ops)

    def release(self) -> None:
        self.hold_ops = frozenset()
        self._released.set()

    def wait_if_held(self, op: str, path: str, client: tuple[str, int]) -> None:
        if op not in self.hold_ops or self._hold_under not in path:
            return
        with self._lock:
            if self._hold_left is not None:
                if self._hold_left <= 0:
                    return
                self._hold_left -= 1
            self.held.append(client)
        self.first_held.set()
        self._released.wait(timeout=300)  # a test that forgets release() does not hang its server forever

    # -- decisions and counts ------------------------------------------------------------------

    def decide(self, op: str) -> str | None:
        with self._lock:
            self.requests[op] += 1
            if not self.enabled:
                return None
            x = self._rng.random()
            edge = 0.0
            for kind in FAULT_KINDS:
                edge += getattr(self.rates, kind)
                if x < edge:
                    self.counts[kind] += 1
                    self.counts[f"{kind} {op}"] += 1
                    return kind
        return None

    def enter(self, op: str) -> None:
        with self._lock:
            self.in_flight[op] += 1
            self.peak_in_flight[op] = max(self.peak_in_flight[op], self.in_flight[op])

    def leave(self, op: str) -> None:
        with self._lock:
            self.in_flight[op] -= 1

    @property
    def injected(self) -> int:
        """Faults that make a request fail (latency excluded: it only slows one down)."""
        return sum(self.counts[k] for k in FAULT_KINDS if k != "latency")

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {self.counts[k]}" for k in FAULT_KINDS)
        return f"{self.total_requests} requests, {self.injected} failed by injection ({kinds})"


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0) at once, whatever file objects still refer to the socket."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        fd = sock.detach()
        if fd >= 0:
            socket.socket(fileno=fd).close()
    except OSError:
        pass


class _Handler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"
    _upstream: http.client.HTTPConnection | None = None

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _read_body(self, limit: int | None = None) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        return self.rfile.read(n if limit is None else min(n, limit))

    def _read_chunked(self) -> bytes:
        out = bytearray()
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(out)
            out += self.rfile.read(size)
            self.rfile.readline()

    def _abort(self) -> None:
        self.close_connection = True
        _reset(self.connection)

    def _handle(self) -> None:
        op = s3_operation(self.command, self.path)
        self.owner.enter(op)
        try:
            self._handle_op(op)
        finally:
            self.owner.leave(op)

    def _handle_op(self, op: str) -> None:
        self.owner.wait_if_held(op, self.path, self.client_address[:2])
        fault = self.owner.decide(op)
        if fault == "reset_request":
            n = int(self.headers.get("Content-Length") or 0)
            self._read_body(limit=n // 2)
            self._abort()
            return
        body = self._read_body()
        if fault in _ERRORS:
            status, code, message = _ERRORS[fault]
            self._error(status, code, message)
            return
        if fault == "latency":
            time.sleep(self.owner.rates.latency_s)
        try:
            status, reason, headers, payload = self._forward(body)
        except OSError as e:  # the real server went away: say so as a 502
            self._error(502, "BadGateway", f"fault proxy: upstream {self.owner.upstream} failed: {e}")
            return
        if fault == "reset_response":
            self.send_response_only(status, reason)
            if payload:
                for k, v in headers:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload[: len(payload) // 2])
            self.wfile.flush()
            self._abort()
            return
        self.send_response_only(status, reason)
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _error(self, status: int, code: str, message: str) -> None:
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<Resource>{self.path.split('?')[0]}</Resource><RequestId>faultproxy</RequestId></Error>"
        ).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(xml)))
        self.send_header("x-amz-request-id", "faultproxy")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(xml)

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        for attempt in range(2):  # a pooled upstream connection may have been closed by the server
            conn = self._upstream
            if conn is None:
                conn = self._upstream = http.client.HTTPConnection(
                    self.owner._up_host, self.owner._up_port, timeout=120
                )
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    if k.lower() not in _HOP and k.lower() != "content-length":
                        conn.putheader(k, v)
                if body or self.command in ("PUT", "POST"):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body)
                resp = conn.getresponse()
                payload = resp.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                self._upstream = None
                if attempt:
                    raise
                continue
            if resp.will_close:
                conn.close()
                self._upstream = None
            headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP]
            chunked = "chunked" in (resp.getheader("Transfer-Encoding") or "").lower()
            if chunked or (resp.getheader("Content-Length") is None and self.command != "HEAD"):
                headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
                headers.append(("Content-Length", str(len(payload))))
            return resp.status, resp.reason, headers, payload
        raise AssertionError("unreachable")

    def do_GET(self) -> None:
        self._handle()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        if self._upstream is not None:
            self._upstream.close()
