"""Shard and rank names in a checkpoint's file list: which rank a file belongs to, and which ranks of a
family are missing. Used by the shape gate; pure, no I/O."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Each pattern names the rank (or shard index) and, optionally, an `aux` number that is not a rank
# (DCP's per-rank file counter, Megatron's pipeline index). Order matters: DeepSpeed ZeRO names also
# contain `mp_rank_00`, so they are tried first.
_SHARD_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("deepspeed-zero", re.compile(r"(?:^|/)(?:\w+_)?zero_pp_rank_(?P<rank>\d+)_mp_rank_\d+_optim_states\.pt$")),
    ("deepspeed-model", re.compile(r"(?:^|/)mp_rank_(?P<rank>\d+)_model_states\.pt$")),
    ("megatron", re.compile(r"(?:^|/)mp_rank_(?P<rank>\d+)(?:_(?P<aux>\d+))?/")),
    ("dcp", re.compile(r"(?:^|/)__(?P<rank>\d+)_(?P<aux>\d+)\.distcp$")),
    ("hf", re.compile(r"-(?P<rank>\d+)-of-(?P<total>\d+)\.(?:safetensors|bin)$")),
)


@dataclass(frozen=True)
class ShardName:
    """A file recognized as one rank's (or one index's) shard."""

    kind: str  # key of _SHARD_PATTERNS
    family: str  # the path with the rank as `{rank}` and any aux number as `*`: ranks of one family
    rank: int
    width: int  # digits of the rank as written, to rebuild a missing name
    total: int | None  # HF `-of-N`: how many shards the family must have


def parse_shard(path: str) -> ShardName | None:
    for kind, pattern in _SHARD_PATTERNS:
        m = pattern.search(path)
        if m is None:
            continue
        groups = m.groupdict()
        spans = sorted((m.span(g), g) for g in ("rank", "aux") if groups.get(g) is not None)
        family, last = "", 0
        for (start, end), g in spans:
            family += path[last:start] + ("{rank}" if g == "rank" else "*")
            last = end
        family += path[last:]
        total = groups.get("total")
        return ShardName(kind, family, int(m.group("rank")), len(m.group("rank")), int(total) if total else None)
    return None


def missing_in_family(paths: Iterable[str]) -> list[str]:
    """Ranks absent from a checkpoint judged by its own names: a gap in 0..max (HF: in 1..N of
    `-of-N`). A missing *last* rank is invisible here; the comparison with the previous checkpoint
    catches that. Returned as display names, `*` standing for a number that is not a rank."""
    families: dict[str, tuple[ShardName, set[int]]] = {}
    for p in paths:
        s = parse_shard(p)
        if s is not None:
            families.setdefault(s.family, (s, set()))[1].add(s.rank)
    out: list[str] = []
    for family, (sample, ranks) in sorted(families.items()):
        expected = range(1, sample.total + 1) if sample.total is not None else range(0, max(ranks) + 1)
        for r in expected:
            if r not in ranks:
                out.append(family.replace("{rank}", f"{r:0{sample.width}d}"))
    return out


@dataclass(frozen=True)
class ShardRow:
    """One shard of the previous or current checkpoint (or one inferred missing from the current)."""

    path: str
    in_previous: bool | None  # None: no previous checkpoint to compare with
    in_current: bool
    previous_size: int | None
    current_size: int | None

    @property
    def size_ratio(self) -> float | None:
        if self.previous_size and self.current_size is not None:
            return self.current_size / self.previous_size
        return None


def shard_table(current: Sequence[tuple[str, int]], previous: Sequence[tuple[str, int]] | None) -> list[ShardRow]:
    cur = {p: s for p, s in current if parse_shard(p) is not None}
    prev = {p: s for p, s in previous if parse_shard(p) is not None} if previous is not None else None
    rows: list[ShardRow] = []
    for p in sorted(set(cur) | set(prev or {})):
        rows.append(
            ShardRow(
                path=p,
                in_previous=None if prev is None else p in prev,
                in_current=p in cur,
                previous_size=None if prev is None else prev.get(p),
                current_size=cur.get(p),
            )
        )
    known = {r.path for r in rows}
    for name in missing_in_family(cur):
        # A gap already listed (by exact name, from the previous checkpoint) is not reported twice;
        # DCP gap names carry a `*` and never collide, so skip those whose rank is listed anyway.
        if name in known or any(_same_rank(name, k) for k in known if k not in cur):
            continue
        rows.append(ShardRow(path=name, in_previous=None, in_current=False, previous_size=None, current_size=None))
    return rows


def _same_rank(pattern_name: str, path: str) -> bool:
    return re.fullmatch(re.escape(pattern_name).replace(r"\*", r"\d+"), path) is not None
