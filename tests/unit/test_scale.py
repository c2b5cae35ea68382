"""Which task runner an ingest pass gets: [scale], the flags, their precedence, and the refusals."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ckptvault.config import ConfigError, ScaleConfig, parse_config, parse_dask_address
from ckptvault_prefect.runtime.scale import RunnerChoice, RunnerChoiceError, choose_runner, for_restore

API = "http://127.0.0.1:4200/api"
BASE = '[store]\nbucket = "ckpts"\n'


def _scale(text: str) -> ScaleConfig:
    return parse_config(BASE + "[scale]\n" + text).scale


def test_no_scale_section_and_no_flag_keeps_the_flows_thread_pool() -> None:
    choice = choose_runner(parse_config(BASE).scale, address_flag=None, workers_flag=None, api_url=API)
    assert choice == RunnerChoice("threads", "default")
    assert not choice.needs_prefect


def test_config_address_runs_on_that_cluster_with_its_timeout() -> None:
    scale = _scale('dask_address = "tcp://dask-scheduler:8786"\nconnect_timeout_seconds = 3\n')
    choice = choose_runner(scale, address_flag=None, workers_flag=None, api_url=API)
    assert (choice.kind, choice.address) == ("cluster", "tcp://dask-scheduler:8786")
    assert choice.origin == "[scale] dask_address"
    assert choice.connect_timeout == 3 and choice.needs_prefect


@pytest.mark.parametrize(("api", "processes"), [(API, True), (None, False), ("", False)])
def test_local_workers_are_processes_only_with_a_prefect_server(api: str | None, processes: bool) -> None:
    choice = choose_runner(_scale("local_workers = 3\n"), address_flag=None, workers_flag=None, api_url=api)
    assert (choice.kind, choice.workers, choice.processes) == ("local", 3, processes)
    assert choice.origin == "[scale] local_workers"


def test_a_flag_wins_over_the_whole_section() -> None:
    cluster = _scale('dask_address = "tcp://10.0.0.5:8786"\n')
    local = choose_runner(cluster, address_flag=None, workers_flag=2, api_url=API)
    assert (local.kind, local.workers, local.origin) == ("local", 2, "--dask-workers")
    local_cfg = _scale("local_workers = 4\n")
    other = choose_runner(local_cfg, address_flag="tcp://127.0.0.1:9786", workers_flag=None, api_url=API)
    assert (other.kind, other.address, other.origin) == ("cluster", "tcp://127.0.0.1:9786", "--dask-address")


def test_both_flags_are_refused_naming_both() -> None:
    with pytest.raises(RunnerChoiceError, match="--dask-address and --dask-workers"):
        choose_runner(ScaleConfig(), address_flag="tcp://h:8786", workers_flag=2, api_url=API)


def test_a_cluster_without_a_prefect_server_is_refused_with_the_fix() -> None:
    with pytest.raises(RunnerChoiceError, match=r"tcp://h:8786.*PREFECT_API_URL.*--dask-workers"):
        choose_runner(ScaleConfig(), address_flag="tcp://h:8786", workers_flag=None, api_url=None)


def test_zero_dask_workers_flag_is_refused() -> None:
    with pytest.raises(RunnerChoiceError, match="--dask-workers 0"):
        choose_runner(ScaleConfig(), address_flag=None, workers_flag=0, api_url=API)


@pytest.mark.parametrize(
    "bad", ["dask-scheduler:8786", "http://h:8786", "tcp://h", "tcp://:8786", "tcp://h:port", "tcp://h:70000"]
)
def test_bad_addresses_are_refused_in_the_config_and_on_the_flag(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"scale\.dask_address") as e:
        _scale(f'dask_address = "{bad}"\n')
    assert "tcp://" in str(e.value)
    with pytest.raises(RunnerChoiceError, match="--dask-address"):
        choose_runner(ScaleConfig(), address_flag=bad, workers_flag=None, api_url=API)


def test_addresses_are_normalised() -> None:
    assert parse_dask_address(" tcp://h:08786 ") == "tcp://h:8786"
    assert parse_dask_address("tls://[::1]:8786") == "tls://[::1]:8786"


def test_both_keys_in_the_config_are_refused() -> None:
    with pytest.raises(ConfigError, match="keep one of them"):
        _scale('dask_address = "tcp://h:8786"\nlocal_workers = 2\n')


def test_unknown_scale_key_names_it() -> None:
    with pytest.raises(ConfigError, match=r"scale\.workers: unknown key"):
        _scale("workers = 2\n")


def _cluster(origin: str) -> RunnerChoice:
    return RunnerChoice("cluster", origin, address="tcp://10.0.0.5:8786")


@pytest.mark.parametrize("missing", ["distributed", "prefect_dask"])
@pytest.mark.parametrize(
    ("scale", "address_flag", "workers_flag", "origin"),
    [
        ("", "tcp://10.0.0.5:8786", None, "--dask-address"),
        ("", None, 2, "--dask-workers"),
        ('dask_address = "tcp://10.0.0.5:8786"\n', None, None, "[scale] dask_address"),
        ("local_workers = 2\n", None, None, "[scale] local_workers"),
    ],
)
def test_a_dask_runner_without_the_dask_extra_names_what_asked_and_the_install(
    monkeypatch: pytest.MonkeyPatch, missing: str, scale: str, address_flag: str | None, workers_flag: int | None,
    origin: str,
) -> None:  # fmt: skip
    monkeypatch.setitem(sys.modules, missing, None)  # None: `import` raises ModuleNotFoundError, as uninstalled
    with pytest.raises(RunnerChoiceError) as e:
        choose_runner(_scale(scale), address_flag=address_flag, workers_flag=workers_flag, api_url=API)
    assert str(e.value).startswith(f"{origin} runs the work on Dask, which this environment cannot import (")
    assert missing in str(e.value) and "pip install 'ckptvault[dask]'" in str(e.value)
    # the default runner never needs Dask
    assert choose_runner(_scale(""), address_flag=None, workers_flag=None, api_url=API).kind == "threads"


def test_a_restore_runs_on_the_cluster_when_every_worker_sees_the_destination() -> None:
    choice = _cluster("[scale] dask_address")
    assert for_restore(choice, [], Path("/pfs/restore")) is choice


def test_a_restore_on_a_named_cluster_whose_workers_do_not_see_the_destination_is_refused() -> None:
    with pytest.raises(RunnerChoiceError) as e:
        for_restore(_cluster("--dask-address"), ["node-1", "node-3"], Path("/scratch/me"))
    msg = str(e.value)
    assert "node-1, node-3" in msg and "/scratch/me" in msg and "tcp://10.0.0.5:8786" in msg
    assert "--dask-workers N" in msg  # the way to restore anyway


def test_a_restore_under_scale_whose_cluster_does_not_see_the_destination_runs_from_this_host() -> None:
    # [scale] was set for ingest: a restore to a local directory still works, and says why it is local
    chosen = for_restore(_cluster("[scale] dask_address"), ["node-0"], Path("/home/me/ckpt"))
    assert chosen.kind == "threads" and not chosen.needs_prefect
    assert "node-0" in chosen.origin and "/home/me/ckpt" in chosen.origin
