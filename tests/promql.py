"""What a PromQL expression (an alert rule's, a Grafana panel's) names, and what ckptvault exports, so a
test can check that every query reads series that exist: a renamed metric breaks the rule or the panel
silently otherwise (an empty result is not an error in PromQL)."""

from __future__ import annotations

import re

from prometheus_client.core import Metric

from ckptvault.catalog import Catalog, Event
from ckptvault.observe.metrics import MetricsOptions, compute
from ckptvault.pricing import load_prices
from ckptvault.store import MemoryStore

# Words PromQL reads as operators or modifiers, not as series (functions and aggregations are told
# apart by the parenthesis that follows them).
KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
     "inf", "nan"}
)  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$\w+")
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
# by/without/on/ignoring/group_left/group_right with their label lists (label names, not series), gone
# whole: `sum by (le) (x)` is then `sum (x)`, a function call
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
# an identifier not inside a number (1e3, 0x1f) or a word
_IDENT = re.compile(r"(?<![\w.:])[A-Za-z_:][\w:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*([A-Za-z_:][\w:]*)\s*(?:\{[^}]*\})?\s*,\s*\w+\s*\)\s*$")


def metric_names(expr: str) -> set[str]:
    """The series names `expr` reads. Grafana's `label_values(metric, label)` template query is read as
    the metric it names."""
    m = _LABEL_VALUES.match(expr)
    if m:
        return {m.group(1)}
    text = _STRING.sub('""', expr)
    text = _GRAFANA_VAR.sub("", text)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        word = m.group(0)
        if word.lower() in KEYWORDS or text[m.end() :].lstrip().startswith("("):
            continue  # an operator, or a function / aggregation
        names.add(word)
    return names


def _sample_catalog() -> Catalog:
    """A catalog with a run, a class and a drill, so every family the collector can send has samples."""
    cat = Catalog(MemoryStore("b"), "p")
    cat.append([
        Event("r", 100, "verified", 1000.0, bytes=4000, files=2, storage_class="STANDARD", created_at=900.0),
        Event("r", 100, "drilled", 2000.0, ok=True),
    ])  # fmt: skip
    return cat


def exported_families() -> list[Metric]:
    """Every family the collector sends, with every optional one switched on (prices, a budget, a watched
    run), over a catalog that has a run, a class and a drill."""
    options = MetricsOptions(prices=load_prices(), stale_after={"r": 3600.0}, budget_usd_per_month=100.0)
    return compute(_sample_catalog(), options, now=3000.0).metrics


def exported_names() -> set[str]:
    """The series names a query may read: a gauge's name, a histogram's _bucket/_sum/_count (not its bare
    name: no series has it), a counter's _total."""
    out: set[str] = set()
    for fam in exported_families():
        if fam.type == "histogram":
            out |= {f"{fam.name}_bucket", f"{fam.name}_sum", f"{fam.name}_count"}
        elif fam.type == "counter":
            out.add(f"{fam.name}_total")
        else:
            out.add(fam.name)
    return out


def names_with_label(label: str) -> set[str]:
    """The series names whose samples carry `label` (e.g. the per-run ones)."""
    return {s.name for fam in exported_families() for s in fam.samples if label in s.labels}
