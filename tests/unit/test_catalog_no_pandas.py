"""The catalog answers pyarrow's pandas question once (ckptvault/catalog/_arrow.py): a fresh process that
appends, compacts and reads the catalog never imports pandas, and pandas still works when asked for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import sys, time
from ckptvault.catalog import Catalog, Event
from ckptvault.catalog.table_view import current_table
from ckptvault.store import MemoryStore

cat = Catalog(MemoryStore("b"), "vault")
cat.append([Event("r", 1, "uploaded", 1.0, bytes=5, storage_class="STANDARD"), Event("r", 1, "verified", 2.0)])
cat.compact(time.time() + 10)
assert current_table(cat).num_rows == 1 and len(cat.current()) == 1  # over the combined snapshot
cat.append([Event("r", 2, "discovered", 3.0)])
assert [s.state for s in cat.current()] == ["verified", "pending"], cat.current()
assert current_table(cat).num_rows == 2 and len(cat.events("r")) == 3
print("pandas imported:", "pandas" in sys.modules)
import pyarrow as pa
print("to_pandas:", pa.table({"a": [1, None]}).to_pandas()["a"].isna().tolist())
"""


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_catalog_read_and_write_never_import_pandas_and_pandas_still_works() -> None:
    assert _run(CHILD).splitlines() == ["pandas imported: False", "to_pandas: [False, True]"]


def test_when_pandas_is_already_imported_pyarrow_keeps_its_pandas_semantics() -> None:
    code = """
import pandas as pd
import ckptvault.catalog
import pyarrow as pa
print(pa.array(pd.Series([1.0, None])).null_count)  # NaN in a Series is null under pandas semantics
"""
    assert _run(code).split() == ["1"]
