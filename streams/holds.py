"""Holding a partition at a record of a payload version newer than this worker knows.

During a rollout (docs/schema.md, "Evolving the schema") a worker that does not know a new
payload version yet may meet one. Rejecting it would dead-letter an event that the
upgraded workers accept; instead, with ``newer_version_wait_s`` > 0, the worker *holds*
the partition: it commits everything before the record, parks the record and every later
record of that partition in memory (the partition is paused, so that stays bounded), and
waits. The rollout stops this worker, the partition moves to a worker that knows the
version, which resumes from the PostgreSQL offset, i.e. at the held record.

If no such worker takes the partition within ``newer_version_wait_s``, the hold expires:
the parked records go back to the buffer in order, the held record is rejected as
``unsupported_version`` (reject row + dead-letter record, reprocessable), and so is every
later record of that type at that version or a higher one on this worker, at once, on
any partition it holds or takes over later (a hold already running at such a version
ends too): a producer sending bogus versions v3, v4, v5... stalls a partition for one
wait, not one per version. Nothing here commits or
acks: a hold only keeps records out of the next batches, so the offset stays below them.
Plain data, no Kafka calls: the consumer runtime pauses and resumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ackline.sinks.ingest.batch import TP

M = TypeVar("M")


@dataclass
class Hold(Generic[M]):
    offset: int
    since: float
    version: tuple[str, int]
    records: list[M] = field(default_factory=list)


class Holds(Generic[M]):
    """The partitions this worker holds, and the versions it gave up waiting for."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._held: dict[TP, Hold[M]] = {}
        self._expired: dict[TP, tuple[int, tuple[str, int]]] = {}
        self.given_up: set[tuple[str, int]] = set()

    def is_held(self, tp: TP) -> bool:
        return tp in self._held

    @property
    def held(self) -> dict[TP, Hold[M]]:
        return self._held

    def decide(self, tp: TP, offset: int, newer: tuple[str, int] | None, now: float) -> bool:
        """Hold ``tp`` at this record (True), or let it be rejected (False).

        ``newer`` is :attr:`ackline.schemas.decode.Rejection.newer`. A record whose hold expired
        is rejected, and its (type, version) is given up on for good.
        """
        expired = self._expired.pop(tp, None)
        if expired is not None and expired[0] == offset:
            self.given_up.add(expired[1])
            return False
        if newer is None or self.wait_s <= 0 or self.gave_up_on(newer):
            return False
        self._held[tp] = Hold(offset, now, newer)
        return True

    def park(self, tp: TP, record: M) -> None:
        self._held[tp].records.append(record)

    def gave_up_on(self, version: tuple[str, int]) -> bool:
        """True if this worker gave up waiting for ``version`` or a lower version of its
        type: no worker that knows it came within a wait."""
        kind, number = version
        return any(k == kind and number >= n for k, n in self.given_up)

    def due(self, now: float) -> list[TP]:
        """Held partitions whose wait is over, or whose version was given up on meanwhile
        (another partition's hold at it expired)."""
        return [
            tp
            for tp, h in self._held.items()
            if now - h.since >= self.wait_s or self.gave_up_on(h.version)
        ]

    def release(self, tp: TP) -> list[M]:
        """End the hold of ``tp`` after its wait; return its parked records, in order."""
        hold = self._held.pop(tp)
        self._expired[tp] = (hold.offset, hold.version)
        return hold.records

    def forget(self, tps: set[TP]) -> None:
        """Drop the holds of partitions this worker no longer owns (records are re-read)."""
        for tp in tps:
            self._held.pop(tp, None)
            self._expired.pop(tp, None)
