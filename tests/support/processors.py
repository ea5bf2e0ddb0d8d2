"""Processors for the tests (`ackline process tests.support.processors:JOURNAL`).

``journal`` appends one row per event it is handed, with no key: it is NOT idempotent,
so any event applied twice (or lost) shows in its table. ``typed`` is a journal with a
filter, in two versions (:data:`TYPED_V1`, :data:`TYPED_V2` widens it to
``agent.requested``), for a rolling deploy that changes a filter. ``picky`` is a journal that
raises on an event whose step ``thought`` is "poison", until the environment says the
bug is fixed (``PICKY_FIXED=1``). Their table is made by :data:`SETUP_SQL` (applied by
the test as the operator, or by ``ackline processors setup``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os

import asyncpg

from ackline.dev.toxiproxy import Api, Proxy
from ackline.sinks.feed.processors.contract import ProcessorBatch
from ackline.sinks.feed.types import Filter

SETUP_SQL = """
CREATE TABLE IF NOT EXISTS journal (
    processor text NOT NULL,
    event_id  uuid NOT NULL,
    instance  text NOT NULL,
    feed_xid  xid8 NOT NULL
);
GRANT SELECT, INSERT ON journal TO ackline_processor;
GRANT SELECT ON journal TO ackline_reader;
"""

_APPEND = """
INSERT INTO journal (processor, event_id, instance, feed_xid)
SELECT $1, unnest($2::uuid[]), $3, unnest($4::xid8[])
"""


class Journal:
    name = "journal"
    setup_sql = SETUP_SQL

    async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> int:
        await conn.execute(
            _APPEND,
            self.name,
            [e.event_id for e in batch.events],
            batch.instance,
            [e.commit_xid for e in batch.events],
        )
        return len(batch.events)

    async def reset(self, conn: asyncpg.Connection) -> None:
        await conn.execute("DELETE FROM journal WHERE processor = $1", self.name)


class PoisonError(Exception):
    """What picky raises on a poison step."""


class Picky(Journal):
    name = "picky"

    async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> int:
        fixed = os.environ.get("PICKY_FIXED") == "1"
        for e in batch.events:
            if not fixed and e.payload.get("thought") == "poison":
                raise PoisonError(f"cannot digest step {e.payload.get('step')} of {e.request_id}")
        return await super().apply(conn, batch)


class Lost(Journal):
    """A journal whose own code fails with an OSError (a file it needs is missing) on the
    step whose thought is "poison": an error of the processor, not of the database."""

    name = "lost"

    async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> int:
        for e in batch.events:
            if e.payload.get("thought") == "poison":
                raise FileNotFoundError(f"no model file for step {e.payload.get('step')}")
        return await super().apply(conn, batch)


class Dawdler(Journal):
    """A journal whose own code waits, its transaction idle, on the step whose thought is
    "poison" (``DAWDLE_S`` seconds: a slow lookup of its own), past the connection's
    ``idle_in_transaction_session_timeout``: the server ends the session under it."""

    name = "dawdler"

    async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> int:
        if any(e.payload.get("thought") == "poison" for e in batch.events):
            await asyncio.sleep(float(os.environ.get("DAWDLE_S", "2")))
        return await super().apply(conn, batch)


class LateDawdler(Journal):
    """:class:`Dawdler`, but its slow step comes after its statement: ``apply`` returns
    normally, and the runner's own next statement finds the session ended."""

    name = "late_dawdler"

    async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> int:
        n = await super().apply(conn, batch)
        if any(e.payload.get("thought") == "poison" for e in batch.events):
            await asyncio.sleep(float(os.environ.get("DAWDLE_S", "2")))
        return n


class SlowToConnect(Journal):
    """:class:`Dawdler` behind a Toxiproxy (``TOXIPROXY_API``, proxy ``TOXIPROXY_PROXY``)
    whose link to PostgreSQL turns slow while it dawdles the first time: a latency toxic
    of ``LATENCY_MS`` on everything PostgreSQL sends, so the runner's probe of the database
    (a new connection, then SELECT 1) is slow too (the test takes the toxic away). Each
    batch size it is handed with the poison is appended to the file ``SIZES_FILE``."""

    name = "slow_to_connect"

    async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> int:
        if any(e.payload.get("thought") == "poison" for e in batch.events):
            sizes = os.environ["SIZES_FILE"]
            with open(sizes, "a") as out:
                out.write(f"{len(batch.events)}\n")
            with open(sizes) as seen:
                first = len(seen.read().split()) == 1
            if first:
                proxy = Proxy(
                    Api(os.environ["TOXIPROXY_API"]), os.environ["TOXIPROXY_PROXY"], "", ""
                )
                proxy.add_latency("slow", int(os.environ["LATENCY_MS"]))
            await asyncio.sleep(float(os.environ.get("DAWDLE_S", "2")))
        return await super().apply(conn, batch)


class Swallower(Journal):
    """A journal that, on the step whose thought is "poison", catches a failing statement
    without a savepoint and goes on: its transaction is aborted when ``apply`` returns (a
    breach of the contract)."""

    name = "swallower"

    async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> int:
        n = await super().apply(conn, batch)
        if any(e.payload.get("thought") == "poison" for e in batch.events):
            with contextlib.suppress(asyncpg.DivisionByZeroError):
                await conn.execute("SELECT 1/0")  # its last statement: nothing else fails
        return n


REFUSED_AT_COMMIT_SQL = (
    SETUP_SQL
    + """
CREATE TABLE IF NOT EXISTS refused_at_commit (event_id uuid NOT NULL);
CREATE OR REPLACE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'event % refused at COMMIT', NEW.event_id;
END $$;
DROP TRIGGER IF EXISTS refuse_at_commit ON refused_at_commit;
CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON refused_at_commit
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_at_commit();
GRANT INSERT ON refused_at_commit TO ackline_processor;
"""
)


class RefusedAtCommit(Journal):
    """A journal whose tables refuse the step whose thought is "poison" only at COMMIT (a
    deferred constraint trigger, as a deferred foreign key would): ``apply`` and the
    runner's statements after it all go through."""

    name = "refused_at_commit"
    setup_sql = REFUSED_AT_COMMIT_SQL

    async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> int:
        n = await super().apply(conn, batch)
        poison = [e.event_id for e in batch.events if e.payload.get("thought") == "poison"]
        if poison:
            await conn.execute("INSERT INTO refused_at_commit SELECT unnest($1::uuid[])", poison)
        return n


class RollingBack(Journal):
    """A journal that, on the step whose thought is "poison", ends the batch's transaction
    itself with a ROLLBACK (error handling written without savepoints) and returns: a
    breach of the contract, its effects and the cursor gone with it."""

    name = "rolling_back"

    async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> int:
        n = await super().apply(conn, batch)
        if any(e.payload.get("thought") == "poison" for e in batch.events):
            await conn.execute("ROLLBACK")
        return n


class CommitsMidway(Journal):
    """A journal that, in a batch holding the step whose thought is "poison", writes the
    events before it, COMMITs them (the cursor, moved to the batch's end before ``apply``,
    with them), BEGINs again and raises: narrowing the failure down then read on from past
    the batch, and the events from the poison on were passed over in silence."""

    name = "commits_midway"

    async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> int:
        at = [i for i, e in enumerate(batch.events) if e.payload.get("thought") == "poison"]
        if not at:
            return await super().apply(conn, batch)
        await super().apply(conn, dataclasses.replace(batch, events=batch.events[: at[0]]))
        await conn.execute("COMMIT")
        await conn.execute("BEGIN")
        raise PoisonError("poisoned, after a COMMIT of its own")


JOURNAL = Journal()


class Miscounts(Journal):
    """A journal whose ``committed`` hook (in-memory statistics) raises on the batch
    holding the step whose thought is "poison", after that batch committed."""

    name = "miscounts"

    def committed(self, batch: ProcessorBatch, result: int) -> None:
        if any(e.payload.get("thought") == "poison" for e in batch.events):
            raise ZeroDivisionError("a statistic of the processor's own")


PICKY = Picky()
LOST = Lost()
MISCOUNTS = Miscounts()
DAWDLER = Dawdler()
LATE_DAWDLER = LateDawdler()
SLOW_TO_CONNECT = SlowToConnect()
SWALLOWER = Swallower()
REFUSED_AT_COMMIT = RefusedAtCommit()
ROLLING_BACK = RollingBack()
COMMITS_MIDWAY = CommitsMidway()


class Ops(Journal):
    """Named like a tail reader's cursor: it must not be able to take that cursor over."""

    name = "ops"


OPS = Ops()


class Typed(Journal):
    """A journal of the events its filter lets through: one name, a filter per version."""

    name = "typed"

    def __init__(self, types: list[str]) -> None:
        self.filter = Filter.of(types=types)


TYPED_V1 = Typed(["agent.started", "agent.step"])
TYPED_V2 = Typed(["agent.started", "agent.step", "agent.requested"])  # v2 dispatches too
