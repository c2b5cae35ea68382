"""infra/ci/check-tools.sh, the phase of .ci/run that checks the suite's external tools before
`make test`: on a machine without one it fails, naming the tool and how to get it.

"A machine without terraform" is this machine with a PATH made of links to every executable on the
real PATH but that one, so everything else the script checks is found as it would be in CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "infra" / "ci" / "check-tools.sh"


def path_without(tool: str, farm: Path) -> str:
    """A PATH (one directory, `farm`) with what the real PATH finds first under each name, except `tool`."""
    farm.mkdir()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not d or not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            link = farm / entry.name
            if entry.name == tool or link.exists() or link.is_symlink():
                continue
            if entry.is_file() and os.access(entry.path, os.X_OK):
                link.symlink_to(entry.path)
    return str(farm)


@pytest.mark.parametrize(
    ("tool", "how"),
    [("terraform", "HashiCorp's terraform"), ("kubectl", "apt-get install kubernetes-client")],
)
def test_check_fails_naming_the_missing_tool(tmp_path: Path, tool: str, how: str) -> None:
    path = path_without(tool, tmp_path / "bin")
    proc = subprocess.run(
        ["/bin/bash", str(SCRIPT)],
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.split()[:2] == ["MISSING", tool]]
    assert how in line, line
    summary = proc.stderr.strip().splitlines()[-1]
    assert summary.startswith("check-tools: ") and tool in summary.split("missing: ", 1)[1], summary


def test_install_asks_apt_for_the_debian_package_of_a_missing_tool(tmp_path: Path) -> None:
    """--install on a machine without kubectl: apt-get (a stand-in that records its arguments, so
    nothing is installed here) is asked for Debian's kubernetes-client and for nothing that is present;
    terraform, which no Debian package provides, is never asked for."""
    path = path_without("kubectl", tmp_path / "bin")
    log = tmp_path / "apt.log"
    fake = tmp_path / "bin" / "apt-get"
    fake.unlink(missing_ok=True)
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    sudo = tmp_path / "bin" / "sudo"  # a non-root run goes through sudo -n: pass it straight on
    sudo.unlink(missing_ok=True)
    sudo.write_text('#!/bin/sh\n[ "$1" = -n ] && shift\nexec "$@"\n')
    sudo.chmod(0o755)
    checkov = tmp_path / "checkov"  # present, so --install leaves it alone (its own test is below)
    checkov.write_text("#!/bin/sh\n")
    checkov.chmod(0o755)
    proc = subprocess.run(
        ["/bin/bash", str(SCRIPT), "--install"],
        env={**os.environ, "PATH": path, "CKPTVAULT_CHECKOV": str(checkov)},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "update -q", calls
    install = calls[1].split()
    assert install[:4] == ["install", "-y", "-q", "--no-install-recommends"], calls
    assert "kubernetes-client" in install[4:] and "terraform" not in install, calls
    for tool in ("make", "gcc", "openssl", "curl"):  # each named after its Debian package
        assert (tool in install[4:]) == (shutil.which(tool) is None), (tool, calls)


def test_check_reports_every_tool_it_finds(tmp_path: Path) -> None:
    """Found tools are listed with where they were found (what a CI log reader needs to see which
    terraform or kubectl ran), and a bad argument is a usage error, not a silent pass."""
    proc = subprocess.run(["/bin/bash", str(SCRIPT)], capture_output=True, text=True, timeout=120)
    lines = [ln.split(None, 1) for ln in proc.stdout.splitlines() if ln.startswith("  ")]
    assert {status for status, _ in lines} <= {"ok", "MISSING"}
    for name in ("make", "gcc", "terraform", "kubectl", "checkov", "radosgw", "chromium", "chromedriver"):
        assert any(rest.startswith(name + " ") for _, rest in lines), (name, proc.stdout)
    assert (proc.returncode == 0) == all(status == "ok" for status, _ in lines), proc.stdout + proc.stderr
    bad = subprocess.run(["/bin/bash", str(SCRIPT), "--bogus"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_install_puts_checkov_in_a_virtualenv_of_its_own(tmp_path: Path) -> None:
    """--install on a machine without checkov makes a virtualenv for it alone (never .venv, whose boto3 and
    botocore its pins would downgrade), pip-installs the pinned version there and links the entry point
    onto PATH, where the check then finds it; a second --install changes nothing. python3 is a stand-in
    for `-m venv` (its pip records its arguments and writes a checkov) and the real one otherwise."""
    path = path_without("checkov", tmp_path / "bin")
    real = shutil.which("python3")
    assert real
    log = tmp_path / "pip.log"
    pip = tmp_path / "pip"  # what the stand-in venv gets as bin/pip: records, then writes the entry point
    pip.write_text(
        f'#!/bin/sh\necho "$*" >> {log}\n'
        'printf \'#!/bin/sh\\necho checkov-stand-in\\n\' > "$(dirname "$0")/checkov"\n'
        'chmod +x "$(dirname "$0")/checkov"\n'
    )
    python3 = tmp_path / "bin" / "python3"
    python3.unlink(missing_ok=True)
    python3.write_text(
        "#!/bin/bash\n"
        f'[[ $1 == -m && $2 == venv ]] && mkdir -p "$3/bin" && install -m 755 {pip} "$3/bin/pip" && exit 0\n'
        f'exec {real} "$@"\n'
    )
    python3.chmod(0o755)
    stand_ins = {"apt-get": f'echo "$*" >> {tmp_path / "apt.log"}', "sudo": '[ "$1" = -n ] && shift\nexec "$@"'}
    for name, body in stand_ins.items():
        stand_in = tmp_path / "bin" / name  # whatever else is missing on this machine: asked for, not installed
        stand_in.unlink(missing_ok=True)
        stand_in.write_text(f"#!/bin/sh\n{body}\n")
        stand_in.chmod(0o755)
    tools, links = tmp_path / "opt", tmp_path / "local-bin"
    env = {k: v for k, v in os.environ.items() if k != "CKPTVAULT_CHECKOV"}
    env |= {"PATH": f"{path}:{links}", "CKPTVAULT_TOOLS_DIR": str(tools), "CKPTVAULT_BIN_DIR": str(links)}

    def install() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["/bin/bash", str(SCRIPT), "--install"], env=env, capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip

    proc = install()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (version,) = [ln.split("=", 1)[1] for ln in SCRIPT.read_text().splitlines() if ln.startswith("CHECKOV_VERSION=")]
    (call,) = log.read_text().splitlines()
    assert call.split()[0] == "install" and call.split()[-1] == f"checkov=={version}", call
    link = links / "checkov"
    assert link.is_symlink() and link.resolve() == (tools / "checkov" / "bin" / "checkov").resolve()
    assert proc.stdout.strip().splitlines()[-1] == "checkov-stand-in"  # the linked entry point ran
    check = subprocess.run(["/bin/bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    (line,) = [ln for ln in check.stdout.splitlines() if ln.split()[1:2] == ["checkov"]]
    assert line.split()[:3] == ["ok", "checkov", str(link)], line

    again = install()
    assert again.returncode == 0 and "checkov is already installed" in again.stdout, again.stdout + again.stderr
    assert len(log.read_text().splitlines()) == 1  # no second pip install


def test_ci_run_checks_the_tools_before_make_test() -> None:
    phases = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.startswith("phase ")]
    names = [ln.split('"')[1] for ln in phases]
    assert 'phase "check tools" bash infra/ci/check-tools.sh' in phases
    assert names.index("install tools") < names.index("check tools") < names.index("make test")
