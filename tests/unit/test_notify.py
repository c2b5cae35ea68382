"""Notifiers against a real local HTTP server speaking Slack, through real slack-sdk clients."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Callable, Iterator

import pytest

from ckptvault.alerts.channels import (
    REDACTED,
    ConsoleNotifier,
    DedupNotifier,
    FanoutNotifier,
    SlackNotifier,
    build_notifier,
)
from ckptvault.alerts.kinds import KINDS, Alert, build, escape
from ckptvault.alerts.watch import AlertState
from ckptvault.config import NotifyConfig
from tests.slack_recorder import API_PATH, SlackRecorder
from tests.slack_recorder import sample_alert as sample

TOKEN = "xoxb-1111-2222-SeCrEtToKeNvAlUe"
HOOK_PATH = "/services/T0SECRET/B0SECRET/WebhookSecretPart"


@pytest.fixture
def slack() -> Iterator[SlackRecorder]:
    rec = SlackRecorder(token=TOKEN, webhook_path=HOOK_PATH).start()
    yield rec
    rec.down()


def bot(rec: SlackRecorder, token: str = TOKEN) -> SlackNotifier:
    # short backoff: a refused connection is retried twice, ~0.03 s in all
    return SlackNotifier(token, None, "#oncall", rec.base_url, timeout=5, backoff_seconds=0.01)


def hook(rec: SlackRecorder) -> SlackNotifier:
    return SlackNotifier(None, rec.webhook_url, "#ignored", None, timeout=5, backoff_seconds=0.01)


def wire(blocks: list[dict[str, object]]) -> object:
    return json.loads(json.dumps(blocks))


# --- payloads ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_bot_token_payload_of_each_kind(slack: SlackRecorder, kind: str) -> None:
    alert = sample(kind)
    n = bot(slack)
    assert n.send(alert) is True
    (req,) = slack.requests
    assert req.path == API_PATH
    assert req.headers["authorization"] == f"Bearer {TOKEN}"
    body = req.payload
    assert body["channel"] == "#oncall"
    assert body["text"] == escape(alert.text())
    assert body["blocks"] == wire(alert.blocks())
    assert alert.flow_run_url is not None and alert.flow_run_url in json.dumps(body["blocks"])
    assert n.failures == 0


@pytest.mark.parametrize("kind", KINDS)
def test_webhook_payload_of_each_kind(slack: SlackRecorder, kind: str) -> None:
    alert = sample(kind)
    n = hook(slack)
    assert n.send(alert) is True
    (req,) = slack.requests
    assert req.path == HOOK_PATH
    assert "authorization" not in req.headers
    body = req.payload
    assert "channel" not in body  # a webhook posts to the channel it was created for
    assert body["text"] == escape(alert.text())
    assert body["blocks"] == wire(alert.blocks())


# --- rate limits and outages ---------------------------------------------------------------------------


@pytest.mark.parametrize("make", [bot, hook], ids=["bot", "webhook"])
def test_429_with_retry_after_is_honoured_and_delivered_once(
    slack: SlackRecorder, make: Callable[[SlackRecorder], SlackNotifier]
) -> None:
    n = make(slack)
    slack.rate_limit(1, retry_after=1)
    t = time.monotonic()
    assert n.send(sample("drill_failed")) is True
    waited = time.monotonic() - t
    assert [r.status for r in slack.requests] == [429, 200]
    assert len(slack.delivered()) == 1
    assert waited >= 1.0  # slept for Retry-After before the second attempt
    assert n.failures == 0


def test_429_that_outlasts_the_retries_is_a_counted_failure(
    slack: SlackRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    n = bot(slack)
    slack.rate_limit(10, retry_after=0)
    assert n.send(sample("drill_failed")) is False
    assert [r.status for r in slack.requests] == [429] * 4  # first try + 3 retries
    assert n.failures == 1
    assert "retried at the next check" in caplog.text


@pytest.mark.parametrize("make", [bot, hook], ids=["bot", "webhook"])
def test_slack_down_returns_false_then_delivers_when_back(
    slack: SlackRecorder, make: Callable[[SlackRecorder], SlackNotifier], caplog: pytest.LogCaptureFixture
) -> None:
    n = make(slack)
    slack.down()
    alert = sample("ingest_failed")
    assert n.send(alert) is False  # no exception
    assert n.send(alert) is False
    assert n.failures == 2
    assert "did not take the ingest_failed alert for run llama-7b, step 12000" in caplog.text
    slack.up()
    assert n.send(alert) is True
    assert len(slack.delivered()) == 1
    assert n.failures == 2


def test_an_outage_is_retried_through_dedup_at_the_next_check(slack: SlackRecorder) -> None:
    state = AlertState()
    clock = [1000.0]
    n = DedupNotifier(bot(slack), state, window_seconds=3600, now=lambda: clock[0])
    alert = sample("validation_blocked")
    slack.down()
    assert n.send(alert) is False
    assert state.sent == {}  # not recorded as sent
    slack.up()
    clock[0] += 60  # well inside the window: a failure must not count as "already sent"
    assert n.send(alert) is True
    assert n.send(alert) is True  # suppressed this time
    assert len(slack.delivered()) == 1
    assert state.sent == {alert.dedup_key(): 1060.0}


def test_a_rejected_token_is_a_counted_failure(slack: SlackRecorder) -> None:
    n = bot(slack, token="xoxb-wrong-token-value")
    assert n.send(sample("restore_failed")) is False
    assert n.failures == 1
    assert slack.delivered() == []


# --- secrets -------------------------------------------------------------------------------------------


def all_output(caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> str:
    out = capsys.readouterr()
    records = "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in caplog.records)
    return "\n".join([caplog.text, records, out.out, out.err])


def exercise(n: SlackNotifier, rec: SlackRecorder) -> list[str]:
    """Success, 429s, an outage and (for the token) a rejection; returns every error text seen."""
    texts = [repr(n), str(n)]
    n.send(sample("run_stale"))
    rec.rate_limit(4, retry_after=0)
    n.send(sample("run_stale"))
    rec.down()
    n.send(sample("run_stale"))
    rec.up()
    rec.token = "xoxb-some-other-token"  # now ours is refused: ok=false
    n.send(sample("run_stale"))
    rec.down()
    try:
        n._post(sample("flow_failed"))  # the raw slack-sdk error, before our own redaction
    except Exception as e:
        texts += [str(e), repr(e)]
    rec.up()
    return texts


def test_the_token_never_appears_in_logs_errors_or_repr(
    slack: SlackRecorder, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)  # slack-sdk logs the most at DEBUG
    n = bot(slack)
    texts = exercise(n, slack)
    state = AlertState()
    built = build_notifier(NotifyConfig(slack_base_url=slack.base_url), state, env={"CKPTVAULT_SLACK_TOKEN": TOKEN})
    texts += [repr(built), str(built)]
    everything = all_output(caplog, capsys) + "\n".join(texts)
    assert n.failures >= 3  # the failure paths really ran
    assert "Sending a request" in everything  # slack-sdk's debug logging really was captured
    assert TOKEN not in everything
    assert "SeCrEtToKeN" not in everything


def test_the_webhook_url_never_appears_in_logs_errors_or_repr(
    slack: SlackRecorder, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    n = hook(slack)
    texts = exercise(n, slack)
    everything = all_output(caplog, capsys) + "\n".join(texts)
    assert n.failures >= 2
    assert REDACTED in everything  # slack-sdk did try to log the URL, and it was scrubbed
    assert "WebhookSecretPart" not in everything
    assert "T0SECRET" not in everything


def test_a_secret_loader_that_fails_does_not_leak_or_raise(caplog: pytest.LogCaptureFixture) -> None:
    def loader(name: str) -> str:
        raise RuntimeError(f"cannot decode {TOKEN}")

    cfg = NotifyConfig(slack_secret_block="slack-token")
    n = build_notifier(cfg, AlertState(), loader, env={})
    assert "SlackNotifier" not in repr(n)
    assert "could not load the Slack Secret block 'slack-token' (RuntimeError)" in caplog.text
    assert TOKEN not in caplog.text


# --- build_notifier ------------------------------------------------------------------------------------


def test_console_only_without_any_secret(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    n = build_notifier(NotifyConfig(), AlertState(), env={})
    assert repr(n) == "DedupNotifier(FanoutNotifier(ConsoleNotifier()), window_seconds=3600)"
    assert "console only" in caplog.text


def test_token_env_var_routes_to_slack(slack: SlackRecorder) -> None:
    cfg = NotifyConfig(channel="#ml-oncall", slack_token_env="MY_TOKEN", slack_base_url=slack.base_url)
    n = build_notifier(cfg, AlertState(), env={"MY_TOKEN": f" {TOKEN}\n", "CKPTVAULT_SLACK_WEBHOOK": "x"})
    assert "mode='bot token'" in repr(n)
    assert n.send(sample("budget_exceeded")) is True
    (req,) = slack.delivered()
    assert req.payload["channel"] == "#ml-oncall"


def test_webhook_env_var_routes_to_the_webhook(slack: SlackRecorder) -> None:
    n = build_notifier(NotifyConfig(), AlertState(), env={"CKPTVAULT_SLACK_WEBHOOK": slack.webhook_url})
    assert n.send(sample("tier_applied")) is True
    assert [r.path for r in slack.delivered()] == [HOOK_PATH]


@pytest.mark.parametrize("value_kind", ["token", "webhook"])
def test_secret_block_is_used_when_no_env_var(slack: SlackRecorder, value_kind: str) -> None:
    value = TOKEN if value_kind == "token" else slack.webhook_url
    asked: list[str] = []

    def loader(name: str) -> str:
        asked.append(name)
        return value

    cfg = NotifyConfig(slack_secret_block="ckptvault-slack", slack_base_url=slack.base_url)
    n = build_notifier(cfg, AlertState(), loader, env={})
    assert n.send(sample("restore_completed")) is True
    assert asked == ["ckptvault-slack"]
    assert [r.path for r in slack.delivered()] == [API_PATH if value_kind == "token" else HOOK_PATH]


def test_built_notifier_dedups_within_the_configured_window(slack: SlackRecorder) -> None:
    clock = [0.0]
    cfg = NotifyConfig(dedup_window_minutes=10, slack_base_url=slack.base_url)
    n = build_notifier(cfg, AlertState(), env={"CKPTVAULT_SLACK_TOKEN": TOKEN}, now=lambda: clock[0])
    alert = sample("drill_failed")
    n.send(alert)
    clock[0] = 599
    n.send(alert)
    assert len(slack.delivered()) == 1
    clock[0] = 601
    n.send(alert)
    assert len(slack.delivered()) == 2


# --- console, dedup, fanout ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "level"), [("restore_completed", "INFO"), ("run_stale", "WARNING"), ("drill_failed", "ERROR")]
)
def test_console_logs_the_alert_at_its_severity(caplog: pytest.LogCaptureFixture, kind: str, level: str) -> None:
    caplog.set_level(logging.INFO, logger="ckptvault.alerts")
    stream = io.StringIO()
    alert = sample(kind)
    assert ConsoleNotifier(stream).send(alert) is True
    (rec,) = [r for r in caplog.records if r.name == "ckptvault.alerts"]
    assert rec.levelname == level
    assert rec.getMessage() == alert.text()
    assert stream.getvalue() == alert.text() + "\n"


def test_console_with_a_broken_stream_returns_false() -> None:
    stream = io.StringIO()
    stream.close()
    assert ConsoleNotifier(stream).send(sample("run_stale")) is False


class Inbox:
    def __init__(self, up: bool = True) -> None:
        self.got: list[Alert] = []
        self.up = up

    def send(self, alert: Alert) -> bool:
        if self.up:
            self.got.append(alert)
        return self.up


def test_dedup_within_the_window_and_resend_after() -> None:
    inbox, clock = Inbox(), [0.0]
    n = DedupNotifier(inbox, AlertState(), window_seconds=600, now=lambda: clock[0])
    a = build("ingest_failed", run="r", step=5, error="boom", attempts=3)
    assert n.send(a) and n.send(a)
    clock[0] = 599.9
    same = build("ingest_failed", run="r", step=5, error="a different error text", attempts=3)
    assert n.send(same)  # same (kind, run, reason)
    assert len(inbox.got) == 1
    assert n.suppressed == 2
    assert n.send(build("ingest_failed", run="r", step=6, error="boom", attempts=3))  # another step: another reason
    assert len(inbox.got) == 2
    clock[0] = 600.0
    assert n.send(a)
    assert len(inbox.got) == 3


def test_dedup_does_not_record_a_failed_send() -> None:
    inbox, state = Inbox(up=False), AlertState()
    n = DedupNotifier(inbox, state, window_seconds=600, now=lambda: 10.0)
    a = build("ingest_failed", run="r", step=5, error="boom", attempts=3)
    assert n.send(a) is False
    assert state.sent == {}
    inbox.up = True
    assert n.send(a) is True
    assert inbox.got == [a]


def test_dedup_forgets_old_records_but_keeps_recent_ones() -> None:
    clock = [0.0]
    state = AlertState()
    n = DedupNotifier(Inbox(), state, window_seconds=60, now=lambda: clock[0])
    n.send(build("ingest_failed", run="r", step=1, error="x", attempts=1))
    clock[0] = 8 * 24 * 3600.0
    n.send(build("ingest_failed", run="r", step=2, error="x", attempts=1))
    assert list(state.sent) == [build("ingest_failed", run="r", step=2, error="x", attempts=1).dedup_key()]


def test_fanout_sends_to_all_and_reports_partial_failure() -> None:
    down, ok = Inbox(up=False), Inbox()
    n = FanoutNotifier(down, ok)
    a = sample("flow_failed")
    assert n.send(a) is False
    assert ok.got == [a]
    down.up = True
    assert n.send(a) is True


def test_slack_notifier_needs_a_credential() -> None:
    with pytest.raises(ValueError, match="needs a bot token or a webhook URL"):
        SlackNotifier(None, "  ", "#c", None)
