"""The `ckptvault` command line on a real store: ls, quarantine and accept, and what it imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config

MiB = 2**20


def test_quarantine_then_accept_then_upload(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    root.mkdir()
    for step in (100, 200, 300, 400):
        write_checkpoint(root, "deepspeed", step, 4 * MiB, seed=step)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "deepspeed")])
    assert main(["--config", str(cfg), "ingest"]) == 0
    # a checkpoint half the size of its history: the size gate blocks it
    write_checkpoint(root, "deepspeed", 500, 2 * MiB, seed=5)
    assert main(["--config", str(cfg), "ingest"]) == 1
    capsys.readouterr()
    assert main(["--config", str(cfg), "ls", "--state", "invalid", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["run"], r["step"], r["state"]) for r in rows] == [("r", 500, "invalid")]
    assert {"run", "step", "format", "state", "bytes", "files", "storage_class", "uploaded_at"} <= set(rows[0])
    client = seaweedfs.client()
    validation = json.loads(client.get_object(Bucket=bucket, Key="t/r/step-0000000500/_VALIDATION.json")["Body"].read())
    assert "size_band" in json.dumps(validation)
    assert "Contents" not in client.list_objects_v2(Bucket=bucket, Prefix="t/r/step-0000000500/_MANIFEST")
    # accepting something that is not quarantined is refused, naming the state
    assert main(["--config", str(cfg), "accept", "r", "400", "--reason", "x"]) == 2
    assert main(["--config", str(cfg), "accept", "r", "500", "--reason", "reviewed: smaller optimizer"]) == 0
    assert main(["--config", str(cfg), "ingest"]) == 0
    capsys.readouterr()
    assert main(["--config", str(cfg), "ls", "--run", "r", "--json"]) == 0
    states = {r["step"]: r["state"] for r in json.loads(capsys.readouterr().out)}
    assert states == {100: "verified", 200: "verified", 300: "verified", 400: "verified", 500: "verified"}


def test_read_commands_import_neither_great_expectations_prefect_torch_nor_pandas(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path
) -> None:
    bucket = bucket_factory(seaweedfs)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [])
    code = (
        "import sys\nfrom ckptvault_cli.main import main\n"
        "for argv in (['--version'], ['--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit as e:\n        assert e.code in (0, None), e.code\n"
        f"assert main(['--config', {str(cfg)!r}, 'ls']) == 0\n"
        f"assert main(['--config', {str(cfg)!r}, 'ls', '--run', 'r', '--json']) == 0\n"
        f"assert main(['--config', {str(cfg)!r}, 'catalog', 'stats']) == 0\n"
        f"assert main(['--config', {str(cfg)!r}, 'plan']) == 0\n"
        # issue [V]: the read commands import only what they use
        "heavy = [m for m in ('great_expectations', 'prefect', 'torch', 'pandas') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **seaweedfs.env()},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no checkpoints in the catalog" in proc.stdout
    # `ls --run R --json` alone, in a process of its own: a client from botocore without boto3 (nor its
    # s3transfer and multiprocessing), no alert channels while nothing is unreadable, no manifests
    code = (
        "import sys\nfrom ckptvault_cli.main import main\n"
        f"assert main(['--config', {str(cfg)!r}, 'ls', '--run', 'r', '--json']) == 0\n"
        "unused = ('great_expectations', 'prefect', 'torch', 'pandas', 'boto3', 's3transfer', 'multiprocessing',\n"
        "          'slack_sdk', 'ckptvault.alerts', 'ckptvault.checkpoint.manifest', 'ckptvault.restore',\n"
        "          'ckptvault.ingest')\n"
        "assert 'botocore' in sys.modules and 'pyarrow' in sys.modules\n"
        "heavy = [m for m in unused if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **seaweedfs.env()},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_ingest_without_a_prefect_api_imports_no_prefect(seaweedfs: Any, bucket_factory: Any, tmp_path: Path) -> None:
    """Issue [W]: direct mode runs the ingest flow's body (ckptvault_prefect/flows/ingest_body.py), not
    the flow: Prefect's import (1-3 s) is off the command's start. The gates still run (in their child,
    started as soon as the config is read) and the save is committed."""
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    root.mkdir()
    write_checkpoint(root, "deepspeed", 100, 2 * MiB, seed=1)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "deepspeed")])
    code = (
        "import sys\nfrom ckptvault_cli.main import main\n"
        f"assert main(['--config', {str(cfg)!r}, 'ingest', '--json']) == 0\n"
        "from ckptvault.ingest import quality_child\n"
        "assert quality_child.last_child, 'the gates did not run in their child'\n"
        "assert 'prefect' not in sys.modules, sorted(m for m in sys.modules if m.startswith('prefect'))[:5]\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "CKPTVAULT_PREFECT")}
    proc = subprocess.run([sys.executable, "-c", code], env={**env, **seaweedfs.env()},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [(o["run"], o["step"], o["ok"]) for o in json.loads(proc.stdout)["outcomes"]] == [("r", 100, True)]
    keys = seaweedfs.client().list_objects_v2(Bucket=bucket, Prefix="t/r/step-0000000100/_MANIFEST")
    assert keys.get("KeyCount", 0) == 1, "the save was not committed"


@pytest.mark.parametrize(
    "text,needle",
    [
        ("[store]\nbucket = 'ckpts'\nbukcet = 'x'\n", "store.bukcet: unknown key"),
        ("[store]\nbucket = 'ckpts'\npart_size_mb = 'big'\n", "store.part_size_mb"),
        (
            "[store]\nbucket = 'ckpts'\n[[sources]]\nrun = 'r'\npath = '/nonexistent/run'\n",
            "/nonexistent/run does not exist",
        ),
        ("[store\nbucket = 'ckpts'\n", "not valid TOML"),
    ],
)
def test_config_errors_exit_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: str
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    assert main(["--config", str(cfg), "ingest"]) == 2
    assert needle in capsys.readouterr().err


def test_global_options_before_or_after_the_subcommand_and_help_on_every_argument(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    import argparse

    from ckptvault import __version__
    from ckptvault_cli.main import build_parser

    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket_factory(seaweedfs), [])
    for argv in (["--config", str(cfg), "ls", "--json"], ["ls", "--config", str(cfg), "--json"]):
        capsys.readouterr()
        assert main(argv) == 0, argv
        assert json.loads(capsys.readouterr().out) == []
    # the subcommand's --config wins over the global one (the one typed last, nearest the command)
    assert main(["--config", str(tmp_path / "nope.toml"), "ls", "--config", str(cfg)]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"ckptvault {__version__}"

    def undocumented(p: argparse.ArgumentParser, path: str) -> list[str]:
        out = []
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, child in a.choices.items():
                    out += undocumented(child, f"{path} {name}")
            elif not isinstance(a, argparse._HelpAction) and not a.help:
                out.append(f"{path} {a.dest}")
        return out

    assert undocumented(build_parser(), "ckptvault") == []


def test_every_reporting_command_prints_one_json_document(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """With --json, stdout is exactly one JSON document (the flow's own prints go to stderr, as its log)."""
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    root = tmp_path / "hot"
    for step in (100, 200):
        write_checkpoint(root, "deepspeed", step, 1 * MiB, seed=step)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket_factory(seaweedfs), [("r", root, "deepspeed")])
    cfg.write_text(cfg.read_text() + "[validation]\nenabled = false\n")

    def doc(*argv: str, rc: int = 0) -> Any:
        capsys.readouterr()
        assert main(["--config", str(cfg), *argv, "--json"]) == rc, argv
        return json.loads(capsys.readouterr().out)

    ingested = doc("ingest")
    assert ingested["ok"] is True
    assert [(o["step"], o["save"], o["result"]) for o in ingested["outcomes"]] == [
        (100, 1, "uploaded"),
        (200, 1, "uploaded"),
    ]
    assert [o["result"] for o in doc("ingest")["outcomes"]] == ["present", "present"]
    restored = doc("restore", "r", "--dest", str(tmp_path / "dest"))
    assert (restored["status"], restored["step"], restored["save"]) == ("restored", 200, 1)
    assert restored["estimate_detail"]["objects"] == 3 and restored["estimate_detail"]["frozen_objects"] == 0
    assert set(doc("watch")) >= {"alerts", "monthly_usd"}
    assert doc("tier")["applied"] is False
    rebuilt = doc("catalog", "rebuild")
    assert (rebuilt["saves_found"], rebuilt["superseded"], rebuilt["written"]) == (2, 0, False)


def test_plan_prints_the_run_by_class_table_and_its_json(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from ckptvault.catalog import Catalog, Event
    from ckptvault.config import load_config
    from ckptvault.store import open_store

    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    policy = '[policy]\nkeep_hot = 1\ntiers = [{ after_days = 7, tier = "warm" }]\n'
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket_factory(seaweedfs), [], extra=policy)
    old = 1_600_000_000.0  # years ago: due for every tier
    Catalog(open_store(load_config(str(cfg)).store), "t").append(
        [
            Event(
                run, step, "verified", old + step, bytes=50 * 2**30, files=4, storage_class="STANDARD", created_at=old
            )
            for run in ("a", "b")
            for step in (1, 2, 3, 4, 5)
        ]
    )
    capsys.readouterr()
    assert main(["--config", str(cfg), "plan"]) == 0
    text = capsys.readouterr().out
    assert "RUN" in text and "CLASS" in text and "$/MONTH NOW" in text and "on the parallel file system instead" in text
    capsys.readouterr()
    assert main(["--config", str(cfg), "plan", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {(r["run"], r["class"]) for r in doc["cost"]} >= {("a", "STANDARD"), ("b", "STANDARD")}
    assert doc["usd_month_after"] < doc["usd_month_before"] < doc["hot_fs_usd_month"]
    assert {a["kind"] for a in doc["actions"]} >= {"keep", "transition"}
