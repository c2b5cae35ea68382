"""The top-level flows/, tasks/ and deployments/ folders of a Prefect project: in a checkout they name
the shipped ckptvault_prefect objects themselves (not copies), and the wheel leaves them out
(tests/unit/test_packaging.py)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
from prefect.flows import load_flow_from_entrypoint

from ckptvault_prefect.deployments import serve

ROOT = Path(__file__).resolve().parents[2]


NAMES = sorted(e.rsplit(".", 1)[1] for e in serve.FLOWS)  # entrypoints ckptvault_prefect.flows.<name>.<name>


@pytest.mark.parametrize("name", NAMES)
def test_each_flow_loads_from_its_file_entrypoint_as_the_shipped_object(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = serve.FLOWS[f"ckptvault_prefect.flows.{name}.{name}"]
    monkeypatch.chdir(ROOT)
    loaded = load_flow_from_entrypoint(f"flows/{name}.py:{name}")
    assert loaded.name == shipped.name and loaded.fn.__module__ == f"ckptvault_prefect.flows.{name}"
    assert importlib.import_module(f"flows.{name}").__dict__[name] is shipped


def test_every_task_module_is_reexported_whole() -> None:
    shipped = sorted(p.stem for p in (ROOT / "ckptvault_prefect" / "tasks").glob("*.py") if p.stem != "__init__")
    assert sorted(p.stem for p in (ROOT / "tasks").glob("*.py") if p.stem != "__init__") == shipped
    for stem in shipped:
        real = importlib.import_module(f"ckptvault_prefect.tasks.{stem}")
        shim = importlib.import_module(f"tasks.{stem}")
        public = {k for k in vars(real) if not k.startswith("_")}
        assert public <= set(vars(shim)), (stem, public - set(vars(shim)))
        assert all(getattr(shim, k) is getattr(real, k) for k in public)


def test_the_project_prefect_yaml_is_the_shipped_one() -> None:
    link = ROOT / "deployments" / "prefect.yaml"
    assert link.is_symlink() and link.resolve() == serve.PREFECT_YAML.resolve()
    assert os.readlink(link) == "../ckptvault_prefect/deployments/prefect.yaml"
    assert {s["entrypoint"] for s in serve.deployment_specs(link)} == set(serve.FLOWS)
