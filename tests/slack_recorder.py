"""A local stand-in for Slack: the Web API's chat.postMessage and an incoming webhook, on 127.0.0.1.

Records every request (including the ones it refuses), so tests assert on exactly what slack-sdk
sent. Faults: `rate_limit(k, retry_after)` answers 429 to the next k requests; `down()` closes the
listening socket (clients get "connection refused"); `up()` reopens it on the same port.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from ckptvault.alerts.kinds import Alert, build

# The bot token the recorder accepts (tests/conftest.py `slack` fixture); tests check it is never printed.
SLACK_TOKEN = "xoxb-ckptvault-test-0123456789-secret"

API_PATH = "/api/chat.postMessage"
DEFAULT_WEBHOOK_PATH = "/services/T/B/X"


# Realistic alerts of every kind, for payload tests here and in the flow tests.
URL = "http://127.0.0.1:4200/runs/flow-run/0b6d5c1e"
T0 = 1_790_000_000.0  # 2026-09-21


def sample_alert(kind: str, url: str | None = URL) -> Alert:
    """One realistic alert of each kind, as the flows would build it."""
    facts: dict[str, dict[str, object]] = {
        "ingest_failed": {
            "run": "llama-7b", "step": 12000, "error": "TransientStoreError: timed out on PUT", "attempts": 5
        },
        "validation_blocked": {
            "run": "llama-7b", "step": 12000, "problems": ["size 12.1 GB is 40% below the median of the last 10"]
        },
        "validation_warned": {
            "run": "llama-7b", "step": 12000, "problems": ["step 12000 skipped 2 expected intervals"]
        },
        "drill_failed": {"run": "llama-7b", "step": 9000, "problems": ["model.safetensors: CRC32C mismatch"]},
        "drill_verify_error": {
            "run": "llama-7b", "step": 9000, "save": 1,
            "problems": ["verify_error: timed out after 600 s; its process group was killed"],
        },
        "drill_format_rot": {
            "run": "llama-7b", "step": 9000, "save": 1, "python": "/opt/venv-next/bin/python",
            "problems": ["with /opt/venv-next/bin/python: verify failed: exit 1: the checkpoint failed the check"],
        },
        "drill_digest": {"passed": [("llama-7b", 9000)], "failed": [("gpt-small", 300)]},
        "tier_applied": {
            "run": "llama-7b", "moved": {"cold": 3, "archive": 1}, "bytes_moved": 48_000_000_000,
            "saved_usd_per_month": 12.5,
        },
        "evict_skipped": {
            "run": "llama-7b", "step": 9000, "save": 1,
            "local": ["/lustre/llama-7b/checkpoint-9000/model.safetensors: size 12 locally, 10 in the manifest"],
            "store": [],
        },
        "restore_completed": {"run": "llama-7b", "step": 9000, "destination": "/scratch/llama-7b", "seconds": 412.0},
        "restore_failed": {"run": "llama-7b", "step": 9000, "error": "ObjectFrozenError: thaw in progress"},
        "run_stale": {
            "run": "llama-7b", "newest_at": T0, "stale_after_hours": 2.0, "now": T0 + 5 * 3600, "step": 12000
        },
        "run_recovered": {"run": "llama-7b", "stale_since": T0, "newest_at": T0 + 7 * 3600, "step": 12500},
        "budget_exceeded": {"monthly_usd": 130.0, "budget": 100.0},
        "flow_failed": {"flow": "ingest", "state": "Crashed", "message": "SIGTERM received"},
        "run_restarted": {
            "run": "llama-7b", "step": 9000, "resaved": ["step 9500 save 1: run restarted from before step 9500"]
        },
        "catalog_unreadable": {
            "run": "llama-7b", "objects": {"prod/_catalog/run=llama-7b/events/0001-ab.parquet": "not Parquet"}
        },
        "legal_hold": {
            "run": "llama-7b", "step": 9000, "save": 1, "on": True, "who": "alice",
            "why": "incident 7: keep for the audit", "objects": 12,
        },
        "lock_drift": {
            "run": "llama-7b", "step": 9000, "save": 1,
            "problems": ["model.safetensors: no Object Lock retention (ckptvault set 2027-01-02)"],
        },
        "replicate_failed": {
            "replica": "ceph-dr", "run": "llama-7b", "step": 9000, "save": 1,
            "error": "model.safetensors: its bytes' CRC32C is AAAAAA==, the manifest says BBBBBB==",
        },
        "replica_lagging": {
            "replica": "ceph-dr", "late": [("llama-7b", 9000, 1, T0), ("llama-7b", 9500, 1, T0 + 3600)],
            "max_lag_hours": 24.0, "now": T0 + 9e4,
        },
        "scrub_problem": {
            "store": "ceph-dr", "run": "llama-7b", "step": 9000, "save": 1,
            "problems": [
                "model.safetensors: CRC32C mismatch: AAAAAA==, the manifest says BBBBBB==", "_MANIFEST.json: missing"
            ],
            "repaired": False,
        },
        "tamper": {
            "store": "primary", "run": "llama-7b", "step": 9000, "save": 1,
            "keys": [
                "ckpts/llama-7b/step-0000009000/model.safetensors: overwritten at 2026-12-07T08:12:03Z (version "
                "3HL4kqtJlcpXroDTDmJ over 3HL4kqCxf3vjVBH4)",
                "ckpts/llama-7b/step-0000009000/_MANIFEST.json: deleted at 2026-12-07T08:12:04Z (version "
                "3HL4kqu0ZGa over 3HL4kqCq0a)",
            ],
            "since": "2026-12-07T08:12:02Z", "committed": "2026-12-01T03:00:41Z",
        },
    }  # fmt: skip
    return build(kind, flow_run_url=url, **facts[kind])


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what the recorder answered

    @property
    def payload(self) -> dict[str, Any]:
        """The body as a dict: JSON, or a form whose `blocks` field holds JSON."""
        if self.headers.get("content-type", "").startswith("application/json"):
            return dict(json.loads(self.body))
        form = {k: v[0] for k, v in parse_qs(self.body.decode()).items()}
        out: dict[str, Any] = dict(form)
        if "blocks" in form:
            out["blocks"] = json.loads(form["blocks"])
        return out


@dataclass
class SlackRecorder:
    token: str = "xoxb-test-token"
    webhook_path: str = DEFAULT_WEBHOOK_PATH
    requests: list[Request] = field(default_factory=list)
    port: int = 0
    _limit_left: int = 0
    _retry_after: int = 1
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> SlackRecorder:
        self.up()
        return self

    def up(self) -> None:
        assert self._server is None, "already up"
        # port 0 the first time; the same port after down(), so clients built earlier still reach it
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler_class())
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), name="slack-recorder", daemon=True
        )
        self._thread.start()

    def down(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        assert self._thread is not None
        self._thread.join(5)
        self._server = None

    stop = down

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    @property
    def webhook_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.webhook_path}"

    # --- faults and inspection -----------------------------------------------------------------------

    def rate_limit(self, count: int, retry_after: int = 1) -> None:
        with self._lock:
            self._limit_left = count
            self._retry_after = retry_after

    def delivered(self) -> list[Request]:
        """Requests that were accepted (HTTP 200 and, for the API, a valid token)."""
        with self._lock:
            return [r for r in self.requests if r.status == 200 and self._authorized(r)]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def _authorized(self, r: Request) -> bool:
        return r.path != API_PATH or r.headers.get("authorization") == f"Bearer {self.token}"

    def _answer(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            if path not in (API_PATH, self.webhook_path) or method != "POST":
                status, extra, out = 404, {}, b"no_service"
            elif self._limit_left > 0:
                self._limit_left -= 1
                status, extra = 429, {"Retry-After": str(self._retry_after)}
                out = b'{"ok":false,"error":"ratelimited"}' if path == API_PATH else b"rate_limited"
            elif path == API_PATH:
                status, extra = 200, {"Content-Type": "application/json; charset=utf-8"}
                req = Request(method, path, headers, body, 200)
                if not self._authorized(req):
                    out = b'{"ok":false,"error":"invalid_auth"}'
                else:
                    channel = req.payload.get("channel")
                    ts = f"{1700000000 + len(self.requests)}.000100"
                    out = json.dumps({"ok": True, "channel": channel, "ts": ts}).encode()
            else:
                status, extra, out = 200, {"Content-Type": "text/plain"}, b"ok"
            self.requests.append(Request(method, path, headers, body, status))
        return status, extra, out

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, extra, out = recorder._answer("POST", self.path, headers, body)
                self.send_response(status)
                for k, v in extra.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the recorder's own request log would drown pytest output

        return Handler
