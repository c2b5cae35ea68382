"""A TCP proxy on 127.0.0.1 that caps the bytes per second each way, for bench/compression.py's
link-capped rows (issue [M]): production links to the store are the bottleneck, not loopback.

Every connection shares one token bucket per direction (client -> server, server -> client), as
every connection to a store shares the link. Bytes are forwarded unchanged, Host header included,
so SigV4 signatures made for the proxy's address still verify on SeaweedFS (as with
tests/faultproxy.py). A burst of 256 KiB: the cap holds over any interval longer than a few ms.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

_CHUNK = 64 * 1024
_BURST = 256 * 1024


class _Bucket:
    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.tokens = float(_BURST)
        self.at = time.monotonic()
        self.lock = threading.Lock()

    def take(self, n: int) -> None:
        """Block until `n` bytes may pass: each caller reserves its bytes, then sleeps off any debt."""
        with self.lock:
            now = time.monotonic()
            self.tokens = min(float(_BURST), self.tokens + (now - self.at) * self.rate) - n
            self.at = now
            wait = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


class LinkCap:
    def __init__(self, upstream_port: int, mb_per_s: float) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        rate = mb_per_s * 1e6
        self.up, self.down = _Bucket(rate), _Bucket(rate)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.bytes = {"up": 0, "down": 0}
        self._stop = False

    def start(self) -> LinkCap:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop = True
        self.sock.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(client, server, self.up, "up"), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, self.down, "down"), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, bucket: _Bucket, way: str) -> None:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        try:
            while n := src.recv_into(buf):
                bucket.take(n)
                dst.sendall(view[:n])
                self.bytes[way] += n
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            src.close()

    def __enter__(self) -> LinkCap:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
