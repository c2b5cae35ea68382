"""Delivering alerts: the console (always), Slack (when a token or webhook URL is configured), dedup.

Two rules shape this module:
- Alerting never fails a flow. `send` returns False on failure, logs why, and counts it; the
  alert is not recorded as sent, so the next check sends it again.
- The Slack token and webhook URL are secrets. They come from the environment or a Prefect Secret
  (through `secret_loader`), never from the config file, and are scrubbed from every log line and
  error text, including slack-sdk's own logging (its retry messages print the request URL, which
  for a webhook is the secret itself).
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TextIO
from urllib.parse import urlsplit

from ckptvault.alerts.alert import Alert, escape
from ckptvault.alerts.watch import AlertState
from ckptvault.config import NotifyConfig
from ckptvault.errors import InvalidArgumentError

if TYPE_CHECKING:  # slack-sdk itself only when a Slack channel is built: not on a restore's path to its first byte
    from slack_sdk.http_retry import Jitter, RetryHandler
    from slack_sdk.web import WebClient
    from slack_sdk.webhook import WebhookClient

log = logging.getLogger("ckptvault.alerts.channels")
alerts_log = logging.getLogger("ckptvault.alerts")

# Dedup records outlive the window so the watch can still see that its alert was delivered at the
# next hourly check, even with a window of a few minutes.
SENT_RETENTION_SECONDS = 7 * 24 * 3600
REDACTED = "[redacted]"

__all__ = [
    "AlertState",
    "ConsoleNotifier",
    "DedupNotifier",
    "FanoutNotifier",
    "Notifier",
    "SlackNotifier",
    "build_notifier",
]


class Notifier(Protocol):
    def send(self, alert: Alert) -> bool:
        """Deliver one alert; never raises. False means not delivered (and already logged)."""
        ...


class ConsoleNotifier:
    """The embedded default: one log line per alert on `ckptvault.alerts.kinds`, plus an optional stream."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    def send(self, alert: Alert) -> bool:
        level = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}[alert.severity]
        try:
            alerts_log.log(level, "%s", alert.text(), extra={"alert_kind": alert.kind, "run": alert.run})
            if self.stream is not None:
                print(alert.text(), file=self.stream, flush=True)
        except Exception as e:  # a closed stream must not fail the flow either
            print(f"ckptvault: could not print an alert: {e}", file=sys.stderr)
            return False
        return True

    def __repr__(self) -> str:
        return "ConsoleNotifier()"


class _Redactor:
    def __init__(self, secrets: list[str]) -> None:
        # longest first, so a webhook URL is replaced whole before its path is
        self.secrets = sorted((s for s in secrets if len(s) >= 8), key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for s in self.secrets:
            text = text.replace(s, REDACTED)
        return text


class _RedactingLogger(logging.Logger):
    """The logger handed to slack-sdk: a child of ckptvault.alerts.channels that scrubs secrets from every record.

    Built directly (not through getLogger) so each notifier's secrets stay with that notifier and
    the logger is garbage-collected with it.
    """

    def __init__(self, redact: _Redactor) -> None:
        super().__init__("ckptvault.alerts.channels.slack_sdk")
        self.parent = log
        self._redact = redact

    def makeRecord(
        self,
        name: str,
        level: int,
        fn: str,
        lno: int,
        msg: object,
        args: Any,
        exc_info: Any,
        func: str | None = None,
        extra: Any = None,
        sinfo: str | None = None,
    ) -> logging.LogRecord:
        record = super().makeRecord(name, level, fn, lno, msg, args, exc_info, func, extra, sinfo)
        record.msg = self._redact(record.getMessage())
        record.args = None
        # a traceback could quote the URL; keep only the redacted message
        record.exc_info = None
        record.exc_text = None
        if record.levelno > logging.WARNING:
            # slack-sdk logs every failed attempt as ERROR; for us it is a warning (the alert is
            # retried), and SlackNotifier.send logs the one line that matters
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return record


def _scaled_jitter() -> Jitter:
    from slack_sdk.http_retry import Jitter

    class _ScaledJitter(Jitter):
        """slack-sdk's default jitter adds up to a whole second, whatever the backoff; scale it instead."""

        def recalculate(self, duration: float) -> float:
            return duration * (1 + random.random())

    return _ScaledJitter()


class SlackNotifier:
    """chat.postMessage with a bot token (preferred), or an incoming webhook.

    slack-sdk does the retrying: up to 3 retries on HTTP 429, sleeping for the server's Retry-After,
    and `connect_retries` retries on connection errors with exponential backoff from `backoff_seconds`.
    """

    def __init__(
        self,
        token: str | None,
        webhook_url: str | None,
        channel: str,
        base_url: str | None = None,
        *,
        timeout: int = 10,
        connect_retries: int = 2,
        backoff_seconds: float = 0.5,
    ) -> None:
        token = token.strip() if token else None
        webhook_url = webhook_url.strip() if webhook_url else None
        if not token and not webhook_url:
            raise InvalidArgumentError("SlackNotifier needs a bot token or a webhook URL; neither was given")
        self.channel = channel
        self.failures = 0
        secrets = [s for s in (token, webhook_url) if s]
        if webhook_url:
            secrets.append(urlsplit(webhook_url).path)  # an error may quote only the path
        self._redact = _Redactor(secrets)
        from slack_sdk.http_retry import ConnectionErrorRetryHandler, RateLimitErrorRetryHandler
        from slack_sdk.http_retry.builtin_interval_calculators import BackoffRetryIntervalCalculator
        from slack_sdk.web import WebClient
        from slack_sdk.webhook import WebhookClient

        handlers: list[RetryHandler] = [
            RateLimitErrorRetryHandler(max_retry_count=3),
            ConnectionErrorRetryHandler(
                max_retry_count=connect_retries,
                interval_calculator=BackoffRetryIntervalCalculator(backoff_seconds, _scaled_jitter()),
            ),
        ]
        sdk_log = _RedactingLogger(self._redact)
        self._web: WebClient | None = None
        self._hook: WebhookClient | None = None
        if token:
            kw: dict[str, Any] = {"base_url": base_url} if base_url else {}
            self._web = WebClient(token=token, timeout=timeout, logger=sdk_log, retry_handlers=handlers, **kw)
        else:
            assert webhook_url is not None
            self._hook = WebhookClient(webhook_url, timeout=timeout, logger=sdk_log, retry_handlers=handlers)

    @property
    def mode(self) -> str:
        return "bot token" if self._web is not None else "webhook"

    def __repr__(self) -> str:
        # never the token or URL: this repr ends up in Prefect logs and tracebacks
        return f"SlackNotifier(mode={self.mode!r}, channel={self.channel!r}, failures={self.failures})"

    def send(self, alert: Alert) -> bool:
        try:
            problem = self._post(alert)
        except Exception as e:
            problem = f"{type(e).__name__}: {e}"
        if problem is None:
            return True
        self.failures += 1
        log.warning(
            "Slack (%s) did not take the %s alert for %s: %s. It stays unsent and is retried at the next "
            "check (Slack failures so far: %d).",
            self.mode,
            alert.kind,
            alert.where(),
            self._redact(problem)[:500],
            self.failures,
        )
        return False

    def _post(self, alert: Alert) -> str | None:
        """None on success, else what went wrong (may contain secrets: the caller redacts)."""
        text = escape(alert.text())
        blocks = alert.blocks()
        if self._web is not None:
            # raises SlackApiError on ok=false or a 429 that outlasted the retries
            resp = self._web.chat_postMessage(channel=self.channel, text=text, blocks=blocks)
            return None if resp.get("ok") else f"Slack answered {resp.data!r}"
        assert self._hook is not None
        hook = self._hook.send(text=text, blocks=blocks)
        if hook.status_code == 200:
            return None
        return f"webhook answered HTTP {hook.status_code}: {hook.body[:200]!r}"


class FanoutNotifier:
    """Every notifier gets every alert; delivered only if all of them delivered it."""

    def __init__(self, *notifiers: Notifier) -> None:
        self.notifiers = notifiers

    def send(self, alert: Alert) -> bool:
        # a list, not all(generator): one failing channel must not starve the others
        results = [n.send(alert) for n in self.notifiers]
        return all(results)

    def __repr__(self) -> str:
        return f"FanoutNotifier({', '.join(map(repr, self.notifiers))})"


class DedupNotifier:
    """The same dedup key at most once per window. Records deliveries in `state.sent` (mutates it)."""

    def __init__(
        self,
        inner: Notifier,
        state: AlertState,
        window_seconds: float,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.inner = inner
        self.state = state
        self.window_seconds = window_seconds
        self.now = now
        self.suppressed = 0

    def send(self, alert: Alert) -> bool:
        key = alert.dedup_key()
        t = self.now()
        last = self.state.sent.get(key)
        if last is not None and t - last < self.window_seconds:
            self.suppressed += 1
            log.debug("alert %s suppressed: already sent %.0f s ago", key, t - last)
            return True
        if not self.inner.send(alert):
            return False  # not recorded: the next check sends it again
        self.state.sent[key] = t
        self._prune(t)
        return True

    def _prune(self, t: float) -> None:
        keep = max(self.window_seconds, SENT_RETENTION_SECONDS)
        for key in [k for k, when in self.state.sent.items() if t - when > keep]:
            del self.state.sent[key]

    def __repr__(self) -> str:
        return f"DedupNotifier({self.inner!r}, window_seconds={self.window_seconds:g})"


def _looks_like_url(value: str) -> bool:
    return value.startswith(("https://", "http://"))


def build_notifier(
    cfg: NotifyConfig,
    state: AlertState,
    secret_loader: Callable[[str], str | None] | None = None,
    *,
    now: Callable[[], float] = time.time,
    env: Mapping[str, str] | None = None,
) -> DedupNotifier:
    """Console always; Slack too when a token/webhook is in the environment or the Secret block.

    Precedence: the token env var, then the webhook env var, then the Secret block (a value that is
    a URL is taken as a webhook, anything else as a bot token).
    """
    environ = os.environ if env is None else env
    token = environ.get(cfg.slack_token_env, "").strip() or None
    webhook = environ.get(cfg.slack_webhook_env, "").strip() or None
    source = f"${cfg.slack_token_env}" if token else f"${cfg.slack_webhook_env}" if webhook else ""
    if not token and not webhook and cfg.slack_secret_block and secret_loader is not None:
        try:
            value = (secret_loader(cfg.slack_secret_block) or "").strip()
        except Exception as e:
            # the loader's error could quote the value it failed on; name only the type
            log.warning(
                "could not load the Slack Secret block %r (%s); alerts go to the console only",
                cfg.slack_secret_block,
                type(e).__name__,
            )
            value = ""
        if value:
            source = f"Secret block {cfg.slack_secret_block!r}"
            webhook, token = (value, None) if _looks_like_url(value) else (None, value)
    notifiers: list[Notifier] = [ConsoleNotifier()]
    if token or webhook:
        slack = SlackNotifier(token, webhook, cfg.channel, cfg.slack_base_url)
        log.info("alerts go to the console and to Slack (%s from %s, %s)", slack.mode, source, cfg.channel)
        notifiers.append(slack)
    else:
        log.info(
            "alerts go to the console only: set $%s or $%s (or notify.slack_secret_block) for Slack",
            cfg.slack_token_env,
            cfg.slack_webhook_env,
        )
    return DedupNotifier(FanoutNotifier(*notifiers), state, cfg.dedup_window_minutes * 60, now)
