"""The unit of work handed from the consumer runtime to the writer. Plain data."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from ackline.core.tuples import builder
from ackline.schemas.decode import Row

TP = tuple[str, int]
"""A partition: (topic, partition). The one name for it in every module."""


class Coord(NamedTuple):
    """Where a record came from in Kafka (named tuples here: one is made per event, and
    they cost a third of a frozen dataclass to build)."""

    topic: str
    partition: int
    offset: int


class Incoming(NamedTuple):
    """A decoded, validated event and its source coordinates."""

    coord: Coord
    row: Row


class Repeat(NamedTuple):
    """A record taken for an exact copy of a stored event (:mod:`ackline.schemas.exact`),
    not decoded: the writer confirms it against the ledger inside the batch's transaction,
    and decodes ``value`` only if the ledger no longer holds ``body_hash`` for ``txn_id``.
    ``at`` is its place in the batch: the number of the batch's events before it."""

    coord: Coord
    txn_id: str
    body_hash: bytes
    value: bytes
    at: int


new_coord: Final = builder(Coord)
"""Coord((topic, partition, offset)), once per event (ackline.core.tuples)."""
new_incoming: Final = builder(Incoming)
"""Incoming((coord, row)), once per event (ackline.core.tuples)."""
new_repeat: Final = builder(Repeat)
"""Repeat((coord, txn_id, body_hash, value, at)), once per exact copy (ackline.core.tuples)."""


@dataclass(frozen=True, slots=True)
class RejectRecord:
    """Poison: a record that did not decode or validate, already in the dead-letter topic."""

    coord: Coord
    reason: str
    detail: str
    raw_key: bytes | None
    raw_value: bytes | None
    headers: list[dict[str, str | None]]
    dlq_topic: str
    dlq_partition: int
    dlq_offset: int


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """The offsets a batch covers on one partition, and the epoch it was read under.

    ``next_offset`` is the offset after the last record of the batch, which is what the
    offset row holds once the batch commits. Offsets are not contiguous under
    read_committed (transaction markers, aborted records), so it is never computed as
    ``first_offset + count``.
    """

    topic: str
    partition: int
    first_offset: int
    next_offset: int
    epoch: int


@dataclass(slots=True)
class Batch:
    """Everything one PostgreSQL transaction commits, and the offsets it advances."""

    ranges: tuple[PartitionRange, ...]
    events: list[Incoming] = field(default_factory=list)
    rejects: list[RejectRecord] = field(default_factory=list)
    repeats: list[Repeat] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.events) + len(self.rejects) + len(self.repeats)

    def describe(self) -> str:
        return ", ".join(
            f"{r.topic}[{r.partition}]@{r.first_offset}..{r.next_offset - 1}" for r in self.ranges
        )


def with_rows(
    events: list[Incoming], repeats: list[Repeat], rows: dict[int, Incoming]
) -> tuple[list[Incoming], list[Repeat]]:
    """``events`` with the decoded repeats ``rows`` (by index in ``repeats``) put back in
    their places, and the repeats left, their places counted again. Pure."""
    merged: list[Incoming] = []
    left: list[Repeat] = []
    k = 0
    for i, rep in enumerate(repeats):
        merged.extend(events[k : rep.at])
        k = max(k, rep.at)
        row = rows.get(i)
        if row is None:
            left.append(rep._replace(at=len(merged)))
        else:
            merged.append(row)
    merged.extend(events[k:])
    return merged, left


def not_passed(
    coords: set[tuple[str, int, int]], ranges: Iterable[PartitionRange]
) -> set[tuple[str, int, int]]:
    """``coords`` ((topic, partition, offset)) but those that ``ranges`` of a committed
    batch passed: offsets are committed in order, so one below a range's end is behind."""
    ends = {(r.topic, r.partition): r.next_offset for r in ranges}
    return {c for c in coords if c[2] >= ends.get((c[0], c[1]), -1)}
