"""One module per `ackline` subcommand group; each exposes ``register(subparsers)``.

A handler takes ``(args, settings)`` and returns the exit status. Modules import their
heavy dependencies inside the handler so `ackline --help` and `ackline dev` stay fast.
Each parser a command line can end at declares, with :func:`uses`, which of the settings
the global ``--topic`` and ``--group-id`` set its handler reads.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ackline.settings import Settings

Handler = Callable[[argparse.Namespace, Settings], int]
Subparsers = Any  # argparse's _SubParsersAction is private

MODULES = (
    *("core", "dev", "feed", "config", "inspect", "doctor", "roles", "capture", "chaos"),
    "processors",
    "retention",
    "erase",
    "offsets",
)

GlobalSetting = Literal["topic", "group_id"]
"""A setting a global option sets for one command line (``--topic``, ``--group-id``)."""


@dataclass(frozen=True)
class Uses:
    """What a command reads of the :data:`GlobalSetting` s, and why not the others (said
    when one of them is given)."""

    settings: frozenset[GlobalSetting]
    why: str | None = None


def uses(p: argparse.ArgumentParser, *settings: GlobalSetting, why: str | None = None) -> None:
    """Declare the settings of ``--topic`` / ``--group-id`` that ``p``'s handler reads
    (itself or through what it calls). ackline.cli refuses the other options: a command
    that ignored them let the user believe they had taken effect. A parser that declares
    nothing refuses both."""
    p.set_defaults(global_uses=Uses(frozenset(settings), why))


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0 (``0`` or less polled in a
    busy loop; ``nan`` turned polling off)."""
    return _seconds(text, math.inf)


def seconds_up_to(most: float) -> Callable[[str], float]:
    """An argparse type: finite seconds above 0 and at most ``most``. A client timeout
    beyond reason is a typo, and librdkafka took a negative one as 'wait forever' (deaf
    to SIGTERM meanwhile) and one past its int milliseconds (~24 days) as none."""
    return lambda text: _seconds(text, most)


def _seconds(text: str, most: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= most):
        bound = "" if math.isinf(most) else f" and at most {most:g}"
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds above 0{bound}, not {text}"
        )
    return value


def nonempty(text: str) -> str:
    """An argparse type: a name or cursor that is not empty. ``--reader ""`` was taken as
    no reader (the feed from its start) and ``--to-cursor ""`` as the start: a slip in a
    script's variable must not mean 'everything'."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


BIGINT_MAX = 2**63 - 1
"""The largest count or id a command takes: PostgreSQL's bigint (asyncpg refuses a larger
argument with a traceback)."""


def whole_from(low: int, high: int = BIGINT_MAX) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high`` (:data:`BIGINT_MAX`),
    refused when parsed rather than by Kafka after a wait (a partition count of 0, a
    negative event count), by asyncpg (a number past a bigint), or not at all (a flag
    that stands for a setting, past the setting's range)."""

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {low}, not {text}")
        if value > high:
            why = " (PostgreSQL's bigint)" if high == BIGINT_MAX else ""
            raise argparse.ArgumentTypeError(f"must be at most {high}{why}, not {text}")
        return value

    return whole
