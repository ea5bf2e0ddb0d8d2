"""Durations as operators write them: ``90d``, ``12w``, ``36h``. Pure; no I/O, no asyncpg
(the settings model imports it)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800, "": 86_400}
MAX_DURATION: Final = timedelta(days=36_500)
"""The longest duration taken: a date that far back is still a date (a million days back
is not: the settings failed with an OverflowError traceback)."""
MIN_RETENTION: Final = timedelta(days=1)
"""The least retention a worker or an operator may ask for: partitions are days or weeks,
and a shorter one drops yesterday's partition while a batch that began before midnight
may still write it."""


def parse_duration(text: str, *, unit_required: bool = False) -> timedelta:
    """``90d``, ``12w``, ``36h``, ``30m``, ``45s``; a bare number is days, unless
    ``unit_required`` (``retention apply --older-than``: ``90`` was saved as 90 days
    though its help shows only 90d, 12w, 36h — hours or weeks may have been meant).

    Raises ValueError naming the accepted forms.
    """
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 90d, 12w or 36h")
    if unit_required and not match[2]:
        raise ValueError(f"{text!r} has no unit: give one, like {match[1]}d, {match[1]}w or 36h")
    seconds = int(match[1]) * _UNITS[match[2]]
    if seconds > MAX_DURATION.total_seconds():  # past it, date arithmetic overflows
        raise ValueError(f"{text!r} is over {MAX_DURATION.days}d (a century)")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """The shortest of :func:`parse_duration`'s forms that is exact."""
    seconds = int(value.total_seconds())
    for unit in ("w", "d", "h", "m"):
        if seconds and seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


def retention_period(text: str, *, unit_required: bool = False) -> timedelta:
    """A retention period (:func:`parse_duration`) of at least :data:`MIN_RETENTION`.

    Raises ValueError saying why."""
    keep = parse_duration(text, unit_required=unit_required)
    if keep < MIN_RETENTION:
        raise ValueError("must be at least a day (1d): partitions are days or weeks")
    return keep
