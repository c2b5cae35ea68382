"""Numbers as an operator reads them: bytes, durations and dollars, one spelling for every message."""

from __future__ import annotations

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def size(n: float) -> str:
    """Binary units, one decimal (`1.5 GiB`); whole bytes below 1 KiB."""
    for unit in _BYTE_UNITS:
        if abs(n) < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def duration(s: float) -> str:
    """Seconds under two minutes, whole minutes under two hours, then hours with one decimal."""
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def usd(x: float) -> str:
    """Cents with thousands separators from a dollar up; four decimals below, where storage of a
    small checkpoint for a month costs fractions of a cent."""
    return f"${x:,.2f}" if abs(x) >= 1 else f"${x:.4f}"
