"""The example changefeed reader: one agent run per request.

For every ``agent.requested`` event the feed delivers, the dispatcher starts one agent
run — here a row in ``agent_runs`` standing in for the real start — in the same
transaction that advances its cursor (:meth:`ackline.sinks.feed.changefeed.Reader.next_batch`). So a
crash, a kill or a lost connection at any point either keeps both the runs and the cursor
or neither; a restarted dispatcher continues exactly where the last commit left off.

Two guards make "one request, one run" exact:

1. the cursor: two instances of one reader cannot both commit the same batch (the
   compare-and-set on the cursor row lets one win; the other rolls back before any
   insert and reads on from the winner's cursor);
2. the primary key: ``agent_runs.request_id``. Ingest already deduplicates replays,
   producer retries and redeliveries (they never reach ``activity`` twice), but a request
   emitted again under a *new* txn_id is a second event: its insert does nothing and only
   ``deliveries`` counts it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import asyncpg

from ackline.core.faults import DISARMED, Faults
from ackline.sinks.feed.changefeed import Changefeed, Committed, Reader, follow
from ackline.sinks.feed.types import Cursor, FeedBatch, FeedEvent, Filter

REQUESTED: Final = "agent.requested"

_START = """
INSERT INTO agent_runs (request_id, event_id, agent_id, feed_xid, dispatcher, deliveries)
SELECT u.request_id, u.event_id, u.agent_id, u.feed_xid, $1, u.deliveries
FROM unnest($2::text[], $3::uuid[], $4::text[], $5::xid8[], $6::int[])
    AS u(request_id, event_id, agent_id, feed_xid, deliveries)
ON CONFLICT (request_id) DO NOTHING
RETURNING request_id
"""

_REDELIVERED = """
UPDATE agent_runs AS r
SET deliveries = r.deliveries + u.deliveries
FROM unnest($1::text[], $2::int[]) AS u(request_id, deliveries)
WHERE r.request_id = u.request_id
"""


@dataclass(frozen=True, slots=True)
class Start:
    """One run to start: the first event asking for the request, and how many did."""

    request_id: str
    event_id: uuid.UUID
    agent_id: str
    feed_xid: int
    deliveries: int


def plan_starts(events: Sequence[FeedEvent]) -> list[Start]:
    """The runs a batch asks for: per request, its first ``agent.requested`` event in
    feed order, counting every such event; other event types are ignored."""
    first: dict[str, FeedEvent] = {}
    count: dict[str, int] = {}
    for e in events:
        if e.type != REQUESTED:
            continue
        first.setdefault(e.request_id, e)
        count[e.request_id] = count.get(e.request_id, 0) + 1
    return [Start(r, e.event_id, e.agent_id, e.commit_xid, count[r]) for r, e in first.items()]


@dataclass(frozen=True, slots=True)
class Outcome:
    started: int
    already_started: int


class Dispatcher:
    """Follows the feed under the reader name ``reader`` (shared by all its instances)."""

    def __init__(
        self,
        reader: str,
        instance: str,
        *,
        max_transactions: int = 64,
        faults: Faults = DISARMED,
    ) -> None:
        feed = Changefeed(Filter.of(types=[REQUESTED]), max_transactions=max_transactions)
        self.reader = Reader(reader, feed, faults=faults)
        self.instance = instance
        self.started = 0
        self.already_started = 0

    async def handle(self, conn: asyncpg.Connection, batch: FeedBatch) -> Outcome:
        """Start the batch's runs inside the reader's transaction (set-based: one INSERT,
        and one UPDATE for requests that already had a run). Nothing commits here."""
        starts = plan_starts(batch.events)
        if not starts:
            return Outcome(0, 0)
        rows = await conn.fetch(
            _START,
            self.instance,
            [s.request_id for s in starts],
            [s.event_id for s in starts],
            [s.agent_id for s in starts],
            [s.feed_xid for s in starts],
            [s.deliveries for s in starts],
        )
        inserted = {str(r["request_id"]) for r in rows}
        again = [s for s in starts if s.request_id not in inserted]
        if again:
            await conn.execute(
                _REDELIVERED, [s.request_id for s in again], [s.deliveries for s in again]
            )
        return Outcome(len(inserted), len(again))

    def _committed(self, done: Committed[Outcome]) -> None:
        self.started += done.result.started
        self.already_started += done.result.already_started

    async def run(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        stop: asyncio.Event,
        *,
        wait: bool = True,
        poll_interval: float = 2.0,
    ) -> Cursor:
        """Dispatch until ``stop`` (or until caught up when ``wait`` is False); see
        :func:`ackline.sinks.feed.changefeed.follow` for reconnects and waiting."""
        return await follow(
            self.reader,
            connect,
            self.handle,
            stop,
            wait=wait,
            poll_interval=poll_interval,
            on_commit=self._committed,
        )

    def summary(self, cursor: Cursor) -> dict[str, Any]:
        """Counted from confirmed commits only (``agent_runs`` is the truth)."""
        return {
            "reader": self.reader.name,
            "instance": self.instance,
            "started": self.started,
            "already_started": self.already_started,
            "transactions": self.reader.stats.transactions,
            "lost_races": self.reader.stats.lost_races,
            "cursor": cursor.encode(),
        }
