"""Checkpoints written by the real frameworks (tests/frameworks/writers.py), in each one's default
directory layout: found with format = "auto" and by name, uploaded to SeaweedFS by `ckptvault ingest`,
validated without a warning, recorded with the versions that wrote it, restored, drilled (every file
load-checked, nothing failing), and resumed by the framework itself from the restored directory, tensor
for tensor as from the original. And the framework's own in-progress states are never uploaded, and are
once the save is finished."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checkpoint.manifest import MANIFEST_NAME, VALIDATION_NAME, checkpoint_prefix
from ckptvault.ingest.discovery import discover
from ckptvault_cli.main import main
from tests.frameworks import missing, need
from tests.frameworks.conftest import REPO, write_run, writer
from tests.helpers import write_config


@dataclass(frozen=True)
class Spec:
    fmt: str
    steps: tuple[int, ...]  # the steps the writer saves (6 steps, every 2; Orbax also saves step 1)
    local: Callable[[Path, int], Path]  # the checkpoint of a step under the run root the writer made
    resume_from: Callable[[Path, int], Path]  # what the framework resumes from, under a run root or restore dest
    checks: tuple[str, ...]  # lines the drill's load check must report for the newest checkpoint


def _lightning_ckpt(root: Path, step: int) -> Path:
    return root / "lightning_logs" / "version_0" / "checkpoints" / f"epoch=0-step={step}.ckpt"


SPECS = {
    "hf": Spec(
        "hf", (2, 4, 6), lambda r, s: r / f"checkpoint-{s}", lambda r, s: r / f"checkpoint-{s}",
        ("model.safetensors: safetensors: every tensor read", "optimizer.pt: zip CRCs; torch.load(weights_only=True)",
         "training_args.bin: zip CRCs; torch.load(weights_only=True): it refuses "
         "transformers.training_args.TrainingArguments, so its pickle opcodes were read, not executed",
         "trainer_state.json: JSON parsed"),
    ),
    "hf-sharded": Spec(
        "hf", (2, 4, 6), lambda r, s: r / f"checkpoint-{s}", lambda r, s: r / f"checkpoint-{s}",
        ("model-00001-of-00002.safetensors: safetensors: every tensor read",
         "model-00002-of-00002.safetensors: safetensors: every tensor read",
         "model.safetensors.index.json: JSON parsed"),
    ),
    "lightning": Spec(
        "lightning", (2, 4, 6), _lightning_ckpt,
        lambda r, s: _lightning_ckpt(r, s) if (r / "lightning_logs").exists() else r / f"epoch=0-step={s}.ckpt",
        ("epoch=0-step=6.ckpt: zip CRCs; torch.load(weights_only=True)",),
    ),
    "dcp": Spec(
        "dcp", (2, 4, 6), lambda r, s: r / "checkpoint" / f"step-{s}",
        lambda r, s: r / "checkpoint" / f"step-{s}" if (r / "checkpoint").exists() else r / f"step-{s}",
        ("./: .metadata and 1 .distcp file(s): metadata unpickled with only DCP's metadata classes allowed; "
         "16 tensors loaded into empty tensors by torch.distributed.checkpoint.load (no process group); "
         "13 non-tensor entries read as torch.save zips with weights_only=True",),
    ),
    "orbax": Spec(
        "orbax", (1, 2, 4, 6), lambda r, s: r / str(s), lambda r, s: r,
        ("default/: Orbax item restored with orbax.checkpoint.StandardCheckpointer: 9 arrays",
         "_CHECKPOINT_METADATA: JSON parsed"),
    ),
    "deepspeed": Spec(
        "deepspeed", (2, 4, 6), lambda r, s: r / f"global_step{s}", lambda r, s: r,
        ("mp_rank_00_model_states.pt: zip CRCs; torch.load(weights_only=True)",
         "zero_pp_rank_0_mp_rank_00_optim_states.pt: zip CRCs; torch.load(weights_only=True): it refuses"),
    ),
    "megatron": Spec(
        "megatron", (2, 4, 6), lambda r, s: r / f"iter_{s:07d}", lambda r, s: r,
        ("./: .metadata and 2 .distcp file(s): metadata unpickled with only DCP's metadata classes allowed; "
         "12 tensors loaded into empty tensors by torch.distributed.checkpoint.load (no process group)",
         "common.pt: zip CRCs; torch.load(weights_only=True)", "metadata.json: JSON parsed"),
    ),
}  # fmt: skip
NEWEST = 6
RESUME_TO = 8
# examples/'s resume checks (docs/drills.md, "Resume check"), run as `[drill] verify_command` on the saves this
# file's own ingest archived: a framework with one here has `drill --verify-only` run on its newest save.
EXAMPLES = {"hf": "resume_check_hf.py", "lightning": "resume_check_lightning.py", "dcp": "resume_check_dcp.py"}


def _env(monkeypatch: pytest.MonkeyPatch, endpoint: Any) -> None:
    for k, v in endpoint.env().items():
        monkeypatch.setenv(k, v)


def _config(tmp_path: Path, endpoint: Any, bucket: str, root: Path, fmt: str) -> Path:
    return write_config(tmp_path / f"c-{fmt}.toml", endpoint, bucket, [("r", root, fmt)], extra=_extra(tmp_path))


def _extra(tmp_path: Path, drill: str = "") -> str:
    return f'[drill]\nscratch = "{tmp_path / "scratch"}"\nsample = 10\n{drill}[validation]\nisolate = false\n'


def _ls(cfg: Path, capsys: pytest.CaptureFixture[str]) -> dict[int, dict[str, Any]]:
    capsys.readouterr()
    assert main(["--config", str(cfg), "ls", "--json"]) == 0
    return {r["step"]: r for r in json.loads(capsys.readouterr().out)}


def _tree(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _stored(endpoint: Any, bucket: str, step: int) -> list[str]:
    got = endpoint.client().list_objects_v2(Bucket=bucket, Prefix=checkpoint_prefix("t", "r", step))
    return sorted(o["Key"].rsplit("/", 1)[-1] for o in got.get("Contents", []))


def _validation(endpoint: Any, bucket: str, step: int) -> dict[str, Any]:
    key = checkpoint_prefix("t", "r", step) + VALIDATION_NAME
    doc: dict[str, Any] = json.loads(endpoint.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    return doc


def _tensors(path: Path) -> dict[str, Any]:
    torch = need("torch")
    state: dict[str, Any] = torch.load(path, weights_only=True)
    return state


def _assert_same_tensors(a: dict[str, Any], b: dict[str, Any], what: str) -> None:
    torch = need("torch")
    assert sorted(a) == sorted(b), f"{what}: different entries"
    assert a, f"{what}: nothing loaded"
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{what}: {len(different)} tensors differ, e.g. {different[:3]}"


def _written_by(fw: str) -> dict[str, str]:
    if fw in ("hf", "hf-sharded"):
        return {"transformers": version("transformers")}
    if fw == "lightning":
        return {"pytorch-lightning": version("lightning")}  # writers.py trains with the `lightning` package
    if fw == "deepspeed":
        return {"deepspeed": version("deepspeed")}
    from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION

    if fw == "dcp":
        return {"torch.dcp": CURRENT_DCP_VERSION}
    if fw == "megatron":
        from megatron.core.dist_checkpointing.core import CheckpointingConfig

        default = next(
            f.default for f in dataclasses.fields(CheckpointingConfig) if f.name == "sharded_backend_version"
        )
        return {"megatron-core.torch_dist": str(default), "torch.dcp": CURRENT_DCP_VERSION}
    return {}  # Orbax records none


# --- found with format = "auto" and by name --------------------------------------------------------------


@pytest.mark.parametrize("fw", sorted(SPECS))
@pytest.mark.parametrize("fmt", ["auto", "by-name"])
def test_default_layout_is_found(framework_run: Callable[[str], Path], fw: str, fmt: str) -> None:
    spec = SPECS[fw]
    root = framework_run(fw)
    result = discover("r", root, "auto" if fmt == "auto" else spec.fmt, 0, time.time() + 1)
    assert result.problems == []
    assert [(f.step, f.format, f.ready, f.path) for f in result.found] == [
        (s, spec.fmt, True, spec.local(root, s)) for s in spec.steps
    ]


# --- uploaded, validated, restored, drilled, resumed --------------------------------------------------


@pytest.mark.parametrize("fw", sorted(SPECS))
def test_uploaded_restored_drilled_and_resumed_by_the_framework(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, framework_run: Callable[[str], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fw: str,
) -> None:  # fmt: skip
    spec = SPECS[fw]
    root = framework_run(fw)
    _env(monkeypatch, seaweedfs)
    bucket = bucket_factory(seaweedfs)
    cfg = _config(tmp_path, seaweedfs, bucket, root, "auto")
    assert main(["--config", str(cfg), "ingest"]) == 0
    rows = _ls(cfg, capsys)
    assert {s: (r["state"], r["format"]) for s, r in rows.items()} == dict.fromkeys(spec.steps, ("verified", spec.fmt))
    # what wrote each save: the versions the checkpoint records are the installed frameworks' own
    # (docs/FORMAT.md, "What wrote a save"); Orbax records none
    assert {s: r["written_by"] for s, r in rows.items()} == dict.fromkeys(spec.steps, _written_by(fw))
    # and `catalog stats` groups the saves by it: every save under each version it records
    capsys.readouterr()
    assert main(["--config", str(cfg), "catalog", "stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert [(w["writer"], w["version"], w["checkpoints"]) for w in stats["by_writer"]] == [
        (k, v, len(spec.steps)) for k, v in sorted(_written_by(fw).items())
    ]
    assert stats["writer_unrecorded"] == (len(spec.steps) if not _written_by(fw) else 0)

    # a healthy run passes every gate without a warning (Orbax's file count changes from step to step)
    for step in spec.steps:
        report = _validation(seaweedfs, bucket, step)
        assert not report["warned"] and not report["blocked"], report
    later = _validation(seaweedfs, bucket, spec.steps[-1])
    shape = next(r for r in later["results"] if r["rule"] == "shape")
    assert shape["verdict"] == "pass", shape
    loss = next(r for r in later["results"] if r["rule"] == "loss_finite")
    # the formats that record a loss (Lightning: ModelCheckpoint(monitor="train_loss") in writers.py)
    assert (loss["verdict"] == "pass") == (spec.fmt in ("hf", "orbax", "lightning")), loss

    if spec.fmt == "orbax":  # one StandardSave item holds params and optimizer together: no part to take
        capsys.readouterr()
        refused = tmp_path / "part"
        assert main(["--config", str(cfg), "restore", "r", "--only", "model", "--dest", str(refused)]) == 2
        said = capsys.readouterr().err
        assert "orbax" in said and "default" in said and "Traceback" not in said, said
        assert not refused.exists()

    dest = tmp_path / "restored"
    assert main(["--config", str(cfg), "restore", "r", "--dest", str(dest)]) == 0
    newest = spec.local(root, NEWEST)
    assert _tree(dest / newest.name) == _tree(newest)

    capsys.readouterr()
    assert main(["--config", str(cfg), "drill", "--json"]) == 0, capsys.readouterr()
    report = json.loads(capsys.readouterr().out)
    assert sorted((r["step"], r["ok"], r["problems"], r["not_run"]) for r in report["drilled"]) == [
        (s, True, [], []) for s in spec.steps
    ]
    checks = next(r["checks"] for r in report["drilled"] if r["step"] == NEWEST)
    for expected in spec.checks:
        assert any(c.startswith(expected) for c in checks), f"{expected!r} not among\n" + "\n".join(checks)
    assert not list((tmp_path / "scratch").glob("*")), "the drill left scratch data"
    if fw in EXAMPLES:
        _example_resume_check(seaweedfs, bucket, root, tmp_path, capsys, fw)

    # the framework resumes from the restored directory exactly as from the original
    runs = {}
    for name, base in (("original", root), ("restored", dest)):
        out = tmp_path / f"resume-{name}"
        got = writer("resume", fw, str(spec.resume_from(base, NEWEST)), str(out), "--steps", str(RESUME_TO))
        assert (got["resumed_at"], got["first_step"], got["ended_at"]) == (NEWEST, NEWEST + 1, RESUME_TO), got
        runs[name] = out
    _assert_same_tensors(_tensors(runs["original"] / "loaded.pt"), _tensors(runs["restored"] / "loaded.pt"), "loaded")
    _assert_same_tensors(_tensors(runs["original"] / "final.pt"), _tensors(runs["restored"] / "final.pt"), "final")
    loaded, final = _tensors(runs["restored"] / "loaded.pt"), _tensors(runs["restored"] / "final.pt")
    torch = need("torch")
    assert any(not torch.equal(loaded[k], final[k]) for k in loaded), "training on changed nothing"
    if spec.fmt == "hf":  # the weights the Trainer resumed with are the checkpoint's own
        from safetensors.torch import load_file

        saved: dict[str, Any] = {}
        for shard in sorted(newest.glob("*.safetensors")):
            saved.update(load_file(shard))
        for name, tensor in saved.items():
            assert torch.equal(loaded[f"model.{name}"], tensor), name


def _verify_only(cfg: Path, run: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["--config", str(cfg), "drill", "--verify-only", run, "--step", str(NEWEST), "--json"])
    out = capsys.readouterr()
    assert code in (0, 1) and out.out.startswith("{"), (code, out.err[-3000:])
    (row,) = json.loads(out.out)["drilled"]
    return code, row


def _fresh_hf_optimizer(ours: Path, bad: Path) -> str:
    """A copy of HF save `ours` at `bad` whose optimizer.pt is a freshly built AdamW's: state empty, its
    param_groups (learning rate, betas, the parameters' indices) kept. The file the load check names."""
    shutil.copytree(ours, bad)
    torch = need("torch")
    optimizer = torch.load(bad / "optimizer.pt", weights_only=True)
    assert optimizer["state"], "the save's optimizer state is already empty"
    torch.save({**optimizer, "state": {}}, bad / "optimizer.pt")
    return "optimizer.pt"


def _fresh_lightning_optimizer(ours: Path, bad: Path) -> str:
    """A copy of Lightning's .ckpt `ours` at `bad` with every `optimizer_states` entry a freshly built
    AdamW's: state empty, param_groups kept; the weights, loops and callbacks' state as saved."""
    torch = need("torch")
    ckpt = torch.load(ours, map_location="cpu", weights_only=True)  # a Lightning .ckpt holds plain types
    assert ckpt["optimizer_states"] and all(o["state"] for o in ckpt["optimizer_states"]), "already empty"
    ckpt["optimizer_states"] = [{**o, "state": {}} for o in ckpt["optimizer_states"]]
    bad.parent.mkdir(parents=True)
    torch.save(ckpt, bad)
    return bad.name


# What "resumes as if from scratch" archives, per framework whose example's check is run on it: the save
# `ours` copied to `bad` with its optimizer state replaced by a freshly built AdamW's; returns the file
# holding it, as the drill's load check names it.
FRESH_OPTIMIZER: dict[str, Callable[[Path, Path], str]] = {
    "hf": _fresh_hf_optimizer,
    "lightning": _fresh_lightning_optimizer,
}


def _example_resume_check(
    endpoint: Any, bucket: str, root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fw: str
) -> None:
    """examples/'s resume check for `fw`, as `[drill] verify_command`, passes on the newest archived save: the
    framework resumed it at its step with its optimizer state, and the fixed batch's loss after the resumed
    steps is within the tolerance of its own reference. For HF and Lightning, the same save with the optimizer
    state of a freshly built AdamW (state empty, param_groups kept: what "resumes as if from scratch" archives)
    passes every tensor-load check and fails the resume check: the checkpoint failed (exit 1), marked suspect."""
    spec = SPECS[fw]
    command = json.dumps([sys.executable, str(REPO / "examples" / EXAMPLES[fw]), "{dest}", "{step}"])
    drill = f'verify_command = {command}\nverify_env = {{ HF_HUB_OFFLINE = "1" }}\nverify_timeout_seconds = 600\n'
    sources = [("r", root, "auto")]
    cfg = write_config(tmp_path / "c-verify.toml", endpoint, bucket, sources, extra=_extra(tmp_path, drill))
    code, row = _verify_only(cfg, "r", capsys)
    v = row["verify"]
    assert code == 0 and row["ok"] and v["outcome"] == "passed" and v["exit"] == 0, row
    assert f"at step {NEWEST} and trained" in v["stdout_tail"], v
    metric = v["metric"]
    assert metric["name"] == "loss" and metric["source"] == "command" and metric["within"], metric
    if fw not in FRESH_OPTIMIZER:
        return
    ours = spec.local(root, NEWEST)
    bad_root = tmp_path / "bad-root"
    bad = bad_root / ours.relative_to(root)
    optimizer_file = FRESH_OPTIMIZER[fw](ours, bad)
    sources = [("r", root, "auto"), ("bad", bad_root, "auto")]
    cfg = write_config(tmp_path / "c-bad.toml", endpoint, bucket, sources, extra=_extra(tmp_path, drill))
    assert main(["--config", str(cfg), "ingest"]) == 0
    code, row = _verify_only(cfg, "bad", capsys)
    v = row["verify"]
    assert code == 1 and v["outcome"] == "failed" and v["exit"] == 1, row
    assert row["problems"] == ["verify failed: exit 1: the checkpoint failed the check"], row
    assert "the optimizer state did not load: AdamW's state is empty" in v["stderr_tail"], v
    assert any(c.startswith(f"{optimizer_file}: zip CRCs; torch.load(weights_only=True)") for c in row["checks"]), row
    assert row["not_run"] == [], row
    capsys.readouterr()
    assert main(["--config", str(cfg), "ls", "--json"]) == 0
    states = {r["run"]: r["state"] for r in json.loads(capsys.readouterr().out) if r["step"] == NEWEST}
    assert states == {"bad": "suspect", "r": "verified"}, states


# `make venv-other`'s second environment: .venv's packages with another transformers (the Makefile says how).
OTHER_PYTHON = REPO / ".venv" / "other" / "bin" / "python"
OTHER_TRANSFORMERS = "5.24.0"


def test_drill_python_resumes_a_real_hf_save_in_both_environments(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, framework_run: Callable[[str], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """`drill --python` with a real second environment (the same torch, another transformers): the load
    checks and examples/resume_check_hf.py (as `["{python}", ...]`) run on the newest HF Trainer save in
    each, both pass, and each result names the transformers it loaded with."""
    if not OTHER_PYTHON.exists():
        missing(f"{OTHER_PYTHON} is missing: `make venv-other` builds it (`make test` does, before the suite)")
    root = framework_run("hf")
    _env(monkeypatch, seaweedfs)
    bucket = bucket_factory(seaweedfs)
    check = ["{python}", str(REPO / "examples" / EXAMPLES["hf"]), "{dest}", "{step}"]
    drill = f'verify_command = {json.dumps(check)}\nverify_env = {{ HF_HUB_OFFLINE = "1" }}\n'
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "auto")], extra=_extra(tmp_path, drill))
    assert main(["--config", str(cfg), "ingest"]) == 0
    capsys.readouterr()
    args = ["drill", "--verify-only", "r", "--step", str(NEWEST), "--python", str(OTHER_PYTHON), "--json"]
    code = main(["--config", str(cfg), *args])
    out = capsys.readouterr()
    assert out.out.startswith("{"), (code, out.err[-3000:])
    (row,) = json.loads(out.out)["drilled"]
    there = row["other"]
    assert code == 0 and row["ok"] and row["compared"] == "both_pass" and not row["format_rot"], row
    assert there["python"] == str(OTHER_PYTHON) and there["ok"] and not there["error"], there
    # each environment ran the resume check itself, with its own interpreter, to the end
    for where, result in (("here", row), ("there", there)):
        v = result["verify"]
        assert v["outcome"] == "passed" and v["exit"] == 0, (where, v)
        assert f"at step {NEWEST} and trained" in v["stdout_tail"] and v["metric"]["within"], (where, v)
    assert row["verify"]["command"][0] == sys.executable, row["verify"]
    assert there["verify"]["command"][0] == str(OTHER_PYTHON), there["verify"]
    # the same files checked in each, every check passed (ok above); how a pickle was read may differ: a
    # torch.load(weights_only=True) allows numpy's globals only in a process where something registered them
    # (this test process imported transformers, the other interpreter's fresh child did not), and otherwise
    # its opcodes are read instead, which passes the same
    def files(checks: list[str]) -> list[str]:
        return [c.split(":", 1)[0] for c in checks]

    assert files(there["checks"]) == files(row["checks"]) and there["not_run"] == [] == row["not_run"], there
    # the versions each loaded with: the same torch, the two transformers
    here_with, there_with = row["loaded_with"], there["loaded_with"]
    assert here_with["transformers"] == version("transformers") != OTHER_TRANSFORMERS, here_with
    assert there_with["transformers"] == OTHER_TRANSFORMERS, there_with
    assert there_with["torch"] == here_with["torch"] == version("torch"), (here_with, there_with)


@pytest.mark.parametrize("fw", ["hf", "lightning", "dcp", "orbax", "deepspeed", "megatron"])
def test_explicit_format_name_uploads_and_restores(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, framework_run: Callable[[str], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fw: str,
) -> None:  # fmt: skip
    spec = SPECS[fw]
    root = framework_run(fw)
    _env(monkeypatch, seaweedfs)
    bucket = bucket_factory(seaweedfs)
    cfg = _config(tmp_path, seaweedfs, bucket, root, spec.fmt)
    assert main(["--config", str(cfg), "ingest"]) == 0
    assert sorted(_ls(cfg, capsys)) == list(spec.steps)
    dest = tmp_path / "restored"
    assert main(["--config", str(cfg), "restore", "r", "--step", str(spec.steps[0]), "--dest", str(dest)]) == 0
    first = spec.local(root, spec.steps[0])
    assert _tree(dest / first.name) == _tree(first)


# --- the frameworks' own in-progress states -------------------------------------------------------------


@pytest.fixture
def other_fs_tmpdir(tmp_path: Path) -> Iterator[Path]:
    """A TMPDIR on another file system than tmp_path, so that Lightning's _atomic_save copies (and can
    be killed mid-copy) instead of renaming."""
    for candidate in (Path("/dev/shm"), Path("/run"), Path("/var/tmp"), Path("/tmp")):
        ok = candidate.is_dir() and os.access(candidate, os.W_OK)
        if ok and candidate.stat().st_dev != tmp_path.stat().st_dev:
            d = Path(tempfile.mkdtemp(prefix="ckptvault-lightning-", dir=candidate))
            yield d
            shutil.rmtree(d, ignore_errors=True)
            return
    pytest.fail(f"no writable directory on another file system than {tmp_path} (tried /dev/shm, /run, /var/tmp, /tmp)")


IN_PROGRESS = {
    # framework: (what the killed save leaves, the reason discovery gives)
    "hf": ("checkpoint-6 without trainer_state.json", "no trainer_state.json yet"),
    "dcp": ("step-6 with its .distcp and no .metadata", "no .metadata yet"),
    "orbax": ("6.orbax-checkpoint-tmp", "temporary name"),
    "lightning": ("epoch=0-step=6.ckpt cut at half its size, under its final name", "not a readable zip yet"),
}


@pytest.mark.parametrize("fw", sorted(IN_PROGRESS))
def test_a_save_killed_by_the_framework_is_not_uploaded_until_it_is_finished(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest, fw: str,
) -> None:  # fmt: skip
    spec = SPECS[fw]
    root = tmp_path / "root"
    root.mkdir()
    env = {"TMPDIR": str(request.getfixturevalue("other_fs_tmpdir"))} if fw == "lightning" else None
    write_run(fw, root, "--kill-at-last", env=env, expect_kill=True)
    leftover, reason = IN_PROGRESS[fw]
    if fw == "orbax":
        assert (root / "6.orbax-checkpoint-tmp").is_dir() and not (root / "6").exists(), leftover
    elif fw == "lightning":
        ckpt = spec.local(root, NEWEST)
        assert 0 < ckpt.stat().st_size < spec.local(root, 4).stat().st_size, leftover
    else:
        assert spec.local(root, NEWEST).is_dir(), leftover

    _env(monkeypatch, seaweedfs)
    bucket = bucket_factory(seaweedfs)
    cfg = _config(tmp_path, seaweedfs, bucket, root, "auto")
    capsys.readouterr()
    assert main(["--config", str(cfg), "ingest"]) == 0
    out = capsys.readouterr().out
    assert sorted(_ls(cfg, capsys)) == [s for s in spec.steps if s != NEWEST]
    assert _stored(seaweedfs, bucket, NEWEST) == [], "an unfinished save was uploaded"
    found = discover("r", root, "auto", 0, time.time() + 1).found
    [unfinished] = [f for f in found if f.step == NEWEST]
    assert not unfinished.ready and reason in unfinished.reason, (unfinished, out)

    # the job restarts from step 4 and saves step 6 again, to the end
    write_run(fw, root, "--resume-step", "4", env=env)
    assert main(["--config", str(cfg), "ingest"]) == 0
    rows = _ls(cfg, capsys)
    assert sorted(rows) == list(spec.steps) and rows[NEWEST]["state"] == "verified"
    assert MANIFEST_NAME in _stored(seaweedfs, bucket, NEWEST)
    # what was uploaded is the finished save: for Lightning the restarted job's new logger version
    [finished] = [f for f in discover("r", root, "auto", 0, time.time() + 1).found if f.step == NEWEST]
    assert finished.ready
    if fw == "lightning":
        assert finished.path == root / "lightning_logs" / "version_1" / "checkpoints" / "epoch=0-step=6.ckpt"
    else:
        assert finished.path == spec.local(root, NEWEST)
    dest = tmp_path / "restored"
    assert main(["--config", str(cfg), "restore", "r", "--dest", str(dest)]) == 0
    assert _tree(dest / finished.path.name) == _tree(finished.path)
