"""`ckptvault serve`: the seven deployments served from one process, checked against a real Prefect server.

Also: the served deployments and ckptvault_prefect/deployments/prefect.yaml cannot drift apart (serve.py
reads the yaml).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault_cli.synthetic import write_checkpoint
from tests.deployments import local_prefect
from tests.deployments.local_prefect import PrefectServer, wait_for
from tests.helpers import write_config

pytestmark = pytest.mark.timeout(600)

PREFECT_YAML = local_prefect.REPO_ROOT / "ckptvault_prefect" / "deployments" / "prefect.yaml"
NAMES = {"ingest", "tier", "replicate", "scrub", "drill", "watch", "restore"}


def test_served_deployments_match_prefect_yaml() -> None:
    from ckptvault_prefect.deployments.serve import build_deployments

    spec = {d["name"]: d for d in yaml.safe_load(PREFECT_YAML.read_text())["deployments"]}
    assert set(spec) == NAMES
    assert {d["work_pool"]["name"] for d in spec.values()} == {"ckptvault"}
    built = {d.name: d for d in build_deployments("/etc/ckptvault.toml")}
    assert set(built) == NAMES
    for name, d in built.items():
        want = spec[name]
        module, func = want["entrypoint"].rsplit(".", 1)
        assert d.entrypoint and d.entrypoint.endswith(f"{module.replace('.', '/')}.py:{func}"), d.entrypoint
        got = [s.schedule for s in d.schedules or []]
        assert [getattr(s, "interval", None) and s.interval.total_seconds() for s in got] == [
            s.get("interval") for s in want["schedules"]
        ]
        assert [getattr(s, "cron", None) for s in got] == [s.get("cron") for s in want["schedules"]]
        assert d.parameters == {**want["parameters"], "config_path": "/etc/ckptvault.toml"}
    # The yaml's schedules, as operators read them.
    assert spec["ingest"]["schedules"] == [{"interval": 600}]
    assert spec["watch"]["schedules"] == [{"interval": 3600}]
    assert spec["replicate"]["schedules"] == [{"interval": 3600}]
    assert spec["replicate"]["parameters"] == {} and spec["replicate"]["concurrency_limit"] == 1
    assert "work_queue_name" not in spec["replicate"]["work_pool"]  # the default queue: its role needs no delete
    # daily: a seventh of the saves each time (the rotation's default sample), every save within a week
    assert spec["scrub"]["schedules"] == [{"cron": "30 4 * * *", "timezone": "UTC"}]
    assert spec["scrub"]["parameters"] == {} and spec["scrub"]["concurrency_limit"] == 1
    assert "work_queue_name" not in spec["scrub"]["work_pool"]  # it never deletes: the default queue
    assert spec["tier"]["schedules"][0]["cron"] == "30 3 * * *"
    assert spec["drill"]["schedules"][0]["cron"] == "0 5 * * 0"
    assert spec["restore"]["schedules"] == []


def test_serve_polls_for_runs_every_second_unless_the_operator_chose() -> None:
    """Prefect's 10 s poll would be the whole of a hook's margin (issue [T]: upload + 10 s): serve asks
    every second, and an interval the operator chose (environment, profile, or any source saying other
    than Prefect's 10) is left to Prefect."""
    from ckptvault_prefect.deployments.serve import SERVE_POLL_SECONDS, poll_seconds

    assert SERVE_POLL_SECONDS <= 1.0
    assert poll_seconds({}, 10.0, False) == SERVE_POLL_SECONDS
    assert poll_seconds({"PREFECT_RUNNER_POLL_FREQUENCY": "5"}, 5.0, False) is None
    assert poll_seconds({"PREFECT_RUNNER_POLL_FREQUENCY": " "}, 10.0, False) == SERVE_POLL_SECONDS
    assert poll_seconds({}, 10.0, True) is None  # `prefect config set` in the active profile, even to 10
    assert poll_seconds({}, 30.0, False) is None  # prefect.toml, .env, pyproject
    assert poll_seconds({}) in (SERVE_POLL_SECONDS, None)  # read from this process's Prefect settings


def test_the_ingest_deployment_is_triggered_by_a_hooks_event_for_its_run_and_step() -> None:
    """The trigger prefect.yaml gives the ingest deployment: it parses as `prefect deploy` and `serve`
    read it, expects the event the hooks send, matches its resource, and its parameter templates render
    from that event (as the automation's RunDeployment action renders them) into the run and an int step."""
    from prefect.events import Event
    from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger
    from prefect.server.events.actions import RunDeployment
    from prefect.utilities.schema_tools.hydration import HydrationContext, hydrate

    from ckptvault.hooks.signal import EVENT, Saved, event_body
    from ckptvault_prefect.deployments.serve import build_deployments

    spec = {d["name"]: d for d in yaml.safe_load(PREFECT_YAML.read_text())["deployments"]}
    assert [t["expect"] for t in spec["ingest"]["triggers"]] == [[EVENT]]
    assert all("triggers" not in spec[name] for name in NAMES - {"ingest"})
    (trigger,) = {d.name: d for d in build_deployments()}["ingest"].triggers
    assert isinstance(trigger, DeploymentEventTrigger) and trigger.expect == {EVENT}
    # the hook's JSON as Prefect's own Event: the trigger's templates are rendered against one
    words = "torch=2.9.1+cu128 torch.cuda=12.8"
    event = Event.model_validate(event_body(Saved("llama-a", 400, "/ckpt/checkpoint-400", None, "auto", words)))
    assert trigger.match.matches(event.resource)
    params = dict(trigger.parameters or {})
    RunDeployment._upgrade_v1_templates(params)
    rendered = hydrate(params, HydrationContext(render_jinja=True, jinja_context={"event": event}, raise_on_error=True))
    assert rendered == {"run": "llama-a", "step": 400, "written_by": words}
    # an event from a hook before it reported versions: no payload key, the parameter renders empty
    older = event_body(Saved("llama-a", 400, "/ckpt/checkpoint-400"))
    del older["payload"]["written_by"]
    context = {"event": Event.model_validate(older)}
    rendered = hydrate(params, HydrationContext(render_jinja=True, jinja_context=context, raise_on_error=True))
    assert rendered == {"run": "llama-a", "step": 400, "written_by": ""}


@pytest.fixture
def prefect_server() -> Iterator[PrefectServer]:
    local_prefect.reap_stale()
    # The hook test below queues 4 triggered ingests on the deployment's concurrency limit of 1: a queued run
    # is retried every this many seconds (Prefect's default 30), which only lengthens the test (bench/rpo.py
    # measures the defaults)
    server = local_prefect.start_prefect_server(PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS="2")
    try:
        yield server
    finally:
        local_prefect.stop("prefect", server.state_dir)


def _stop_group(proc: subprocess.Popen[str], timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_ckptvault_serve_registers_and_runs_the_seven_deployments_and_the_ingest_trigger(
    prefect_server: PrefectServer, seaweedfs: Any, bucket_factory: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    bucket = bucket_factory(seaweedfs)
    hot = tmp_path / "hot"
    hot.mkdir()
    write_checkpoint(hot, "hf", 10, 1 << 20)
    lt = tmp_path / "lt"
    # The Lightning run's source (below): Lightning has no commit marker, so even a step named by the hook
    # waits settle_seconds; 1 s is shorter than any event -> trigger -> flow run start, so the triggered
    # ingest finds it settled (with a longer settle_seconds it would wait: docs/hooks.md "Not yet")
    lt_source = f'[[sources]]\nrun = "lt"\npath = "{lt}"\nformat = "lightning"\nsettle_seconds = 1\n'
    # The Hugging Face run's: its commit marker (trainer_state.json) is the proof, so a step its hook names
    # skips a settle time longer than the test; nothing but the hook's named steps can archive it here.
    hf = tmp_path / "hf"
    hf_source = f'\n[[sources]]\nrun = "hf"\npath = "{hf}"\nformat = "hf"\nsettle_seconds = 3600\n'
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", hot, "hf")], extra=lt_source + hf_source)
    log = tmp_path / "serve.log"
    # serve's own 1 s poll for runs to start (not Prefect's 10 s): the shipped default, run end to end
    env = prefect_server.cli_env(**seaweedfs.env(), PREFECT_HOME=str(tmp_path / "home"))
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "ckptvault"), "--config", str(cfg), "serve"],
            env=env,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: flow-run children are stopped with it
        )
    try:

        def registered() -> dict[str, dict[str, Any]] | None:
            if proc.poll() is not None:
                raise AssertionError(f"ckptvault serve exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            ds = {d["name"]: d for d in prefect_server.deployments()}
            ok = set(ds) == NAMES and all(
                not d["paused"] and d["parameters"].get("config_path") == str(cfg) for d in ds.values()
            )
            return ds if ok else None

        deployments = wait_for("ckptvault serve registers seven deployments", registered, 120)
        print(f"\nserve: seven deployments registered after {time.monotonic() - t0:.1f} s")
        scheds = {n: [s["schedule"] for s in d["schedules"]] for n, d in deployments.items()}
        assert scheds["ingest"][0]["interval"] == 600 and scheds["watch"][0]["interval"] == 3600
        assert scheds["tier"][0]["cron"] == "30 3 * * *" and scheds["drill"][0]["cron"] == "0 5 * * 0"
        assert scheds["replicate"][0]["interval"] == 3600 and scheds["restore"] == []
        assert scheds["scrub"][0]["cron"] == "30 4 * * *"

        # A run of the served ingest deployment executes in the serve process (no worker, no pool).
        t1 = time.monotonic()
        _, state = prefect_server.run_deployment(deployments["ingest"]["id"], 240)
        assert state["type"] == "COMPLETED", f"{state}\n{log.read_text()[-3000:]}"
        print(f"serve: ingest run completed in {time.monotonic() - t1:.1f} s")
        # its flow runs forked from the warm process (warm_start.py; test_warm_start.py shows what it holds)
        assert "flow runs start from a warm process" in log.read_text(), log.read_text()[-3000:]
        seaweedfs.client().head_object(Bucket=bucket, Key=checkpoint_prefix("t", "r", 10) + MANIFEST_NAME)

        # A hook's event (sent by the hook's own code) starts a run of the served ingest deployment for
        # that run and step, through the trigger prefect.yaml gives it: the checkpoint is committed.
        from ckptvault.hooks.signal import Saved, send_event

        path = write_checkpoint(hot, "hf", 20, 1 << 20)
        t2 = time.monotonic()
        send_event(Saved("r", 20, str(path)), {"PREFECT_API_URL": prefect_server.api_url})

        def triggered() -> dict[str, Any] | None:
            runs = prefect_server.post(
                "/flow_runs/filter", {"deployments": {"id": {"any_": [deployments["ingest"]["id"]]}}}
            )
            done = [r for r in runs if r["parameters"].get("step") == 20 and r["state"]["type"] == "COMPLETED"]
            return done[0] if done else None

        run = wait_for("the event's ingest run completes", triggered, 240)
        print(f"serve: the event's ingest run completed {time.monotonic() - t2:.1f} s after the event")
        assert run["parameters"] == {"config_path": str(cfg), "run": "r", "step": 20, "written_by": ""}
        seaweedfs.client().head_object(Bucket=bucket, Key=checkpoint_prefix("t", "r", 20) + MANIFEST_NAME)

        _frameworks_with_the_hook(
            prefect_server, seaweedfs, bucket, deployments["ingest"]["id"], {"lt": lt, "hf": hf}, monkeypatch
        )
    finally:
        _stop_group(proc, 60)
    # On SIGTERM serve pauses its schedules: nothing piles up as Late while no process serves them.
    assert all(d["paused"] for d in prefect_server.deployments())


def _frameworks_with_the_hook(
    prefect_server: PrefectServer,
    seaweedfs: Any,
    bucket: str,
    deployment: str,
    roots: dict[str, Path],
    mp: pytest.MonkeyPatch,
) -> None:
    """[T]'s Done-when on a real Prefect server: a real Lightning (run `lt`) and a real Hugging Face
    Trainer (run `hf`) training run, side by side, each with ckptvault's hook, whose events (the hook's
    own, sent from the training process) start the served ingest deployment for each step through its
    trigger, while no scheduled ingest runs. Every saved step ends verified in the catalog; the seconds
    from each save to its manifest's commit (the verified event's rpo_seconds) and its upload_seconds are
    printed, not asserted (bench/rpo.py --modes hook-prefect measures them)."""
    from ckptvault.catalog import Catalog
    from ckptvault.config import StoreConfig
    from ckptvault.store import open_store
    from tests.frameworks.conftest import write_run

    t0 = time.time()
    env = {"PREFECT_API_URL": prefect_server.api_url, "CKPTVAULT_HOOK_SIGNAL": "event", **seaweedfs.env()}
    fws = {"lt": "lightning", "hf": "hf"}
    # both at once (two writer processes): the two trainings' seconds overlap instead of adding up
    with ThreadPoolExecutor(2) as pool:
        done = [
            pool.submit(
                write_run, fws[run], roots[run], "--steps", "4", "--every", "2", "--ckptvault-run", run, env=env
            )
            for run in fws
        ]
        for f in done:
            f.result()
    saved = sorted(roots["lt"].rglob("*step=*.ckpt"))
    assert [p.name for p in saved] == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"], saved
    assert sorted(p.name for p in roots["hf"].glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    for k, v in seaweedfs.env().items():  # the catalog read below: the store's credentials
        mp.setenv(k, v)
    store = open_store(StoreConfig(bucket=bucket, endpoint_url=seaweedfs.url, region=seaweedfs.region))

    def ingest_runs() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = prefect_server.post(
            "/flow_runs/filter", {"deployments": {"id": {"any_": [deployment]}}}
        )
        return got

    def verified() -> dict[str, dict[int, Any]] | None:
        # the triggered flow runs completed (they write the verified event, then finish) and the events are there
        runs = ingest_runs()
        got: dict[str, dict[int, Any]] = {}
        for run in fws:
            done = [r for r in runs if r["parameters"].get("run") == run and r["state"]["type"] == "COMPLETED"]
            if sorted(r["parameters"]["step"] for r in done) != [2, 4]:
                return None
            got[run] = {e.step: e for e in Catalog(store, "t").events(run) if e.event == "verified"}
            if set(got[run]) != {2, 4}:
                return None
        return got

    events = wait_for("the Lightning and HF runs' steps 2 and 4 verified by triggered ingests", verified, 300)
    runs = ingest_runs()
    # nothing else ingested meanwhile: every ingest run since training began is one of the hook's, one a save
    later = [r for r in runs if r["created"] and _epoch(r["created"]) >= t0]
    assert sorted((r["parameters"].get("run"), r["parameters"].get("step")) for r in later) == [
        ("hf", 2),
        ("hf", 4),
        ("lt", 2),
        ("lt", 4),
    ], later
    from importlib.metadata import version

    for run, by_step in events.items():
        details = {s: json.loads(e.detail) for s, e in sorted(by_step.items())}
        # what the training process reported with each save's event, recorded beside what the files say
        framework = {"lt": "lightning", "hf": "transformers"}[run]
        for d in details.values():
            assert d["written_by"]["torch"] == version("torch"), d.get("written_by")
            assert d["written_by"][framework] == version(framework), d.get("written_by")
        times = {s: (d["rpo_seconds"], d.get("upload_seconds")) for s, d in details.items()}
        print(f"serve: {fws[run]} with the hook, save -> verified manifest (rpo_seconds, upload_seconds): {times}")


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
