"""pyarrow without its pandas question. The first time pyarrow converts a Python list or value
(`pa.array`, `pa.scalar`, `Table.from_pydict`) it imports pandas, to ask whether the value is a pandas
object. The catalog never hands it one, and that import is most of a one-run read's own time in a fresh
process (bench/README.md, "The catalog at fleet scale"). So the question is answered once, when this
module is imported (first, by the package): pandas is not there for conversions. pyarrow remembers the
answer for the process; what needs pandas explicitly (`Table.to_pandas`, `from_pandas`) still imports it
when called."""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec
from types import ModuleType


class _NoPandasForPyarrow:
    """A finder that makes `import pandas` fail, installed only while pyarrow asks."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def answer_pandas_question() -> None:
    """Let pyarrow find pandas absent for its conversions; nothing when pandas is already imported
    (then pyarrow's question costs nothing and a caller may be passing pandas objects)."""
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    sys.meta_path.insert(0, _NoPandasForPyarrow)
    try:
        pa.array([0])  # pyarrow asks here, once per process
    finally:
        sys.meta_path.remove(_NoPandasForPyarrow)


answer_pandas_question()
