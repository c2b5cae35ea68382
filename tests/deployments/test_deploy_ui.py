"""The deployments end to end, and the Prefect UI in a real browser.

One module-scoped stack: `infra/local/prefect.sh up` (fresh SQLite, free port), `infra/local/worker.sh up`
(work pool, `prefect deploy --all` of ckptvault_prefect/deployments/prefect.yaml, a process worker), a
config against the session's SeaweedFS with a small synthetic DeepSpeed run. The ingest deployment is run with
`prefect deployment run`, the restore deployment with `run_deployment` and parameters (run, step, dest),
both picked up by the worker. Then headless Chromium (Debian's chromium + chromium-driver, via Selenium)
checks the deployments page and the restore run's page, and saves screenshots.

The browser test needs /usr/bin/chromium and /usr/bin/chromedriver: outside CI it is skipped (with the
reason) when they are absent; in CI (CI=true) .ci/run installs them and their absence fails the test.
Screenshots: a temp dir per session, the final ones copied to artifacts/ui-screenshots/ (gitignored;
CKPTVAULT_SCREENSHOTS_DIR overrides).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault_cli.synthetic import write_checkpoint
from tests import servers
from tests.deployments import local_prefect
from tests.deployments.local_prefect import PrefectServer, page_text, ui_wait
from tests.helpers import write_config

pytestmark = pytest.mark.timeout(900)

MiB = 2**20
# What the Prefect 3.9 UI prints for each schedule of ckptvault_prefect/deployments/prefect.yaml (None: no schedule).
UI_SCHEDULES: dict[str, str | None] = {
    "ingest": "Every 10 minutes",
    "tier": "At 03:30 AM every day",
    "drill": "At 05:00 AM, only on Sunday",
    "watch": "Hourly",
    "replicate": "Hourly",
    "scrub": "At 04:30 AM every day",
    "restore": None,
}
PREFECT_CLI = str(Path(sys.executable).parent / "prefect")
SCREENSHOTS_KEEP = Path(
    os.environ.get("CKPTVAULT_SCREENSHOTS_DIR") or servers.REPO_ROOT / "artifacts" / "ui-screenshots"
)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@dataclass
class Stack:
    server: PrefectServer
    bucket: str
    hot: Path
    dest: Path
    ingest_seconds: float
    restore_run_id: str
    restore_run_name: str
    restore_seconds: float
    timings: dict[str, float]


@pytest.fixture(scope="module")
def stack(seaweedfs: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    timings: dict[str, float] = {}
    local_prefect.reap_stale()
    tmp = tmp_path_factory.mktemp("deploy-ui")
    bucket = servers.unique_bucket_name()
    seaweedfs.client().create_bucket(Bucket=bucket)
    hot = tmp / "hot" / "r"
    hot.mkdir(parents=True)
    for step in (100, 200):
        write_checkpoint(hot, "deepspeed", step, 2 * MiB, seed=step)
    cfg = write_config(
        tmp / "ckptvault.toml",
        seaweedfs,
        bucket,
        [("r", hot, "deepspeed")],
        extra=f'[drill]\nscratch = "{tmp / "scratch"}"\n',
    )

    t0 = time.monotonic()
    server = local_prefect.start_prefect_server()
    timings["prefect server up"] = time.monotonic() - t0
    worker_state: Path | None = None
    try:
        t0 = time.monotonic()
        # The worker's environment is its flow runs' environment: credentials, config, the checkout.
        worker_state = local_prefect.start_worker(
            server,
            {
                **seaweedfs.env(),
                "CKPTVAULT_CONFIG": str(cfg),
                "CKPTVAULT_HOME": str(servers.REPO_ROOT),
                "PREFECT_WORKER_QUERY_SECONDS": "2",
            },
        )
        timings["work pool + deploy --all + worker up"] = time.monotonic() - t0

        # ingest, the way an operator would: the CLI, watched to its end.
        t0 = time.monotonic()
        p = subprocess.run(
            [PREFECT_CLI, "deployment", "run", "ingest/ingest", "--watch", "--watch-timeout", "300"],
            env=server.cli_env(),
            cwd=tmp,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=360,
            check=False,
        )
        ingest_seconds = time.monotonic() - t0
        timings["ingest deployment run"] = ingest_seconds
        assert p.returncode == 0 and "Completed" in p.stdout, f"ingest run failed:\n{p.stdout[-3000:]}\n{p.stderr}"

        # restore, on demand with parameters, through the API (run_deployment waits for a final state).
        from prefect.client.schemas.objects import FlowRun
        from prefect.deployments import run_deployment
        from prefect.settings import PREFECT_API_URL, temporary_settings

        dest = tmp / "restored"
        t0 = time.monotonic()
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            run: FlowRun = run_deployment(  # type: ignore[assignment]  # sync call: a FlowRun, not a coroutine
                "restore/restore",
                parameters={"run": "r", "step": "latest", "dest": str(dest)},
                timeout=300,
                poll_interval=2,
            )
        restore_seconds = time.monotonic() - t0
        timings["restore deployment run"] = restore_seconds
        yield Stack(server, bucket, hot, dest, ingest_seconds, str(run.id), run.name, restore_seconds, timings)
    finally:
        if worker_state is not None:
            local_prefect.stop("worker", worker_state)
        local_prefect.stop("prefect", server.state_dir)
        servers.cleanup_buckets([(seaweedfs, bucket)])
        print("\n" + "\n".join(f"  {k}: {v:.1f} s" for k, v in timings.items()))


def test_deploy_all_creates_seven_scheduled_deployments_on_the_pool(stack: Stack) -> None:
    deployments = {d["name"]: d for d in stack.server.deployments()}
    assert set(deployments) == set(UI_SCHEDULES)
    assert {d["work_pool_name"] for d in deployments.values()} == {"ckptvault"}
    # tier on a queue of its own, for a worker with the tier role's key (`make up`); this test's single worker
    # polls every queue of the pool
    assert {n: d["work_queue_name"] for n, d in deployments.items() if d["work_queue_name"] != "default"} == {
        "tier": "tier"
    }
    sched = {n: [s["schedule"] for s in d["schedules"]] for n, d in deployments.items()}
    assert [s["interval"] for s in sched["ingest"]] == [600.0]
    assert [s["interval"] for s in sched["watch"]] == [3600.0]
    assert [s["interval"] for s in sched["replicate"]] == [3600.0]
    assert [(s["cron"], s["timezone"]) for s in sched["tier"]] == [("30 3 * * *", "UTC")]
    assert [(s["cron"], s["timezone"]) for s in sched["scrub"]] == [("30 4 * * *", "UTC")]
    assert [(s["cron"], s["timezone"]) for s in sched["drill"]] == [("0 5 * * 0", "UTC")]
    assert sched["restore"] == []
    restore_params = deployments["restore"]["parameter_openapi_schema"]["properties"]
    assert {"run", "step", "dest", "tier", "config_path"} <= set(restore_params)
    assert set(deployments["restore"]["parameter_openapi_schema"]["required"]) == {"run", "dest"}
    # The pull step resolves $CKPTVAULT_HOME in the worker's environment at run time, not at deploy time.
    assert deployments["ingest"]["pull_steps"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $CKPTVAULT_HOME }}"}}
    ]


def test_worker_ran_ingest_and_an_on_demand_restore(stack: Stack, seaweedfs: Any) -> None:
    s3 = seaweedfs.client()
    for step in (100, 200):
        s3.head_object(Bucket=stack.bucket, Key=checkpoint_prefix("t", "r", step) + MANIFEST_NAME)
    run = stack.server.flow_run(stack.restore_run_id)
    assert run["state"]["type"] == "COMPLETED", run["state"]
    assert run["parameters"]["step"] == "latest" and run["parameters"]["dest"] == str(stack.dest)
    assert _tree(stack.dest / "global_step200") == _tree(stack.hot / "global_step200")
    assert (stack.dest / "latest").read_text().strip() == "global_step200"
    assert {"restore-estimate", "restore-result"} <= stack.server.artifact_keys(stack.restore_run_id)


# ---------------------------------------------------------------------------------------------- browser


def test_ui_lists_the_deployments_and_shows_the_finished_restore(stack: Stack, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    shots = tmp_path / "screenshots"
    shots.mkdir()
    t0 = time.monotonic()

    def shot(name: str) -> None:
        browser.save_screenshot(str(shots / name))

    ui = stack.server.ui_url
    # 1. The deployments page: seven rows, each with its schedule.
    browser.get(f"{ui}/deployments")

    def rows() -> dict[str, str] | None:
        # A row the UI re-renders while we read it raises StaleElementReference: ui_wait retries the read.
        texts = [tr.text for tr in browser.find_elements(By.CSS_SELECTOR, "tbody tr")]
        found = {t.splitlines()[0]: t for t in texts if t.strip()}
        return found if set(UI_SCHEDULES) <= set(found) else None

    table = ui_wait("the deployments page lists all seven deployments", rows, 60)
    shot("01-deployments.png")
    for name, schedule in UI_SCHEDULES.items():
        row_lines = table[name].splitlines()
        if schedule is None:
            assert not any(s and s in table[name] for s in UI_SCHEDULES.values()), table[name]
        else:
            assert schedule in row_lines, f"{name}: expected schedule {schedule!r} in row {row_lines}"

    # 2. The restore run's page: state Completed, then its artifacts tab.
    browser.get(f"{ui}/runs/flow-run/{stack.restore_run_id}")

    def badge() -> str | None:
        badges = browser.find_elements(By.CSS_SELECTOR, "span.state-badge")
        return badges[0].text if badges and stack.restore_run_name in page_text(browser) else None

    assert ui_wait("the restore run's state badge", badge, 60) == "Completed"
    shot("02-restore-run.png")

    def open_tab(name: str) -> None:
        def click() -> bool:
            tabs = [t for t in browser.find_elements(By.CSS_SELECTOR, ".p-tab") if t.text.strip() == name]
            if not tabs:
                return False
            tabs[0].click()
            return True

        ui_wait(f"the {name} tab on the flow run page", click, 30)

    # The parameters the run was launched with through the API.
    open_tab("Parameters")
    ui_wait("the restore run's parameters", lambda: str(stack.dest) in page_text(browser), 60)
    shot("03-restore-parameters.png")
    open_tab("Artifacts")
    ui_wait(
        "the restore run's artifacts",
        lambda: "restore-estimate" in page_text(browser) and "restore-result" in page_text(browser),
        60,
    )

    def scroll_to_result() -> bool:
        cards = browser.find_elements(By.XPATH, "//*[contains(text(), 'restore-result')]")
        if cards:
            browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", cards[0])
        return bool(cards)

    ui_wait("the restore-result card", scroll_to_result, 30)
    shot("04-restore-artifacts.png")

    # 3. The result artifact itself: the markdown the flow wrote.
    def open_result() -> bool:
        cards = browser.find_elements(By.XPATH, "//*[contains(text(), 'restore-result')]")
        if cards:
            cards[0].click()
        return bool(cards)

    ui_wait("the restore-result card", open_result, 30)
    ui_wait("the restore-result artifact page", lambda: "Restored r step 200" in page_text(browser), 60)
    assert "every CRC32C verified" in page_text(browser)
    shot("05-restore-result.png")

    SCREENSHOTS_KEEP.mkdir(parents=True, exist_ok=True)
    for png in sorted(shots.glob("*.png")):
        assert png.stat().st_size > 10_000, f"{png} looks empty"
        shutil.copy2(png, SCREENSHOTS_KEEP / png.name)
    print(
        f"\nbrowser checks: {time.monotonic() - t0:.1f} s; screenshots in {shots}, copied to {SCREENSHOTS_KEEP}"
        f"\nstack timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in stack.timings.items())
    )
