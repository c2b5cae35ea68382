"""What a restore will cost before it starts: bytes and objects per storage class, the thaw's tier
and wait, retrieval and egress dollars, and the download time from this run's last measured restore."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ckptvault import humanize
from ckptvault.catalog import Event
from ckptvault.checkpoint.manifest import Manifest
from ckptvault.pricing import PriceTable
from ckptvault.restore.plan import ObjectPlan


@dataclass(frozen=True)
class Estimate:
    run: str
    step: int
    bytes: int
    objects: int
    by_class: dict[str, tuple[int, int]]  # class -> (objects, bytes)
    frozen: int  # objects that need RestoreObject before download
    tier: str
    usd: float
    seconds_min: float
    seconds_max: float
    egress: str = "in-region"
    egress_usd: float = 0.0
    throughput_mib_s: float | None = None  # this run's last measured restore or drill; None: never measured
    whole: Estimate | None = None  # a partial restore's: the same copy's whole save, for comparison

    def whole_line(self) -> str:
        """A partial restore's comparison with the whole save ("" for a whole restore)."""
        w = self.whole
        if w is None:
            return ""
        thaw = f", {w.frozen} objects to thaw" if w.frozen else ""
        return (
            f"the whole save: {w.bytes / 2**30:.2f} GiB in {w.objects} objects{thaw}, ${w.total_usd:.2f}; "
            f"this part: {self.bytes / 2**30:.2f} GiB in {self.objects} objects"
            + (f", {self.frozen} to thaw" if self.frozen else "")
            + f", ${self.total_usd:.2f}"
        )

    @property
    def download_seconds(self) -> float | None:
        if not self.throughput_mib_s:
            return None
        return self.bytes / 2**20 / self.throughput_mib_s

    @property
    def total_usd(self) -> float:
        return self.usd + self.egress_usd

    def report(self) -> str:
        """What an operator reads before the restore starts: one line per question they have."""
        lines = [f"restore {self.run} step {self.step}: {self.bytes / 2**30:.2f} GiB in {self.objects} objects"]
        for c, (n, b) in sorted(self.by_class.items()):
            lines.append(f"  {c:<14} {n:>6} objects  {b / 2**30:10.2f} GiB")
        if self.frozen:
            lines.append(
                f"  thaw: {self.frozen} archived objects with the {self.tier} tier, "
                f"expected {humanize.duration(self.seconds_min)} to {humanize.duration(self.seconds_max)}"
            )
        else:
            lines.append("  thaw: none needed")
        if self.download_seconds is not None and self.throughput_mib_s:
            lines.append(
                f"  download: about {humanize.duration(self.download_seconds)} "
                f"(at {self.throughput_mib_s:.0f} MiB/s, this run's last measured restore)"
            )
        else:
            lines.append("  download: no restore of this run measured yet")
        lines.append(
            f"  cost: ${self.usd:.2f} retrieval and requests + ${self.egress_usd:.2f} egress ({self.egress}) "
            f"= ${self.total_usd:.2f}"
        )
        if self.whole is not None:
            lines.append(f"  {self.whole_line()}")
        return "\n".join(lines)

    def as_record(self) -> dict[str, object]:
        """The estimate as `restore --json` reports it (docs/runbook.md)."""
        return {
            "bytes": self.bytes,
            "objects": self.objects,
            "by_class": {c: {"objects": n, "bytes": b} for c, (n, b) in sorted(self.by_class.items())},
            "frozen_objects": self.frozen,
            "thaw_tier": self.tier,
            "thaw_seconds": [self.seconds_min, self.seconds_max] if self.frozen else None,
            "retrieval_usd": round(self.usd, 6),
            "egress": self.egress,
            "egress_usd": round(self.egress_usd, 6),
            "throughput_mib_s": self.throughput_mib_s,
            "download_seconds": self.download_seconds,
            **({} if self.whole is None else {"whole": self.whole.as_record()}),
        }

    def describe(self) -> str:
        classes = ", ".join(f"{c}: {n} objects / {b / 2**30:.2f} GiB" for c, (n, b) in sorted(self.by_class.items()))
        wait = (
            "no thaw needed"
            if self.frozen == 0
            else f"{self.frozen} archived objects to thaw with the {self.tier} tier: "
            f"{humanize.duration(self.seconds_min)} to {humanize.duration(self.seconds_max)}"
        )
        whole = f"; {self.whole_line()}" if self.whole is not None else ""
        return (
            f"restore {self.run} step {self.step}: {self.bytes / 2**30:.2f} GiB in {self.objects} objects ({classes}); "
            f"{wait}; estimated retrieval cost ${self.usd:.2f}{whole}"
        )


def estimate(
    manifest: Manifest,
    plans: Sequence[ObjectPlan],
    prices: PriceTable,
    tier: str,
    egress: str = "in-region",
    throughput_mib_s: float | None = None,
    reads: Mapping[str, int] | None = None,
) -> Estimate:
    """`reads`: the bytes a tensor-level restore reads of a file, by path, where that is not the whole
    object (the blocks around its ranges, or nothing): its egress is priced on them. A thaw is of the
    whole object whatever is read of it, so the retrieval stays the objects'; an object of which nothing
    is read (a .distcp holding none of the chosen items) is neither thawed nor retrieved."""
    reads = reads or {}
    read = [p for p in plans if reads.get(p.path) != 0]
    by_class: dict[str, tuple[int, int]] = {}
    for p in read:
        n, b = by_class.get(p.storage_class, (0, 0))
        by_class[p.storage_class] = (n + 1, b + p.stored_bytes)
    frozen_by_class: dict[str, tuple[int, int]] = {}
    for p in read:
        if not p.thawed:
            n, b = frozen_by_class.get(p.storage_class, (0, 0))
            frozen_by_class[p.storage_class] = (n + 1, b + p.stored_bytes)
    usd, smin, smax = prices.restore_estimate(by_class, tier)
    if not frozen_by_class:
        smin = smax = 0.0
    return Estimate(
        run=manifest.run,
        step=manifest.step,
        bytes=manifest.total_bytes,
        objects=len(read),
        by_class=by_class,
        frozen=sum(n for n, _ in frozen_by_class.values()),
        tier=tier,
        usd=usd,
        seconds_min=smin,
        seconds_max=smax,
        egress=egress,
        egress_usd=prices.egress(sum(reads.get(p.path, p.stored_bytes) for p in plans), egress),
        throughput_mib_s=throughput_mib_s,
    )


# Transfers smaller than this measure the fixed cost of a restore, not its throughput.
_MIN_MEASURED_BYTES = 64 * 2**20


def restore_throughput(events: Sequence[Event]) -> float | None:
    """MiB/s of the newest restore or passing drill of at least 64 MiB among `events` (None: none yet)."""
    for e in sorted(events, key=lambda e: e.at, reverse=True):
        if e.event not in ("restored", "drilled") or e.ok is False:
            continue
        try:
            d = json.loads(e.detail) if e.detail else {}
        except json.JSONDecodeError:
            continue
        if not isinstance(d, dict):
            continue
        rate, nbytes = d.get("mib_per_s"), d.get("bytes", e.bytes)
        if isinstance(rate, int | float) and rate > 0 and isinstance(nbytes, int) and nbytes >= _MIN_MEASURED_BYTES:
            return float(rate)
    return None
