"""The process-wide part-buffer budget (ckptvault/store/buffers.py), exercised with real threads."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from ckptvault.store.buffers import PartBuffers, shared
from ckptvault.store.port import TransferConfig

MIB = 1024 * 1024


def test_take_blocks_until_a_buffer_is_given_back() -> None:
    pool = PartBuffers(2 * MIB)
    a, b = pool.take(MIB), pool.take(MIB)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(pool.take(MIB)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not got, "a third buffer was handed out beyond the 2 MiB budget"
    pool.give(a)
    waiter.join(5)
    assert got and got[0] is a, "the given-back buffer is reused, not a new one mapped"
    pool.give(b)
    pool.give(a)
    assert pool.in_use == 0 and pool.peak == 2 * MIB


def test_many_threads_never_exceed_the_budget() -> None:
    pool = PartBuffers(3 * MIB)
    held = 0
    most = 0
    lock = threading.Lock()

    def work(i: int) -> None:
        nonlocal held, most
        buf = pool.take(MIB)
        with lock:
            held += 1
            most = max(most, held)
        buf[0:1] = bytes([i % 256])
        time.sleep(0.002)
        with lock:
            held -= 1
        pool.give(buf)

    with ThreadPoolExecutor(12) as ex:
        list(ex.map(work, range(200)))
    assert most <= 3 and pool.peak <= 3 * MIB
    assert most == 3, "12 threads should have filled the budget at some point"
    assert pool.in_use == 0


def test_a_part_bigger_than_the_budget_still_goes_when_nothing_else_is_in_use() -> None:
    pool = PartBuffers(MIB)
    big = pool.take(4 * MIB)
    assert len(big) == 4 * MIB
    pool.give(big)
    assert pool.in_use == 0


def test_idle_buffers_of_another_size_make_room() -> None:
    pool = PartBuffers(2 * MIB)
    a, b = pool.take(MIB), pool.take(MIB)
    pool.give(a)  # idle 1 MiB buffer kept while b is in use
    c = pool.take(MIB - 4096)  # does not fit beside b and the idle a: a is unmapped to make room
    assert len(c) == MIB - 4096 and pool.in_use == 2 * MIB - 4096
    pool.give(b)
    pool.give(c)
    assert pool.in_use == 0


def test_shared_pool_is_one_per_budget_and_default_budget() -> None:
    assert shared(7 * MIB) is shared(7 * MIB)
    assert TransferConfig(part_size=8 * MIB, multipart_threshold=8 * MIB, max_concurrency=3).budget == 32 * MIB
    with pytest.raises(ValueError, match="must hold at least one part"):
        TransferConfig(part_size=8 * MIB, multipart_threshold=8 * MIB, buffer_budget=MIB)
    with pytest.raises(ValueError, match="positive"):
        PartBuffers(0)


def test_config_rejects_a_budget_smaller_than_one_part() -> None:
    from pydantic import ValidationError

    from ckptvault.config import StoreConfig

    with pytest.raises(ValidationError, match="buffer_mb = 16 cannot hold one part of part_size_mb = 32"):
        StoreConfig(bucket="ckpts", part_size_mb=32, buffer_mb=16)
    assert StoreConfig(bucket="ckpts", part_size_mb=8, buffer_mb=8).buffer_mb == 8
