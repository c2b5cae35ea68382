"""The ckptvault events a flow sent to the test Prefect API (the prefect_api fixture), read back from its
/events/filter: a flow's events are sent by a background worker, so the reader waits for them."""

from __future__ import annotations

import time
from datetime import datetime

from prefect.events import Event


def ckptvault_events(since: datetime, want: int, timeout: float = 30.0) -> list[Event]:
    """The `ckptvault.*` events the API holds that occurred after `since`, oldest first, once at least
    `want` of them are there (or what is there after `timeout`, for the caller's assertion to show)."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter, EventOrder

    deadline = time.monotonic() + timeout
    while True:
        # built each time: `until` defaults to the moment the filter is made
        flt = EventFilter(
            event=EventNameFilter(prefix=["ckptvault."]), occurred=EventOccurredFilter(since=since),
            order=EventOrder.ASC,
        )  # fmt: skip
        with get_client(sync_client=True) as client:
            got = list(client.read_events(filter=flt, limit=50).events)
        if len(got) >= want or time.monotonic() > deadline:
            return got
        time.sleep(0.25)
