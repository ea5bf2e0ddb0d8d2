"""Fault injection points, one per crash window, armed by configuration.

``ACKLINE_FAULTS`` is a comma list of ``point=action`` or ``point=action@n``: fire the
action on the n-th time the point is reached (default the first). Actions:

- ``kill``: SIGKILL this process at that exact point;
- ``stall``: stop there (sleep for ``stall_seconds``, an hour unless set); with a
  ``release_file``, a stall ends early once that file exists, and removes it, so a test
  can end a stall as soon as what the stall waits for has happened (one file: one stall;
  a file that names a point releases a stall at that point only);
- ``fail``: raise :class:`InjectedFault` there;
- ``rejoin`` (only at ``after_assign``, the faust runtime): the caller asks its real Kafka
  client to rejoin the group, as the client does by itself when an offset commit is
  answered REBALANCE_IN_PROGRESS or the topic's partition count changes. A follower whose
  metadata did not change gets the generation it has again (the broker's answer, not a
  fake): the window ``after_assign`` proves.

Disarmed (the default), a point costs one dict lookup. An armed point logs a warning
``fault point <point> fired: <action>`` when it fires (before a kill), so tests and the
chaos harness can see where a process is.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from ackline.core.errors import AcklineError, SettingsError

log = logging.getLogger(__name__)

POINTS = frozenset(
    {
        "after_fetch",  # messages fetched, before the DB transaction
        "mid_copy",  # inside the transaction, after COPY into the ledger, before activity
        "before_commit",  # all statements done, COMMIT not yet sent
        "during_commit",  # COMMIT about to be sent; fail = connection lost before it arrived
        "commit_reply_lost",  # COMMIT done on the server; fail = its reply lost with the link
        "after_commit",  # DB committed, Kafka offsets not yet stored
        "after_claim",  # epochs bumped in the DB, partitions not yet assigned
        "after_assign",  # faust: an assignment claimed and sought, the flow not yet resumed
        "revoke_in_flight",  # revoke callback entered while a batch is in flight
        "lost_in_flight",  # lost callback (session or poll interval expired) with a batch in flight
        "before_leave",  # PostgreSQL unreachable past db_leave_after_s, the group not yet left
        "shutdown",  # shutdown requested, in-flight batch not yet finished
        "before_reread",  # a batch did not commit; its partitions' offset rows not yet re-read
        "before_dlq",  # poison decoded, dead-letter record not yet produced
        "feed_before_commit",  # a feed reader's side effects and cursor update not committed
        "processor_before_commit",  # a processor's effects and cursor update not committed
        "reset_after_head",  # a processor reset has its target (the head, if to now), no lock yet
    }
)
ACTIONS = frozenset({"kill", "stall", "fail", "rejoin"})
REJOIN_POINTS = frozenset({"after_assign"})
"""The points whose caller can make its Kafka client rejoin (the ``rejoin`` action)."""


class InjectedFault(AcklineError):
    """Raised by a point armed with ``fail``."""


@dataclass
class _Arm:
    action: str
    on_hit: int
    hits: int = 0


RELEASE_POLL_S = 0.05
"""How often a stall with a release file looks for it."""


class Faults:
    def __init__(
        self, spec: str = "", stall_seconds: float = 3600.0, release_file: Path | None = None
    ) -> None:
        self._arms: dict[str, _Arm] = parse(spec)
        self.stall_seconds = stall_seconds
        self.release_file = release_file

    def _released(self, point: str) -> bool:
        """Whether the release file exists, empty or naming ``point``; it is removed (it
        ends one stall)."""
        if self.release_file is None:
            return False
        try:
            named = self.release_file.read_text().strip()
            if named and named != point:
                return False
            self.release_file.unlink()
        except FileNotFoundError:
            return False
        log.warning("fault stall at %s released", point)
        return True

    def _stall_left(self, point: str, deadline: float) -> float:
        """How long to sleep next: 0 once the stall is over."""
        left = deadline - time.monotonic()
        if left <= 0 or self._released(point):
            return 0.0
        return left if self.release_file is None else min(left, RELEASE_POLL_S)

    def _fire(self, point: str) -> str | None:
        arm = self._arms.get(point)
        if arm is None:
            return None
        arm.hits += 1
        if arm.hits != arm.on_hit:
            return None
        log.warning("fault point %s fired: %s", point, arm.action)
        if arm.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if arm.action == "fail":
            raise InjectedFault(f"injected failure at {point}")
        return arm.action

    def hit(self, point: str) -> None:
        """Reach ``point`` from synchronous code."""
        if self._arms and self._fire(point) == "stall":
            deadline = time.monotonic() + self.stall_seconds
            while (pause := self._stall_left(point, deadline)) > 0:
                time.sleep(pause)

    async def ahit(self, point: str) -> bool:
        """Reach ``point`` from the event loop (a stall blocks only this task). True when
        ``rejoin`` fired there: the caller's to do."""
        action = self._fire(point) if self._arms else None
        if action == "stall":
            deadline = time.monotonic() + self.stall_seconds
            while (pause := self._stall_left(point, deadline)) > 0:
                await asyncio.sleep(pause)
        return action == "rejoin"


def parse(spec: str) -> dict[str, _Arm]:
    arms: dict[str, _Arm] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        point, _, rest = part.partition("=")
        action, _, nth = rest.partition("@")
        if point not in POINTS or action not in ACTIONS:
            raise SettingsError(
                "ACKLINE_FAULTS",
                f"{part!r} is not point=action[@n] with point in {sorted(POINTS)} "
                f"and action in {sorted(ACTIONS)}",
            )
        if action == "rejoin" and point not in REJOIN_POINTS:
            raise SettingsError(
                "ACKLINE_FAULTS", f"{part!r}: rejoin only at {sorted(REJOIN_POINTS)}"
            )
        if nth and not (nth.isdigit() and int(nth) >= 1):
            raise SettingsError("ACKLINE_FAULTS", f"{part!r}: @n must be a whole number >= 1")
        arms[point] = _Arm(action, int(nth) if nth else 1)
    return arms


DISARMED = Faults()
