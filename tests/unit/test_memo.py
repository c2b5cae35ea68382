"""What one command reads once (ckptvault/command/memo.py): inside `memo.command()` (the command line's every
command) the config, a store's bucket probe and its lifecycle check are made once, so the flow run in
the command's own process does not repeat them; outside it (a deployment's flow run in a worker, a flow
called from Python) every read is made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ckptvault.command import memo
from ckptvault.config import parse_config
from ckptvault.store import StoreError
from ckptvault.store.memory import MemoryStore

STORE = '[store]\nbucket = "ckpts"\nendpoint_url = "http://127.0.0.1:9"\n'


class Counted(MemoryStore):
    def __init__(self, seen: dict[str, int], fail: bool = False) -> None:
        super().__init__("ckpts")
        self.seen, self.fail = seen, fail

    def check_bucket(self) -> None:
        self.seen["probe"] = self.seen.get("probe", 0) + 1
        if self.fail:
            raise StoreError("bucket ckpts does not exist")

    def get_lifecycle(self) -> Any:
        self.seen["lifecycle"] = self.seen.get("lifecycle", 0) + 1
        return super().get_lifecycle()


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counts: dict[str, int] = {}
    monkeypatch.setattr("ckptvault.store.open_store", lambda cfg: Counted(counts, counts.get("fail", 0) > 0))
    return counts


def test_the_config_is_parsed_once_per_command_and_again_once_edited(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(STORE)
    assert memo.load_config(str(path)) is not memo.load_config(str(path))  # outside a command: every time
    with memo.command():
        first = memo.load_config(str(path))
        assert memo.load_config(str(path)) is first
        path.write_text(STORE + 'prefix = "other"\n')  # edited (another size, another mtime): read again
        edited = memo.load_config(str(path))
        assert edited is not first and edited.store.prefix == "other"
    with memo.command():  # a new command reads it anew
        assert memo.load_config(str(path)) is not edited


def test_a_bucket_is_probed_once_per_command_and_identity(
    seen: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = parse_config(STORE).store
    memo.checked_store(cfg)
    memo.checked_store(cfg)
    assert seen["probe"] == 2  # outside a command (a deployment's flow run): probed each time
    with memo.command():
        store = memo.checked_store(cfg)
        assert memo.checked_store(cfg) is store and seen["probe"] == 3
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "someone-else")  # other credentials: probed for them
        assert memo.checked_store(cfg) is not store and seen["probe"] == 4
        other = parse_config(STORE.replace("ckpts", "other")).store
        memo.checked_store(other)
        assert seen["probe"] == 5
        monkeypatch.setattr(memo, "MAX_AGE_S", 0.0)  # `follow`, a command of days: probed again in time
        memo.checked_store(cfg)
        assert seen["probe"] == 6


def test_a_failed_probe_is_not_remembered(seen: dict[str, int]) -> None:
    cfg = parse_config(STORE).store
    seen["fail"] = 1
    with memo.command():
        for _ in range(2):
            with pytest.raises(StoreError):
                memo.checked_store(cfg)
        assert seen["probe"] == 2
        seen["fail"] = 0
        memo.checked_store(cfg)
        assert seen["probe"] == 3


def test_the_lifecycle_rule_is_checked_once_per_command(seen: dict[str, int]) -> None:
    cfg = parse_config(STORE).store
    store = Counted(seen)
    with memo.command():
        assert memo.ensure_abort_rule(store, cfg) is True  # the rule was missing: written
        assert memo.ensure_abort_rule(store, cfg) is False and seen["lifecycle"] == 1  # not read again
        assert store.get_lifecycle(), "the rule is in the bucket"
    seen["lifecycle"] = 0
    assert memo.ensure_abort_rule(store, cfg) is False and memo.ensure_abort_rule(store, cfg) is False
    assert seen["lifecycle"] == 2  # outside a command: read every time
    assert not memo.active()


def test_a_read_is_remembered_once_per_command_and_key_for_a_short_while(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []

    def read(what: str) -> list[str]:
        reads.append(what)
        return [what]

    key = ("kind", memo.Same(object()), "r")
    assert memo.remembered(key, lambda: read("a")) is not memo.remembered(key, lambda: read("a"))
    assert len(reads) == 2  # outside a command (a deployment's flow run): read each time
    with memo.command():
        first = memo.remembered(key, lambda: read("a"))
        assert memo.remembered(key, lambda: read("a")) is first and len(reads) == 3
        memo.remembered((*key[:2], "q"), lambda: read("a"))  # another key part: read anew
        memo.remembered(("kind", memo.Same(object()), "r"), lambda: read("a"))  # another object, however equal
        assert len(reads) == 5
        monkeypatch.setattr(memo, "READ_MAX_AGE_S", 0.0)  # too old: read again
        assert memo.remembered(key, lambda: read("a")) is not first and len(reads) == 6
    with memo.command():  # a new command reads anew
        memo.remembered(key, lambda: read("a"))
        assert len(reads) == 7


def test_a_failed_read_is_not_remembered_nor_one_outliving_its_command() -> None:
    calls = [0]

    def failing() -> int:
        calls[0] += 1
        raise StoreError("connection refused")

    key = ("kind", "k")
    with memo.command():
        for _ in range(2):
            with pytest.raises(StoreError):
                memo.remembered(key, failing)
        assert calls[0] == 2  # the failure was read again
        assert memo.remembered(key, lambda: 1) == 1 and memo.remembered(key, lambda: 2) == 1
    # a read started in one command and ending in the next (a survey thread outliving an exit 2)
    first, second = memo.command(), memo.command()
    first.__enter__()

    def read_across() -> int:
        first.__exit__(None, None, None)
        second.__enter__()
        return 3

    try:
        assert memo.remembered(key, read_across) == 3
        assert memo.remembered(key, lambda: 4) == 4  # the new command read it itself
    finally:
        second.__exit__(None, None, None)
    assert not memo.active()
