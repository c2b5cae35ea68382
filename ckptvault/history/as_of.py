"""`--as-of TIME` and `--since TIME`: the moment a user means, as an aware UTC datetime.

TIME is either an ISO 8601 date-time with a zone (`2026-12-07T08:00:00Z`, `...+02:00`) or a duration
meaning "that long ago" (`90s`, `30m`, `2h`, `3d`, `1w`, and sums of them such as `1d12h`). A time
without a zone is refused rather than guessed: the server's clock is UTC and an operator's is not, so a
guess would read the archive an hour or more off at the worst moment. The server's LastModified decides
what was current (docs/object-lock.md), at its resolution of one second: the moment is truncated to the
second, so a version written during that second counts as current at it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from ckptvault.errors import InvalidArgumentError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(?:\d+[smhdw])+")
_PART = re.compile(r"(\d+)([smhdw])")
_FORMS = "an ISO 8601 time with a zone (2026-12-07T08:00:00Z) or a duration ago (2h, 3d, 1d12h)"


class AsOfError(InvalidArgumentError):
    """A TIME that names no moment ckptvault can read the archive at: the message names it and the forms."""


def parse_as_of(text: str, now: datetime, flag: str = "--as-of") -> datetime:
    """The moment `text` names, in UTC, truncated to the second; `now` is an aware datetime."""
    value = text.strip()
    if _DURATION.fullmatch(value):
        seconds = sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(value))
        if seconds == 0:
            raise AsOfError(f"{flag} {text}: a duration of zero is now; give {_FORMS}")
        moment = now.astimezone(UTC) - timedelta(seconds=seconds)
    else:
        try:
            moment = datetime.fromisoformat(value.replace("z", "Z"))
        except ValueError:
            raise AsOfError(f"{flag} {text}: not a time; give {_FORMS}") from None
        if moment.tzinfo is None:
            raise AsOfError(f"{flag} {text}: no zone; add one (Z for UTC, or an offset such as +02:00)")
        moment = moment.astimezone(UTC)
        if moment > now.astimezone(UTC):
            raise AsOfError(f"{flag} {text}: in the future (now is {now.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ})")
    return moment.replace(microsecond=0)
