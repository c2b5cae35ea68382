"""The alert state (ckptvault.alerts.sending) against every real server: writers at once lose no record, the
legacy `_state/alerts.json` is read and folded, and an object folded away mid-read is found again."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from ckptvault.alerts import kinds as alerts
from ckptvault.alerts.sending import LEGACY_NAME, load_alert_state, save_alert_state, send_alerts, stored_state_keys
from ckptvault.alerts.watch import AlertState, Episode
from ckptvault.config import Config, StoreConfig
from ckptvault.store import S3Store, open_store

PREFIX = "vault"
KEY_RE = re.compile(r"^vault/_state/alerts/\d{20}-[0-9a-f]{32}\.json$")
H = 3600.0
# A barrier wait that never returns means the other writer died: fail instead of hanging the suite.
BARRIER_TIMEOUT = 120


@pytest.fixture
def store_cfg(any_s3: Any, bucket_factory: Callable[[Any], str], monkeypatch: pytest.MonkeyPatch) -> StoreConfig:
    for k, v in any_s3.env().items():
        monkeypatch.setenv(k, v)
    for k in ("CKPTVAULT_SLACK_TOKEN", "CKPTVAULT_SLACK_WEBHOOK"):
        monkeypatch.delenv(k, raising=False)  # console only: the test is about the state, not Slack
    return StoreConfig(bucket=bucket_factory(any_s3), endpoint_url=any_s3.url, region=any_s3.region, prefix=PREFIX)


def _keys(cfg: StoreConfig) -> list[str]:
    return stored_state_keys(open_store(cfg), PREFIX)


def test_two_writers_at_once_lose_no_record(store_cfg: StoreConfig) -> None:
    now = time.time()  # dedup records older than the retention are pruned on save: keep them recent
    t = now - 3 * H
    seed = AlertState(stale={f"base-w{w}": Episode(t - H, t, notified=True) for w in range(2)})
    save_alert_state(open_store(store_cfg), PREFIX, seed)
    rounds = 6
    barrier = threading.Barrier(2, timeout=BARRIER_TIMEOUT)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            store = open_store(store_cfg)
            store.capabilities()  # probe first, so both race on the state, not on the probe
            cfg = Config(store=store_cfg)
            for i in range(rounds):
                barrier.wait()  # every round: both load the same stored state and save at once
                if i % 2:
                    # the hooks' path: load, send (dedup records it), merge-save
                    failed = alerts.build("flow_failed", flow=f"flow-w{w}", state="Failed", message=f"error {i}")
                    assert send_alerts(cfg, store, [failed]) == 1
                    continue
                # the watch's path: load, change episodes and dedup records, merge-save
                state = load_alert_state(store, PREFIX)
                state.sent[f"test|w{w}|{i}"] = now + i
                state.stale[f"w{w}-r{i}"] = Episode(t + i, t + i + H)
                if i == 0:
                    del state.stale[f"base-w{w}"]
                    state.closed[f"base-w{w}"] = t - H
                send_alerts(cfg, store, [], state=state)
        except BaseException as e:
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not [e for e in errors if not isinstance(e, threading.BrokenBarrierError)], errors
    assert not errors

    final = load_alert_state(open_store(store_cfg), PREFIX)
    for w in range(2):
        for i in range(0, rounds, 2):
            assert final.sent.get(f"test|w{w}|{i}") == now + i, f"writer {w} round {i}: dedup record lost"
            assert final.stale.get(f"w{w}-r{i}") == Episode(t + i, t + i + H), f"writer {w} round {i}: episode lost"
        for i in range(1, rounds, 2):
            key = alerts.build("flow_failed", flow=f"flow-w{w}", state="Failed", message=f"error {i}").dedup_key()
            assert key in final.sent, f"writer {w} round {i}: delivery record lost"
    assert not {"base-w0", "base-w1"} & set(final.stale), "a closed episode came back"
    assert final.closed == {"base-w0": t - H, "base-w1": t - H}
    assert len(final.stale) == rounds  # 3 per writer, nothing else

    # the next save, alone, folds whatever the race left into one object
    save_alert_state(open_store(store_cfg), PREFIX, AlertState(sent={"later": now}))
    keys = _keys(store_cfg)
    assert len(keys) == 1 and KEY_RE.match(keys[0])
    after = load_alert_state(open_store(store_cfg), PREFIX)
    assert after.sent == {**final.sent, "later": now}
    assert after.stale == final.stale and after.closed == final.closed


def test_a_save_from_an_older_view_keeps_what_was_saved_since(store_cfg: StoreConfig) -> None:
    # the interleaving a race may or may not hit, made certain: B loaded before A saved
    store = open_store(store_cfg)
    now = time.time()
    save_alert_state(store, PREFIX, AlertState(sent={"base": now}, stale={"r": Episode(now - H, now)}))
    a, b = load_alert_state(store, PREFIX), load_alert_state(store, PREFIX)
    a.sent["a"] = now
    del a.stale["r"]
    a.closed["r"] = now - H
    save_alert_state(store, PREFIX, a)
    b.sent["b"] = now
    b.stale["q"] = Episode(now - H, now)
    save_alert_state(store, PREFIX, b)  # b still holds r's episode, and never saw "a"
    assert load_alert_state(store, PREFIX) == AlertState(
        sent={"base": now, "a": now, "b": now}, stale={"q": Episode(now - H, now)}, closed={"r": now - H}
    )
    assert len(_keys(store_cfg)) == 1


def test_the_legacy_state_is_read_then_folded(store_cfg: StoreConfig) -> None:
    store = open_store(store_cfg)
    now = time.time()
    # as an older version wrote it: one object, rewritten in place, no tombstones
    legacy = b'{"schema": "ckptvault.alerts/1", "sent": {"old|r|x": %r}, "stale": {"r": {"newest_at": 1.0, "opened_at": 2.0, "notified": true}}}'  # noqa: E501
    store.put_bytes(f"{PREFIX}/{LEGACY_NAME}", legacy % now, content_type="application/json")
    state = load_alert_state(store, PREFIX)
    assert state == AlertState(sent={"old|r|x": now}, stale={"r": Episode(1.0, 2.0, True)})
    # unchanged state still migrates: the legacy object is replaced by a per-save one
    key = save_alert_state(store, PREFIX, state)
    assert key is not None and KEY_RE.match(key)
    assert _keys(store_cfg) == [key]
    assert load_alert_state(store, PREFIX) == state
    assert save_alert_state(store, PREFIX, state) is None  # nothing new: nothing written
    # an older version still running rewrites the legacy object: read beside the new one, folded again
    store.put_bytes(f"{PREFIX}/{LEGACY_NAME}", legacy.replace(b"old|r|x", b"older|q|y") % now)
    assert set(load_alert_state(store, PREFIX).sent) == {"old|r|x", "older|q|y"}
    save_alert_state(store, PREFIX, AlertState())
    assert len(_keys(store_cfg)) == 1 and not _keys(store_cfg)[0].endswith(LEGACY_NAME)
    assert set(load_alert_state(store, PREFIX).sent) == {"old|r|x", "older|q|y"}


class FoldsDuringRead(S3Store):
    """A reader whose first GET comes after another writer folded (and deleted) what it listed."""

    def __init__(self, cfg: StoreConfig, other: S3Store, extra: AlertState) -> None:
        super().__init__(cfg)
        self.other, self.extra, self.folded = other, extra, False

    def get_bytes(self, key: str) -> bytes:
        if not self.folded:
            self.folded = True
            save_alert_state(self.other, PREFIX, self.extra)
        return super().get_bytes(key)


def test_an_object_folded_away_while_being_read_is_found_again(store_cfg: StoreConfig) -> None:
    now = time.time()
    first = save_alert_state(open_store(store_cfg), PREFIX, AlertState(sent={"a": now}))
    reader = FoldsDuringRead(store_cfg, open_store(store_cfg), AlertState(sent={"b": now}))
    assert load_alert_state(reader, PREFIX).sent == {"a": now, "b": now}
    assert reader.folded and first not in _keys(store_cfg)


def test_an_unreadable_object_is_skipped_and_kept(store_cfg: StoreConfig) -> None:
    store = open_store(store_cfg)
    now = time.time()
    bad = f"{PREFIX}/_state/alerts/{0:020d}-{'0' * 32}.json"
    store.put_bytes(bad, b'{"schema": "ckptvault.alerts/99"}')
    save_alert_state(store, PREFIX, AlertState(sent={"a": now}))
    assert load_alert_state(store, PREFIX).sent == {"a": now}
    save_alert_state(store, PREFIX, AlertState(sent={"b": now}))
    assert bad in _keys(store_cfg)  # maybe a newer version's: never deleted by one that cannot read it
    assert load_alert_state(store, PREFIX).sent == {"a": now, "b": now}
