"""The changefeed's plain data and pure functions: cursors, filters, events, windows.

A *cursor* is a position in the feed of ingested rows. The feed is ordered by the xid8 of
the transaction that committed each ingest batch (``ingest_batches.commit_xid``), then,
inside one transaction, by ``(batch_id, partition, offset, topic)``. A cursor says what a
reader has consumed:

* ``Cursor(xid)``: every transaction whose xid is <= ``xid`` (encoded ``"<xid>"``);
* ``Cursor(xid, Position(...))``: every transaction below ``xid``, and the events of
  transaction ``xid`` up to and including that position (``"<xid>:<batch>:<partition>:
  <offset>:<topic>"``). Only a reader that stops inside a transaction (``--limit``) holds
  one; the next read finishes that transaction.

A cursor does not depend on filters: it is a place in the whole feed, so the same cursor
read with another filter misses nothing and repeats nothing of that filter's events.
Nothing here touches the network; :mod:`ackline.sinks.feed.changefeed` does the I/O.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Protocol

from ackline.schemas.envelope import EVENT_TYPES, format_timestamp
from ackline.sinks.errors import FeedError

MAX_BYTES: Final = 8 * 1024 * 1024
"""A read's payloads, in PostgreSQL's JSON text, before it is cut (as the ingest's
ACKLINE_BATCH_MAX_BYTES bounds a batch): decoded, they take several times that."""

XID8_MAX: Final = 2**64 - 1
INT64_MAX: Final = 2**63 - 1
INT32_MAX: Final = 2**31 - 1


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """An event's place inside its transaction: the feed's order within one xid."""

    batch_id: int
    partition: int
    offset: int
    topic: str


@dataclass(frozen=True, slots=True)
class Cursor:
    """What a reader has consumed; see the module docstring. ``START`` consumed nothing."""

    xid: int
    within: Position | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.xid <= XID8_MAX:
            raise FeedError(f"cursor xid {self.xid} is not an xid8 (0..2**64-1)")
        w = self.within
        if w is not None and not (
            0 <= w.batch_id <= INT64_MAX
            and 0 <= w.partition <= INT32_MAX
            and 0 <= w.offset <= INT64_MAX
            and w.topic
        ):
            raise FeedError(f"cursor position {w} is out of range")

    def encode(self) -> str:
        if self.within is None:
            return str(self.xid)
        w = self.within
        return f"{self.xid}:{w.batch_id}:{w.partition}:{w.offset}:{w.topic}"

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """Parse :meth:`encode`'s text; raise :class:`FeedError` on anything else."""
        parts = text.strip().split(":", 4)
        if len(parts) not in (1, 5) or not all(p.isascii() and p.isdigit() for p in parts[:4]):
            raise FeedError(
                f"cursor {text!r} is neither <xid> nor <xid>:<batch>:<partition>:<offset>:<topic>"
            )
        if len(parts) == 1:
            return cls(int(parts[0]))
        xid, batch, partition, offset, topic = parts
        return cls(int(xid), Position(int(batch), int(partition), int(offset), topic))

    def sort_key(self) -> tuple[int, int, tuple[int, int, int, str]]:
        """Feed order: a position inside ``xid`` comes before ``xid`` fully consumed."""
        if self.within is None:
            return (self.xid, 1, (0, 0, 0, ""))
        w = self.within
        return (self.xid, 0, (w.batch_id, w.partition, w.offset, w.topic))


START: Final = Cursor(0)
"""Nothing consumed: xid8 0 is InvalidTransactionId, below every real transaction."""


class Columns(Protocol):
    """A row read by column name (an asyncpg Record, a dict)."""

    def __getitem__(self, key: str, /) -> Any: ...


def stored_cursor(row: Columns, xid_column: str = "position") -> Cursor:
    """The cursor a stored row holds: its xid (``xid_column``) and, when ``within_batch``
    is set, the position inside that transaction (``within_batch``, ``within_partition``,
    ``within_offset``, ``within_topic``): the columns of ``feed_cursors`` and
    ``feed_processors``. Pure."""
    xid = int(row[xid_column])
    if row["within_batch"] is None:
        return Cursor(xid)
    return Cursor(
        xid,
        Position(
            int(row["within_batch"]),
            int(row["within_partition"]),
            int(row["within_offset"]),
            str(row["within_topic"]),
        ),
    )


@dataclass(frozen=True, slots=True)
class Filter:
    """Which events a reader wants; None means any. Filtering never moves the cursor
    differently: events it drops are consumed (passed over) like the others. Erasure
    notices (:data:`ERASED`) pass every filter."""

    types: frozenset[str] | None = None
    agents: frozenset[str] | None = None

    @classmethod
    def of(cls, types: Iterable[str] | None = None, agents: Iterable[str] | None = None) -> Filter:
        """Validate and build; an unknown type or an empty value is a FeedError, so a
        typo cannot silently select nothing."""
        type_set = frozenset(types) if types else None
        agent_set = frozenset(agents) if agents else None
        if type_set is not None:
            unknown = sorted(type_set - set(EVENT_TYPES))
            if unknown:
                raise FeedError(f"unknown event type(s) {unknown}; known: {list(EVENT_TYPES)}")
        if agent_set is not None and not all(a.strip() for a in agent_set):
            raise FeedError("an agent filter must not be empty")
        return cls(type_set, agent_set)

    def sql_args(self) -> tuple[list[str] | None, list[str] | None]:
        """The ``text[]`` parameters of the feed query (NULL matches everything)."""
        return (
            sorted(self.types) if self.types is not None else None,
            sorted(self.agents) if self.agents is not None else None,
        )


ALL: Final = Filter()


ERASED: Final = "ackline.erased"
"""The type of an erasure notice: the event ``event_id`` was erased (its content is gone);
``erasure_id`` names the audit row. Delivered whatever the reader's filter."""


@dataclass(frozen=True, slots=True)
class FeedEvent:
    """One activity row as the feed delivers it, with the cursor just after it, or an
    erasure notice (:data:`ERASED`: ``erasure_id`` set, ``agent_id``, ``request_id`` and
    ``payload`` empty, ``occurred_at`` the erasure's time, the position the erased
    event's)."""

    event_id: uuid.UUID
    txn_id: str
    type: str
    agent_id: str
    request_id: str
    occurred_at: datetime
    schema_version: int
    payload: dict[str, Any]
    batch_id: int
    commit_xid: int
    topic: str
    partition: int
    offset: int
    erasure_id: int | None = None

    @property
    def erased(self) -> bool:
        return self.erasure_id is not None

    @property
    def position(self) -> Position:
        return Position(self.batch_id, self.partition, self.offset, self.topic)

    @property
    def cursor(self) -> Cursor:
        """Resume here to get every event after this one (and none before)."""
        return Cursor(self.commit_xid, self.position)


@dataclass(frozen=True, slots=True)
class FeedBatch:
    """What one read returned: the events after ``start``, up to ``end`` inclusive.

    ``transactions`` counts the feed's transactions (ingest batches, erasures) the read
    passed whole: a read cut inside a transaction counts it only in the read that ends
    past it (:func:`passed`), so the counts of a reader's reads sum to the transactions
    it went through. ``pending`` is True when committed batches exist that cannot be read
    yet because an older transaction is still open (they will be, once it ends).
    """

    start: Cursor
    end: Cursor
    events: list[FeedEvent] = field(default_factory=list)
    transactions: int = 0
    pending: bool = False

    @property
    def caught_up(self) -> bool:
        """Nothing was readable: the reader is at the head of the readable feed (a read
        cut inside one large transaction passes none, yet moves on)."""
        return self.end == self.start

    @property
    def progress(self) -> int:
        """Events delivered or transactions passed: 0 only for a read at the head (how a
        cancelled read's sizes know that a read fit again, a filtered one too)."""
        return len(self.events) or self.transactions or (0 if self.caught_up else 1)


def erasure_notices(events: Iterable[FeedEvent]) -> int:
    """How many of ``events`` are erasure notices: a reader's cursor and a processor's
    report count them apart from the events applied. Pure."""
    return sum(1 for e in events if e.erased)


def passed(xids: Sequence[int], end: Cursor) -> int:
    """How many of a read window's transactions (``xids``) the read passed whole: those
    before the one it ended in, and that one too when it ended after it (``end.within``
    None). Pure."""
    return sum(1 for xid in xids if xid < end.xid or (xid == end.xid and end.within is None))


def window_end(
    start: Cursor, upper: int | None, events: Sequence[FeedEvent], limit: int | None
) -> tuple[list[FeedEvent], Cursor]:
    """Cut a read window to at most ``limit`` events and say where it ends.

    ``upper`` is the largest xid of the transactions the read covered (None: it covered
    none). Without a cut, the window consumed those transactions whole, filtered-out
    events included, so it ends at ``Cursor(upper)``; with a cut, it ends at the last
    event kept, and the rest of that transaction is read next time.
    """
    if limit is not None and limit < 1:
        raise FeedError(f"limit must be at least 1, not {limit}")
    if upper is None:
        return [], start
    if limit is not None and len(events) > limit:
        kept = list(events[:limit])
        return kept, kept[-1].cursor
    return list(events), Cursor(upper)


def event_json(event: FeedEvent) -> dict[str, Any]:
    """The JSON object `ackline tail` prints for one event."""
    return {
        "event_id": str(event.event_id),
        "type": event.type,
        "agent_id": event.agent_id,
        "request_id": event.request_id,
        "txn_id": event.txn_id,
        "occurred_at": format_timestamp(event.occurred_at),
        "payload": event.payload,
        "batch_id": event.batch_id,
        "cursor": event.cursor.encode(),
        **({} if event.erasure_id is None else {"erasure_id": event.erasure_id}),
    }


def event_line(event: FeedEvent) -> str:
    return json.dumps(event_json(event), ensure_ascii=False, separators=(",", ":"))
