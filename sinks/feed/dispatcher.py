"""The dispatcher: one agent run per request, a processor (docs/processors.md).

For every ``agent.requested`` event the feed delivers, the dispatcher starts one agent
run — here a row in ``agent_runs`` standing in for the real start — inside the
processor's batch transaction, which also advances its cursor
(:mod:`ackline.sinks.feed.processors.runner`). So a crash, a kill or a lost connection at
any point either keeps both the runs and the cursor or neither; a restarted dispatcher
continues exactly where the last commit left off. ``ackline process dispatcher`` runs it;
``ackline dispatch`` is the older name for the same thing (its cursor is named by
``--reader``).

It stays in the library rather than ``examples/``: its table is part of the shipped
schema (migration 0002) and ``ackline dispatch`` is a documented command.

Two guards make "one request, one run" exact:

1. the cursor: two instances of one processor cannot both commit the same batch (the
   compare-and-set on the cursor row lets one win; the other rolls back before any
   insert and reads on from the winner's cursor);
2. the primary key: ``agent_runs.request_id``. Ingest already deduplicates replays,
   producer retries and redeliveries (they never reach ``activity`` twice), but a request
   emitted again under a *new* txn_id is a second event: its insert does nothing and only
   ``deliveries`` counts it.

It has no ``reset``: forgetting which runs were started would start them again.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import asyncpg

from ackline.sinks.feed.processors.contract import ProcessorBatch
from ackline.sinks.feed.types import FeedEvent, Filter

REQUESTED: Final = "agent.requested"

ERASE_AGENT: Final = "UPDATE agent_runs SET agent_id = '' WHERE agent_id = $1"
"""How an operator clears an erased agent from the runs started (docs/retention.md,
erasure): its rows stay, the agent blanked. The request id is the second guard's key, as
the dedup keys are ingest's: a row deleted would start its request again if the request
were emitted anew under a new txn_id, which ingest takes as a new event."""

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
    """The processor: cursor ``name`` (shared by all its instances); the instance that
    started a run is recorded in ``agent_runs.dispatcher``."""

    filter: Final = Filter.of(types=[REQUESTED])

    def __init__(self, name: str = "dispatcher") -> None:
        self.name = name
        self.started = 0
        self.already_started = 0

    async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> Outcome:
        """Start the batch's runs inside the processor's transaction (set-based: one
        INSERT, and one UPDATE for requests that already had a run). Nothing commits here."""
        starts = plan_starts(batch.events)
        if not starts:
            return Outcome(0, 0)
        rows = await conn.fetch(
            _START,
            batch.instance,
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

    def committed(self, batch: ProcessorBatch, result: Outcome) -> None:
        """After COMMIT: the counts of `ackline dispatch`'s summary (agent_runs is the truth)."""
        self.started += result.started
        self.already_started += result.already_started


DISPATCHER: Final = Dispatcher()
