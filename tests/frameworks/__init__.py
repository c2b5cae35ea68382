"""Tests against the real training frameworks (the `frameworks` extra): what they write is found,
uploaded, restored, resumed by the framework itself, and drilled. See conftest.py and writers.py."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def missing(msg: str) -> NoReturn:
    """Something the suite installs is not there: the test fails with CI=true (CI runs `make test`, which
    installs it, so its absence is a broken install, never a reason to skip) and is skipped elsewhere,
    with `msg` saying what is missing and which make target installs it."""
    if in_ci():
        pytest.fail(f"{msg} (CI=true: a missing install fails, it does not skip)", pytrace=False)
    pytest.skip(msg)


def need(module: str) -> ModuleType:
    """Import `module` (a framework from the `frameworks` extra), or `missing`: fail with CI=true, skip
    elsewhere, saying what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing(f"{module} is not importable ({e}); `make venv` installs the frameworks extra")
