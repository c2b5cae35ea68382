"""The drill's resume check (ckptvault/restore/verify.py, docs/drills.md "Resume check"): its decisions as
pure functions (placeholders, environment, outcome, metric), its configuration's errors, what a drill
records of each outcome, and `run` against real processes (tiny Python scripts) on this machine."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ckptvault.catalog import Event, fold
from ckptvault.config import (
    ConfigError,
    VerifyCommandError,
    check_verify_command,
    parse_config,
    verify_placeholders_in,
)
from ckptvault.errors import InvalidArgumentError
from ckptvault.restore import verify
from ckptvault.restore.drill import DrillReport, DrillResult, coverage, one_save, render_markdown
from ckptvault.restore.verify import FAILED, PASSED, VERIFY_ERROR, Settings

BASE = "[store]\nbucket = 'ckpts'\n"


# --- placeholders ------------------------------------------------------------------------------------------


def test_placeholders_are_found_and_literal_braces_kept() -> None:
    assert verify_placeholders_in("--ckpt={dest}/x-{step}") == ["dest", "step"]
    assert verify_placeholders_in("{{not}} {run}") == ["run"]
    assert verify.expand(["py", "{{x}}", "{dest}:{save}"], {"dest": Path("/s/c"), "save": 2}) == ["py", "{x}", "/s/c:2"]


@pytest.mark.parametrize("arg", ["{dset}", "{dest!r}", "{step:05d}", "{", "x}", "{0}"])
def test_an_unknown_or_formatted_placeholder_is_refused_naming_the_known_ones(arg: str) -> None:
    with pytest.raises(VerifyCommandError) as e:
        check_verify_command(["python", arg])
    assert arg in str(e.value)
    if "{" in arg and "}" in arg:
        assert "{metrics_json}" in str(e.value)


def test_an_empty_command_is_refused() -> None:
    with pytest.raises(VerifyCommandError, match="empty"):
        check_verify_command([])
    with pytest.raises(VerifyCommandError, match="program"):
        check_verify_command([" ", "x"])


# --- the environment ---------------------------------------------------------------------------------------


def test_the_environment_is_built_from_scratch_and_credentials_pass_only_by_name() -> None:
    mine = {"PATH": "/bin", "HOME": "/h", "LANG": "C.UTF-8", "AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s",
            "CKPTVAULT_SLACK_TOKEN": "xoxb", "PYTHONPATH": "/repo", "TOKEN": "t"}  # fmt: skip
    env = verify.build_env(mine, {"HF_HOME": "/data/hf", "MY_KEY": "${AWS_ACCESS_KEY_ID}", "GONE": "${UNSET}"})
    assert env == {"PATH": "/bin", "HOME": "/h", "LANG": "C.UTF-8", "HF_HOME": "/data/hf", "MY_KEY": "AKIA"}
    assert verify.build_env(mine, {"PATH": "/opt/venv/bin"})["PATH"] == "/opt/venv/bin"


# --- the outcome -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "timed_out", "fail_codes", "outcome", "said"),
    [
        (0, False, (1,), PASSED, "exit 0"),
        (1, False, (1,), FAILED, "exit 1: the checkpoint failed"),
        (10, False, (1, 10), FAILED, "exit 10"),
        (1, False, (10,), VERIFY_ERROR, "neither 0 (passed) nor a verify_fail_codes code (10)"),
        (3, False, (1,), VERIFY_ERROR, "exit 3"),
        (137, False, (1,), VERIFY_ERROR, "128 + SIGKILL"),
        (-signal.SIGKILL, False, (1,), VERIFY_ERROR, "SIGKILL (the out-of-memory killer's signal)"),
        (-signal.SIGSEGV, False, (1,), VERIFY_ERROR, "killed by SIGSEGV"),
        (None, True, (1,), VERIFY_ERROR, "timed out after 30 s; its process group was killed"),
        (None, False, (1,), VERIFY_ERROR, "did not start"),
    ],
)
def test_each_end_is_classified(
    code: int | None, timed_out: bool, fail_codes: tuple[int, ...], outcome: str, said: str
) -> None:
    got, why = verify.classify(code, timed_out=timed_out, fail_codes=fail_codes, timeout=30)
    assert got == outcome and said in why, why


# --- the metric --------------------------------------------------------------------------------------------


def test_only_a_last_line_that_is_a_json_object_counts() -> None:
    assert verify.last_json_object('step 1\n{"loss": 2.0}\n\n') == {"loss": 2.0}
    assert verify.last_json_object('{"loss": 2.0}\ndone\n') is None
    assert verify.last_json_object("[1, 2]") is None and verify.last_json_object("") is None


def test_the_metric_is_compared_relative_to_the_recorded_value() -> None:
    recorded = {"loss": 2.0}
    near = verify.compare_metric({"loss": 2.09}, "loss", recorded, 0.05)
    far = verify.compare_metric({"loss": 2.11}, "loss", recorded, 0.05)
    assert near is not None and near.within is True and near.source == "manifest"
    assert far is not None and far.within is False
    assert "2.11 against 2 recorded in the manifest" in far.describe() and "OUTSIDE" in far.describe()
    own = verify.compare_metric({"loss": 5.0, "reference": 5.1}, "loss", recorded, 0.05)
    assert own is not None and own.within is True and own.source == "command"
    nothing = verify.compare_metric({"loss": 1.0}, "loss", {}, 0.05)
    assert nothing is not None and nothing.within is None and "recorded no loss" in nothing.describe()
    assert verify.compare_metric({"eval_loss": 1.0}, "loss", recorded, 0.05) is None
    assert verify.compare_metric({"loss": "2.0"}, "loss", recorded, 0.05) is None
    bad = verify.compare_metric({"loss": float("nan")}, "loss", recorded, 0.05)
    assert bad is not None and bad.within is False
    zero = verify.compare_metric({"loss": 0.0}, "loss", {"loss": 0.0}, 0.0)
    assert zero is not None and zero.within is True


def test_a_pass_outside_the_tolerance_fails_the_checkpoint_and_prints_both() -> None:
    kw = {"timed_out": False, "fail_codes": (1,), "metric": "loss", "tolerance": 0.1, "recorded": {"loss": 2.0}}
    outcome, why, check = verify.decide(0, stdout='{"loss": 3.0}\n', **kw)  # type: ignore[arg-type]
    assert outcome == FAILED and "loss 3 against 2" in why and check is not None
    outcome, why, _ = verify.decide(0, stdout='{"loss": 2.1}\n', **kw)  # type: ignore[arg-type]
    assert outcome == PASSED and "loss 2.1 against 2" in why and "within" in why
    # a command that broke decides nothing by what it printed
    outcome, _, _ = verify.decide(3, stdout='{"loss": 2.0}\n', **kw)  # type: ignore[arg-type]
    assert outcome == VERIFY_ERROR


def test_tails_are_bounded_and_marked() -> None:
    assert verify.tail(b"abc") == "abc"
    cut = verify.tail(b"x" * 10_000 + b"END", 100)
    assert cut.startswith("[...] ") and cut.endswith("END") and len(cut) == 106


# --- the configuration -------------------------------------------------------------------------------------


def test_the_verify_keys_and_a_sources_own_command() -> None:
    cfg = parse_config(BASE + "[[sources]]\nrun = 'a'\npath = '/x'\nverify_command = ['own', '{dest}']\n"
                       "[[sources]]\nrun = 'b'\npath = '/y'\n"
                       "[drill]\nverify_command = ['python', 'check.py', '{dest}', '{metrics_json}']\n"
                       "verify_timeout_seconds = 60\nverify_env = { HF_HOME = '/hf' }\n"
                       "verify_fail_codes = [10, 1]\nverify_tolerance = 0.2\n")  # fmt: skip
    a, b, c = (verify.settings_for(cfg, r) for r in ("a", "b", "gone"))
    assert a is not None and a.command == ("own", "{dest}")
    assert b is not None and b.command == ("python", "check.py", "{dest}", "{metrics_json}") and b == c
    assert (b.timeout_seconds, dict(b.env or {}), b.fail_codes, b.metric, b.tolerance) == (
        60, {"HF_HOME": "/hf"}, (1, 10), "loss", 0.2)  # fmt: skip
    assert verify.settings_for(parse_config(BASE), "a") is None


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ("[drill]\nverify_command = 'python check.py {dest}'\n", "drill.verify_command: write the command as a list"),
        ("[drill]\nverify_command = []\n", "drill.verify_command: the command is empty"),
        ("[drill]\nverify_command = ['python', '{checkpoint}']\n", "{checkpoint} is not a placeholder; use {dest}"),
        ("[drill]\nverify_command = ['python', 3]\n", "drill.verify_command: a list of strings"),
        ("[drill]\nverify_fail_codes = []\n", "drill.verify_fail_codes: name at least one exit code"),
        ("[drill]\nverify_fail_codes = [0]\n", "drill.verify_fail_codes: 0 is not an exit code that can fail a check"),
        ("[drill]\nverify_env = { 'A-B' = 'x' }\n", "drill.verify_env: 'A-B' is not an environment variable name"),
        ("[[sources]]\nrun = 'a'\npath = '/x'\nverify_command = ['x', '{stp}']\n", "sources[0].verify_command"),
    ],
)
def test_a_bad_verify_key_is_a_config_error_naming_it(toml: str, said: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(BASE + toml)
    assert said in str(e.value), str(e.value)


def test_a_cwd_that_is_not_a_directory_and_a_missing_program_are_named(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("")
    cfg = parse_config(BASE + f"[drill]\nverify_command = ['python3']\nverify_cwd = '{f}'\n")
    (problem,) = verify.config_problems(cfg)
    assert problem.startswith(f"[drill] verify_cwd: {f} is not a directory")
    cfg = parse_config(BASE + "[[sources]]\nrun = 'a'\npath = '/x'\nverify_command = ['no-such-program-zz']\n"
                       f"[drill]\nverify_command = ['{sys.executable}']\n")  # fmt: skip
    (problem,) = verify.config_problems(cfg)
    assert "sources[0].verify_command (run 'a'): 'no-such-program-zz' is not an executable" in problem
    assert verify.config_problems(cfg, ["b"]) == []  # run b uses [drill]'s, which is there


# --- what a drill records ----------------------------------------------------------------------------------


def _result(outcome: str, *, was_suspect: bool = False) -> DrillResult:
    v = verify.VerifyResult(outcome, "why", ("py",), 0, 1.5, "out", "err")
    return DrillResult("r", 100, 1, outcome == PASSED, 3.0, 10, () if v.problem is None else (v.problem,),
                       verify=v, was_suspect=was_suspect)  # fmt: skip


def test_a_failed_check_marks_the_save_and_a_broken_one_neither_marks_nor_clears_it() -> None:
    assert _result(PASSED).event().ok is True
    assert _result(FAILED).event().ok is False and _result(FAILED).problems == ("verify failed: why",)
    broke = _result(VERIFY_ERROR)
    # the drill fails; the save is not marked
    assert broke.ok is False and broke.verify_error and broke.event().ok is True
    assert _result(VERIFY_ERROR, was_suspect=True).event().ok is False  # still suspect
    log = [Event(run="r", step=100, event="uploaded", at=1.0, format="hf", bytes=10, files=1),
           Event(run="r", step=100, event="verified", at=1.0, storage_class="STANDARD")]  # fmt: skip
    (s,) = fold([*log, replace(broke.event(), at=2.0)])
    assert not s.suspect
    detail = json.loads(broke.event().detail)["verify"]
    assert detail["outcome"] == VERIFY_ERROR and detail["stdout_tail"] == "out" and detail["seconds"] == 1.5


def test_the_report_the_artifact_and_the_gauge_carry_the_check() -> None:
    rows = (_result(PASSED), replace(_result(VERIFY_ERROR), step=200))
    report = DrillReport(rows, (), coverage([], 0.0, 1))
    assert report.as_dict()["drilled"][1]["verify"]["outcome"] == VERIFY_ERROR
    assert report.ledger_gauges() == {"drill_verify_seconds": 3.0}
    assert DrillReport((replace(rows[0], verify=None),), (), coverage([], 0.0, 1)).ledger_gauges() == {}
    md = render_markdown(rows, [])
    assert "Resume check of r step 200: verify_error** (a broken check: the save is not marked suspect)" in md
    assert "```\nout\n```" in md


def test_verify_only_picks_the_newest_verified_save_of_the_step_or_names_what_there_is() -> None:
    log = [e for save in (1, 2) for e in (
        Event(run="r", step=100, save=save, event="uploaded", at=float(save), format="hf", bytes=10, files=1),
        Event(run="r", step=100, save=save, event="verified", at=float(save), storage_class="STANDARD"))]  # fmt: skip
    states = fold(log)
    assert one_save(states, "r", 100).chosen[0].key == ("r", 100, 2)
    with pytest.raises(InvalidArgumentError, match=r"no run 'x' in the catalog \(runs: r\)"):
        one_save(states, "x", 100)
    with pytest.raises(InvalidArgumentError, match=r"no verified save of step 7 \(its verified steps: 100\)"):
        one_save(states, "r", 7)


# --- run: real processes -----------------------------------------------------------------------------------


def _script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text("import json, os, sys, time, subprocess\n" + body)
    return [sys.executable, str(path)]


def _run(tmp_path: Path, command: list[str], **kw: object) -> verify.VerifyResult:
    ckpt = tmp_path / "scratch" / "checkpoint-100"
    ckpt.mkdir(parents=True, exist_ok=True)
    settings = Settings(tuple(command), **kw)  # type: ignore[arg-type]
    return verify.run(settings, ckpt, run_name="r", step=100, save=1, fmt="hf", metrics={"loss": 2.0},
                      environ={"PATH": os.environ["PATH"], "AWS_SECRET_ACCESS_KEY": "s3cr3t"})  # fmt: skip


def test_the_command_gets_its_placeholders_its_cwd_and_a_clean_environment(tmp_path: Path) -> None:
    cmd = _script(tmp_path, "ok.py", "print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(), "
                  "'env': sorted(os.environ), 'metrics': json.load(open(sys.argv[3]))}))\n")  # fmt: skip
    got = _run(tmp_path, [*cmd, "{dest}", "{run}:{step}:{save}:{format}", "{metrics_json}"])
    assert got.outcome == PASSED and got.returncode == 0, got
    doc = json.loads(got.stdout_tail)
    assert doc["argv"][:2] == [str(tmp_path / "scratch" / "checkpoint-100"), "r:100:1:hf"]
    assert doc["cwd"] == str(tmp_path / "scratch") and doc["metrics"] == {"loss": 2.0}
    assert "AWS_SECRET_ACCESS_KEY" not in doc["env"]
    assert not list((tmp_path / "scratch").glob(".ckptvault-verify-*"))  # the metrics file went with the drill


def test_exit_codes_output_tails_and_a_missing_program(tmp_path: Path) -> None:
    fail = _run(tmp_path, _script(tmp_path, "f.py", "print('x' * 9000); sys.stderr.write('bad\\n'); sys.exit(1)"))
    assert fail.outcome == FAILED and fail.stdout_tail.startswith("[...] ") and fail.stderr_tail == "bad\n"
    assert _run(tmp_path, _script(tmp_path, "e.py", "sys.exit(3)")).outcome == VERIFY_ERROR
    missing = _run(tmp_path, ["no-such-program-zz"])
    assert missing.outcome == VERIFY_ERROR and "did not start" in missing.why and missing.returncode is None


def test_the_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    child = "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
    cmd = _script(tmp_path, "hang.py", child + f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
                  "print('started', flush=True); time.sleep(300)\n")  # fmt: skip
    t0 = time.monotonic()
    got = _run(tmp_path, cmd, timeout_seconds=2.0)
    assert got.outcome == VERIFY_ERROR and "timed out after 2 s" in got.why and got.returncode is None
    assert time.monotonic() - t0 < 30 and "started" in got.stdout_tail
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for every purpose but its parent's wait (its parent was killed: init reaps it)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_scratch_it_cannot_write_is_a_verify_error_not_a_verdict(tmp_path: Path) -> None:
    gone = tmp_path / "gone" / "checkpoint-100"  # its directory does not exist: no metrics file can be written
    got = verify.run(Settings((sys.executable, "-c", "pass")), gone, run_name="r", step=100, save=1, fmt="hf",
                     metrics={})  # fmt: skip
    assert got.outcome == VERIFY_ERROR and got.why.startswith("did not start: the metrics file's directory")


# --- drill --python: another environment -------------------------------------------------------------------


def test_two_environments_verdicts_and_what_each_alerts() -> None:
    """What the two environments say together (environment.verdict), and what the drill does with it: format
    rot fails the drill with an alert of its own and never marks the save; a failure here is the save's."""
    from ckptvault.restore.environment import BOTH_FAIL, BOTH_PASS, BROKE, ONLY_OTHER, ROT, OtherResult, verdict

    good, bad = OtherResult("/v/bin/python", {"python": "3.12.1"}), OtherResult("/v/bin/python", problems=("x",))
    broke = OtherResult("/v/bin/python", error="the load checks with /v/bin/python broke: exit 1")
    assert verdict(True, None) is None
    assert [verdict(True, good), verdict(True, bad), verdict(False, bad), verdict(False, good)] == [
        BOTH_PASS, ROT, BOTH_FAIL, ONLY_OTHER]  # fmt: skip
    assert verdict(True, broke) == verdict(False, broke) == BROKE
    base = DrillResult("r", 10, 1, True, 1.0, 100, loaded_with={"python": "3.11.7"})
    rot = replace(base, other=bad)
    assert rot.format_rot and not rot.passed and rot.save_ok and rot.ok
    assert rot.all_problems == ("with /v/bin/python: x",)
    kind, facts = rot.alert()
    assert kind == "drill_format_rot" and facts["python"] == "/v/bin/python" and facts["problems"] == [
        "with /v/bin/python: x"]  # fmt: skip
    assert replace(base, other=broke).alert()[0] == "drill_format_rot" and not replace(base, other=broke).passed
    both = replace(base, ok=False, problems=("y",), other=bad)
    assert both.alert() == ("drill_failed", {"run": "r", "step": 10, "problems": ["y", "with /v/bin/python: x"]})
    assert not both.save_ok and not both.format_rot
    fine = replace(base, other=good)
    assert fine.passed and DrillReport((fine, rot), (), coverage([], 0.0, 1)).failed == (rot,)
    row = rot.row()
    assert (row["ok"], row["format_rot"], row["compared"], row["other"]["python"]) == (
        False,
        True,
        ROT,
        "/v/bin/python",
    )
    assert json.loads(rot.detail())["other"]["problems"] == ["x"] and json.loads(rot.detail())["loaded_with"]
    assert "**FORMAT ROT**" in render_markdown([rot], [])
    assert "other" not in base.row() and base.row()["loaded_with"] == {"python": "3.11.7"}


def test_the_load_checks_run_in_another_interpreter_and_read_back(tmp_path: Path) -> None:
    """`python -m ckptvault.restore.loadcheck` as `drill --python` runs it: this interpreter here (a real
    subprocess), its report and versions read back; one that does not run the checks is named."""
    from ckptvault.restore.environment import OtherPythonError, check_with, loaded_with, probe

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "bad.json").write_text("{")
    report, versions = check_with(sys.executable, ckpt, 60)
    assert versions == loaded_with() == probe(sys.executable) and versions["python"]
    assert [c.path for c in report.checks] == ["bad.json", "config.json"]
    assert report.problems and report.problems[0].startswith("bad.json: not valid JSON")
    with pytest.raises(OtherPythonError, match="does not run ckptvault's load checks"):
        probe("/bin/false")
    with pytest.raises(OtherPythonError, match="cannot be run"):
        probe(str(tmp_path / "none"))


def test_a_safetensors_file_is_read_without_safetensors_and_says_so(tmp_path: Path) -> None:
    """Where safetensors is not installed the header is parsed and every tensor's bytes read, `ran` False:
    a drill there never passes silently, and a truncated file still fails."""
    import struct

    from ckptvault.restore.safetensors_check import _check_without_safetensors

    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "__metadata__": {}}).encode()
    good = tmp_path / "m.safetensors"
    good.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    got = _check_without_safetensors(good, "m.safetensors")
    assert got.ok and not got.ran and "(1 tensors)" in got.how and "not installed here" in got.how
    short = tmp_path / "s.safetensors"
    short.write_bytes(good.read_bytes()[:-4])
    assert "ends past the end of the file" in _check_without_safetensors(short, "s.safetensors").problem


def test_the_other_interpreter_sees_ckptvault_and_none_of_this_environments_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed ckptvault sits in site-packages beside this environment's torch and safetensors: the
    other interpreter gets a directory holding only ckptvault, so what it loads with is its own (here a
    bare venv: no safetensors, though the site-packages ckptvault came from has one)."""
    import venv

    from ckptvault.restore import environment

    site = tmp_path / "site-packages"
    (site / "safetensors-99.0.dist-info").mkdir(parents=True)
    (site / "safetensors-99.0.dist-info" / "METADATA").write_text("Name: safetensors\nVersion: 99.0\n")
    (site / "ckptvault").symlink_to(environment._PACKAGE)
    monkeypatch.setattr(environment, "_PACKAGE", site / "ckptvault")
    other = tmp_path / "bare"
    venv.create(other, with_pip=False)
    got = environment.probe(str(other / "bin" / "python"))
    assert got["python"] and "safetensors" not in got, got
