"""What `pip install ckptvault` puts into site-packages: the wheel, built from the source as pip builds
it, holds ckptvault, ckptvault_cli and ckptvault_prefect and no generic top-level package (`tasks`,
`flows`, `deployments` would collide with other projects'). Installed alone, its Prefect layer
imports and finds its prefect.yaml, with no checkout on the path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = {"ckptvault", "ckptvault_cli", "ckptvault_prefect"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources, and other
    # sessions share this checkout. No isolation: the venv's setuptools, no download.
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", *sorted(SHIPPED)):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    cmd = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [built] = out.glob("ckptvault-*.whl")
    return built


def test_the_wheel_has_no_generic_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == SHIPPED
    assert not tops & {"tasks", "flows", "deployments", "tests", "bench", "infra"}
    for layer in ("tasks", "runtime", "flows", "deployments"):
        assert f"ckptvault_prefect/{layer}/__init__.py" in names
    assert "ckptvault_prefect/deployments/prefect.yaml" in names  # serve.py and `prefect deploy` read it
    [top_level] = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert set(zipfile.ZipFile(wheel).read(top_level).decode().split()) == SHIPPED


def test_the_installed_prefect_layer_imports_and_reads_its_prefect_yaml(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    probe = (
        "import importlib.util, sys\n"
        "from ckptvault_prefect.deployments import serve\n"
        "print(serve.__file__)\n"
        "print(sorted(s['entrypoint'] for s in serve.deployment_specs()))\n"
        "print([n for n in ('tasks', 'flows', 'deployments') if importlib.util.find_spec(n)])\n"
    )
    # The wheel's copy first on the path, run from an empty directory: nothing from this checkout.
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    where, entrypoints, generic = run.stdout.strip().splitlines()[-3:]
    assert where.startswith(str(site))
    flows = ("drill", "ingest", "replicate", "restore", "scrub", "tier", "watch")
    assert entrypoints == str(sorted(f"ckptvault_prefect.flows.{f}.{f}" for f in flows))
    assert generic == "[]"
