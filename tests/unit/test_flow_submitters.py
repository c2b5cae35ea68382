"""The flows' submitters on a thread pool task runner (ckptvault_prefect/runtime/restore.py, ingest.py):
the transfer runs on the library's plain threads, no task run per file or per part; on a Dask cluster
every call stays its task (its workers run tasks; a node's files go through its own worker)."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from ckptvault.ingest import steps as ingest_lib
from ckptvault.ingest import uploads
from ckptvault.transfer.submitter import Threads
from ckptvault_prefect.runtime import ingest as ingest_runtime
from ckptvault_prefect.runtime import restore as restore_runtime
from ckptvault_prefect.runtime.submitter import TaskSubmitter
from ckptvault_prefect.tasks.ingest import STEPS
from ckptvault_prefect.tasks.step import direct_mode


class Seen:
    def __init__(self) -> None:
        self.maps: list[tuple[str, Any]] = []
        self.calls: list[str] = []

    def map(self, calls: Any, node: str | None = None) -> list[Any]:
        self.maps.append((calls[0].func.__name__, node))
        return []

    def __call__(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        self.calls.append(fn.__name__)

    def close(self) -> None:
        pass


def test_the_restore_flow_runs_complete_on_plain_threads_unless_on_dask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(restore_runtime, "worker_resources", lambda: None)
    with restore_runtime.restore_submitter(4) as submit:
        assert isinstance(submit, Threads) and not submit.inline
    monkeypatch.setattr(restore_runtime, "worker_resources", lambda: [{"node-0": 1.0}])
    with restore_runtime.restore_submitter(4) as submit:
        assert isinstance(submit, TaskSubmitter)


def test_the_ingest_flow_sends_a_checkpoint_on_threads_and_the_rest_as_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = Seen()
    monkeypatch.setattr(TaskSubmitter, "map", lambda self, calls, node=None: tasks.map(calls, node))
    monkeypatch.setattr(TaskSubmitter, "__call__", lambda self, fn, *a, **kw: tasks(fn, *a, **kw))
    monkeypatch.setattr(TaskSubmitter, "node_workers", lambda self: None)  # a thread pool task runner
    with ingest_runtime.IngestSubmitter() as submit:
        threads = Seen()
        submit._threads = threads  # type: ignore[assignment]
        for fn in (ingest_lib.upload_one, ingest_lib.send_range):
            submit.map([partial(fn, None)])
        submit(ingest_lib.begin_split, None)
        submit(ingest_lib.finish_split, None)
        submit(ingest_lib.commit_manifest, None)
        submit.map([partial(ingest_lib.validate_structure, None)])
        assert threads.maps == [("upload_one", None), ("send_range", None)]
        assert threads.calls == ["begin_split", "finish_split"]
        assert tasks.calls == ["commit_manifest"] and tasks.maps == [("validate_structure", None)]
        # a node-local file goes to its node's worker, whatever the runner
        submit.map([partial(ingest_lib.upload_one, None)], node="node-0")
        assert tasks.maps[-1] == ("upload_one", "node-0")
        with direct_mode(2):  # the command line without an API: its steps are plain calls already
            submit.map([partial(ingest_lib.upload_one, None)])
        assert tasks.maps[-1] == ("upload_one", None) and len(threads.maps) == 2
    # on a Dask cluster (workers to pin to) every upload is a task: the workers run it
    monkeypatch.setattr(TaskSubmitter, "node_workers", lambda self: [{"node-0": 1.0}])
    with ingest_runtime.IngestSubmitter() as submit:
        submit.map([partial(ingest_lib.send_range, None)])
        submit(ingest_lib.begin_split, None)
    assert tasks.maps[-1] == ("send_range", None) and tasks.calls[-1] == "begin_split"


def test_the_transfer_on_threads_is_retried_as_its_tasks_are() -> None:
    # every call of uploads.DATA_PATH is store I/O, retried by the store it is given (retrying.py) on the
    # threads as in its task: neither retries the step around it
    for fn in uploads.DATA_PATH:
        assert STEPS[fn].task.retries == 0, fn.__name__
    assert {ingest_lib.upload_one, ingest_lib.send_range} <= uploads.DATA_PATH
