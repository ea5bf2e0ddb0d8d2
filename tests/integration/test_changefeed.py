"""The changefeed against a real PostgreSQL (and Kafka for the dispatcher).

* the skip anomaly is real: a writer with the lower batch id commits after a higher one,
  and a naive ``batch_id > last_seen`` reader loses it; the feed's reader does not;
* a reader holding an xid is refused; a failed handler rolls cursor and effects back;
* two instances of one reader: the loser of the cursor compare-and-set reads on, never
  the same events; under concurrent writers every event is delivered exactly once;
* NOTIFY wakes a follower long before its poll interval;
* `ackline tail` prints, cuts, resumes and commits cursors;
* `ackline dispatch` under replays, retries, redeliveries, aborted and conflicting
  sends, two instances at once and a SIGKILL between its inserts and its COMMIT.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from confluent_kafka import KafkaError, Message

from ackline.dev.ports import pick_free_port
from ackline.dev.postgres import PostgresNode, find_pg_bindir
from ackline.schemas import Envelope, new_envelope
from ackline.schemas.decode import Row, decode
from ackline.sinks.admin.erase import erase
from ackline.sinks.admin.migrate import load_migrations, migrate
from ackline.sinks.admin.partitions import apply_retention
from ackline.sinks.connection import Bounds, Database
from ackline.sinks.errors import FeedError
from ackline.sinks.feed.changefeed import Changefeed, LocalReader, Reader, connector, follow
from ackline.sinks.feed.dispatcher import ERASE_AGENT
from ackline.sinks.feed.follow import GAP_LOOK_EVERY_S, LAST_LOOK_S
from ackline.sinks.feed.types import START, Cursor, FeedBatch, Filter
from ackline.sinks.ingest.batch import Batch, Coord, Incoming, PartitionRange
from ackline.sinks.ingest.offsets import claim
from ackline.sinks.ingest.writer import BatchWriter, WriteResult
from ackline.streams.producer import ActivityProducer, serialize
from tests.integration.harness import (
    PointGate,
    Services,
    Worker,
    database_upto,
    db,
    next_utc_midnight,
    wait_until,
)

GROUP = "g"
TOPIC = "t"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
DELIVERIES = "CREATE TABLE deliveries (event_id uuid NOT NULL, instance text NOT NULL)"


# --- building blocks -----------------------------------------------------------------


def requested(
    req: str,
    agent: str,
    *,
    txn: str | None = None,
    eid: uuid.UUID | None = None,
    prompt: str = "summarise the incident",
) -> Envelope:
    return new_envelope(
        "agent.requested",
        txn_id=txn or f"req:{req}",
        agent_id=agent,
        request_id=req,
        payload={"prompt": prompt, "requested_by": "user-1", "priority": 1, "tools": ["search"]},
        occurred_at=T0,
        event_id=eid,
    )


def step(req: str, agent: str, i: int) -> Envelope:
    return new_envelope(
        "agent.step",
        txn_id=f"run-{req}:{i}",
        agent_id=agent,
        request_id=req,
        payload={"run_id": f"run-{req}", "step": i, "thought": "plan"},
        occurred_at=T0,
    )


def as_row(env: Envelope) -> Row:
    decoded = decode(serialize(env))
    assert isinstance(decoded, Row)
    return decoded


def batch_of(envs: list[Envelope], epoch: int, partition: int, first: int) -> Batch:
    events = [Incoming(Coord(TOPIC, partition, first + k), as_row(e)) for k, e in enumerate(envs)]
    rng = PartitionRange(TOPIC, partition, first, first + len(envs), epoch)
    return Batch(ranges=(rng,), events=events)


async def take(dsn: str, partitions: list[int]) -> dict[int, int]:
    conn = await asyncpg.connect(dsn)
    try:
        claims = await claim(conn, GROUP, "test", [(TOPIC, p) for p in partitions])
    finally:
        await conn.close()
    return {c.partition: c.epoch for c in claims}


async def write_steps(dsn: str, request: str, agent: str, n: int) -> None:
    """One ingested batch of ``n`` steps of ``request`` on partition 0, from offset 0."""
    epochs = await take(dsn, [0])
    database = Database(dsn)
    await BatchWriter(database, GROUP, "w").write(
        batch_of([step(request, agent, i) for i in range(n)], epochs[0], 0, 0)
    )
    await database.close()


async def ingest(dsn: str, batches: list[list[Envelope]], first: int = 0) -> None:
    """Each of ``batches`` ingested as one batch on partition 0, in order, from offset
    ``first``."""
    epochs = await take(dsn, [0])
    database = Database(dsn)
    try:
        writer = BatchWriter(database, GROUP, "w")
        for envs in batches:
            await writer.write(batch_of(envs, epochs[0], 0, first))
            first += len(envs)
    finally:
        await database.close()


async def write_batches(dsn: str, requests: list[str], size: int, first: int = 0) -> None:
    """One ingested batch of ``size`` steps per request, in order, on partition 0 from
    offset ``first``."""
    await ingest(dsn, [[step(r, "a1", i) for i in range(size)] for r in requests], first)


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


async def drain(
    feed: Changefeed, conn: asyncpg.Connection, cursor: Cursor
) -> tuple[list[Any], Cursor]:
    """Read until nothing is readable or pending (other transactions in the cluster can
    hold the horizon back for a moment); return the event ids in order and the cursor."""
    got: list[Any] = []

    async def step_() -> bool:
        nonlocal cursor
        batch = await feed.read(conn, cursor)
        got.extend(e.event_id for e in batch.events)
        cursor = batch.end
        return batch.caught_up and not batch.pending

    await eventually(step_, 60, "the feed to be caught up")
    return got, cursor


async def deliver_into_table(conn: asyncpg.Connection, batch: FeedBatch, instance: str) -> None:
    await conn.execute(
        "INSERT INTO deliveries (event_id, instance) SELECT unnest($1::uuid[]), $2",
        [e.event_id for e in batch.events],
        instance,
    )


# --- the anomaly --------------------------------------------------------------------


def test_naive_batch_id_cursor_skips_and_the_feed_does_not(dsn: str) -> None:
    """Writer A takes the lower batch id and commits after writer B. A reader that
    remembers the highest batch id it saw loses A's rows for good; the feed's reader,
    reading only below its snapshot's xmin, delivers A then B, each once."""

    async def go() -> None:
        epochs = await take(dsn, [0, 1])
        gate = PointGate("before_commit")
        db_a, db_b = Database(dsn), Database(dsn)
        writer_a = BatchWriter(db_a, GROUP, "wa", gate)
        writer_b = BatchWriter(db_b, GROUP, "wb")
        rows_a = [step("ra", "agent-a", i) for i in range(3)]
        rows_b = [step("rb", "agent-b", i) for i in range(3)]
        conn = await asyncpg.connect(dsn)
        reader = Reader("contract", Changefeed())
        try:
            await reader.position(conn)
            task_a = asyncio.create_task(writer_a.write(batch_of(rows_a, epochs[0], 0, 0)))
            await asyncio.wait_for(gate.reached.wait(), 30)
            result_b = await writer_b.write(batch_of(rows_b, epochs[1], 1, 0))

            # B is committed and visible; A is not.
            naive_last = 0
            naive_seen: list[Any] = []

            async def naive_poll() -> None:
                nonlocal naive_last
                rows = await conn.fetch(
                    "SELECT batch_id, event_id FROM activity WHERE batch_id > $1 "
                    "ORDER BY batch_id, src_partition, src_offset",
                    naive_last,
                )
                naive_seen.extend(r["event_id"] for r in rows)
                if rows:
                    naive_last = max(int(r["batch_id"]) for r in rows)

            await naive_poll()
            async with reader.next_batch(conn) as early:
                pass
            assert early.events == [] and early.caught_up
            assert early.pending, "B's committed batch waits behind A's open transaction"

            gate.release.set()
            result_a: WriteResult = await task_a
            assert result_a.batch_id < result_b.batch_id  # the setup of the anomaly
            await naive_poll()
            await naive_poll()

            delivered: list[Any] = []

            async def contract_poll() -> bool:
                async with reader.next_batch(conn) as batch:
                    delivered.extend(e.event_id for e in batch.events)
                return batch.caught_up and not batch.pending

            await eventually(contract_poll, 60, "the contract reader to catch up")
        finally:
            await conn.close()
            await db_a.close()
            await db_b.close()

        ids_a = [e.event_id for e in rows_a]
        ids_b = [e.event_id for e in rows_b]
        assert naive_seen == ids_b, "the naive reader saw B and, having passed it, never A"
        assert not set(ids_a) & set(naive_seen)
        assert delivered == ids_a + ids_b  # xid order: A began writing first
        assert reader.stats.delivered == 6

    asyncio.run(go())


# --- a database copied into another cluster ---------------------------------------------


def _burn_xids(dsn: str, n: int) -> None:
    """Make the source cluster's xids higher than a fresh cluster's after a restore."""

    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            for _ in range(n):
                await conn.fetchval("SELECT pg_current_xact_id()")  # one xid per statement
        finally:
            await conn.close()

    asyncio.run(go())


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr[-2000:]}"


def test_a_database_copied_into_another_cluster_is_refused_until_its_xid_epoch_is_moved(
    services: Services, dsn: str
) -> None:
    """pg_dump and restore (or logical replication) copy the feed's xids verbatim into a
    cluster whose own xids start over: the reader's cursor sorts after every batch the
    new cluster will write, so it skipped them all, silently (lag 0). The read now
    refuses, naming the cause, and the documented way out (``pg_resetwal -e``, an xid
    epoch above the old one, on the stopped copy) lets the reader go on exactly where
    it was: the copied batch is not read twice and the new one is read once."""
    _burn_xids(dsn, 3000)

    async def before() -> Cursor:
        epochs = await take(dsn, [0])
        db_ = Database(dsn)
        conn = await asyncpg.connect(dsn)
        try:
            await BatchWriter(db_, GROUP, "w").write(
                batch_of([step("old", "agent-o", i) for i in range(3)], epochs[0], 0, 0)
            )
            reader = Reader("moved")
            await reader.position(conn)
            async with reader.next_batch(conn) as batch:
                assert len(batch.events) == 3
            return await reader.position(conn)
        finally:
            await conn.close()
            await db_.close()

    cursor = asyncio.run(before())
    bindir = find_pg_bindir()
    state = Path(tempfile.mkdtemp(prefix="ackline-copy-", dir="/tmp"))
    state.chmod(0o755)  # PostgreSQL runs as an unprivileged user
    node = PostgresNode(state, pick_free_port())
    try:
        node.start()
        node.ensure_database("copy")
        roles, dump = state / "roles.sql", state / "feed.dump"
        _run([str(bindir / "pg_dumpall"), "-d", services.database_url, "--roles-only",
              "-f", str(roles)])  # fmt: skip
        _run([str(bindir / "psql"), "-q", "-d", node.dsn(), "-f", str(roles)])
        _run([str(bindir / "pg_dump"), "-Fc", "-d", dsn, "-f", str(dump)])
        _run([str(bindir / "pg_restore"), "--exit-on-error", "-d", node.dsn("copy"), str(dump)])
        copy = node.dsn("copy")

        async def read_copy() -> FeedBatch:
            conn = await asyncpg.connect(copy)
            try:
                now = int(await conn.fetchval("SELECT pg_current_xact_id()::text"))
                assert now < cursor.xid, "the copy's xids are not below the source's"
                return await Changefeed().read(conn, cursor)
            finally:
                await conn.close()

        with pytest.raises(FeedError, match="copied into another cluster"):
            asyncio.run(read_copy())

        node.stop()
        resetwal = [str(bindir / "pg_resetwal"), "-e", str((cursor.xid >> 32) + 1), "-D"]
        done = node._run_as_server_user([*resetwal, str(node.data_dir)], 60)
        assert done.returncode == 0, done.stderr
        node.start()

        async def after() -> list[Any]:
            epochs = await take(copy, [0])
            db_ = Database(copy)
            conn = await asyncpg.connect(copy)
            try:
                new = [step("new", "agent-n", i) for i in range(2)]
                await BatchWriter(db_, GROUP, "w").write(batch_of(new, epochs[0], 0, 3))
                reader = Reader("moved")
                got, _ = await drain(reader.feed, conn, await reader.position(conn))
                assert got == [e.event_id for e in new]
                return got
            finally:
                await conn.close()
                await db_.close()

        assert len(asyncio.run(after())) == 2
    finally:
        node.stop()
        shutil.rmtree(state, ignore_errors=True)


# --- the reader's transaction ----------------------------------------------------------


def test_a_read_inside_a_transaction_holding_an_xid_is_refused(dsn: str) -> None:
    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            reader = Reader("r", Changefeed())
            await reader.position(conn)
            async with conn.transaction():
                with pytest.raises(FeedError):
                    async with reader.next_batch(conn):
                        pass
                await conn.execute("SELECT pg_current_xact_id()")  # now it holds an xid
                with pytest.raises(FeedError, match="holds an xid"):
                    await Changefeed().read(conn, START)
        finally:
            await conn.close()

    asyncio.run(go())


def test_a_failing_handler_rolls_back_its_effects_and_the_cursor(dsn: str) -> None:
    async def go() -> None:
        await write_steps(dsn, "r1", "a1", 4)
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(DELIVERIES)
            reader = Reader("r", Changefeed())
            before = await reader.position(conn)
            with pytest.raises(RuntimeError):
                async with reader.next_batch(conn) as batch:
                    await deliver_into_table(conn, batch, "x")
                    raise RuntimeError("the side effect failed")
            assert len(batch.events) == 4
            assert await reader.position(conn) == before
            assert await conn.fetchval("SELECT count(*) FROM deliveries") == 0
            async with reader.next_batch(conn) as again:
                await deliver_into_table(conn, again, "x")
            assert [e.event_id for e in again.events] == [e.event_id for e in batch.events]
            assert await reader.position(conn) == again.end != before
            assert await conn.fetchval("SELECT count(*) FROM deliveries") == 4
        finally:
            await conn.close()

    asyncio.run(go())


def test_a_handler_that_swallows_a_database_error_does_not_pass_for_committed(dsn: str) -> None:
    """A statement that fails aborts the batch's transaction; a handler that catches the
    error and returns left COMMIT to roll back the side effects and the cursor without a
    word, and next_batch counted the batch as delivered: the same batch came again, for
    ever. It now raises, naming what happened."""

    async def go() -> None:
        await write_steps(dsn, "r2", "a2", 3)
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(DELIVERIES)
            reader = Reader("swallow", Changefeed())
            before = await reader.position(conn)
            with pytest.raises(FeedError, match="aborted"):
                async with reader.next_batch(conn) as batch:
                    await deliver_into_table(conn, batch, "x")
                    # the handler "handles" the error; the transaction is aborted
                    with contextlib.suppress(asyncpg.DivisionByZeroError):
                        await conn.execute("SELECT 1 / 0")
            assert reader.stats.delivered == 0
            assert await reader.position(conn) == before
            assert await conn.fetchval("SELECT count(*) FROM deliveries") == 0
        finally:
            await conn.close()

    asyncio.run(go())


def test_a_handler_s_own_failure_is_raised_not_retried_for_ever(dsn: str) -> None:
    """follow() retried whatever a handler raised that looked transient: `ackline tail >
    /dev/full` printed the same batch again and again, logging "transient error,
    reconnecting: [Errno 28] No space left on device". An OSError of the handler's own,
    with the connection open, is now raised."""

    async def go() -> None:
        await write_steps(dsn, "r3", "a3", 2)
        calls = 0

        async def handle(conn: asyncpg.Connection, batch: FeedBatch) -> None:
            nonlocal calls
            calls += 1
            raise OSError(errno.ENOSPC, "No space left on device")

        with pytest.raises(OSError, match="No space left"):
            async with asyncio.timeout(20):
                await follow(
                    Reader("full", Changefeed()), connector(dsn, "t"), handle, asyncio.Event()
                )
        assert calls == 1

    asyncio.run(go())


def test_a_handler_held_past_the_idle_timeout_stops_instead_of_repeating(dsn: str) -> None:
    """A handler slower than the server's idle_in_transaction_session_timeout (a slow
    consumer of `ackline tail --commit`): the server ended the session, follow()
    reconnected and handled the same batch again, for ever, its cursor never moving. It
    now stops with FeedError naming the setting."""

    async def go() -> None:
        await write_steps(dsn, "r4", "a4", 2)
        calls = 0

        async def handle(conn: asyncpg.Connection, batch: FeedBatch) -> None:
            nonlocal calls
            calls += 1
            await asyncio.sleep(1.5)

        connect = connector(dsn, "t", Bounds(idle_in_transaction_ms=300))
        with pytest.raises(FeedError, match="ACKLINE_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS"):
            async with asyncio.timeout(30):
                await follow(
                    Reader("slow", Changefeed()),
                    connect,
                    handle,
                    asyncio.Event(),
                    idle_in_transaction_s=0.3,
                )
        assert calls == 1

    asyncio.run(go())


def test_a_read_without_a_limit_is_cut_at_max_events(dsn: str) -> None:
    """From a hostile review: without a limit, one read held up to 64 whole transactions
    in memory (one erasure of a busy agent: millions of notices; 200,000 took 168 MB).
    A read is now cut at the feed's max_events, and the next one resumes inside the
    transaction."""

    async def go() -> None:
        await write_steps(dsn, "r5", "a5", 5_010)
        conn = await asyncpg.connect(dsn)
        try:
            reader = Reader("capped", Changefeed())  # the default: 5,000
            await reader.position(conn)
            async with reader.next_batch(conn) as first:
                pass
            async with reader.next_batch(conn) as second:
                pass
            assert (len(first.events), len(second.events)) == (5_000, 10)
            assert first.end.within is not None and second.end.within is None
        finally:
            await conn.close()

    asyncio.run(go())


def test_a_read_is_cut_at_max_bytes_of_payloads(dsn: str) -> None:
    """From a review: a read was bounded in events only, so 5,000 payloads of 1 MB held
    gigabytes. A read is now cut once its payloads pass max_bytes, inside the
    transaction, and resumes there; an event larger than max_bytes is still read, alone,
    so a reader always moves on. Every event once, in order."""
    big = "x" * 100_000

    async def go() -> None:
        epochs = await take(dsn, [0])
        envs = [
            new_envelope(
                "agent.step",
                txn_id=f"run-r7:{i}",
                agent_id="a7",
                request_id="r7",
                payload={"run_id": "run-r7", "step": i, "thought": big * (4 if i == 6 else 1)},
                occurred_at=T0,
            )
            for i in range(12)
        ]
        database = Database(dsn)
        await BatchWriter(database, GROUP, "w").write(batch_of(envs, epochs[0], 0, 0))
        await database.close()
        conn = await asyncpg.connect(dsn)
        try:
            feed = Changefeed(max_bytes=250_000)
            cursor, sizes, got = START, [], []
            while True:
                batch = await feed.read(conn, cursor)
                if batch.caught_up and not batch.pending:
                    break
                sizes.append(len(batch.events))
                got.extend(e.payload["step"] for e in batch.events)
                cursor = batch.end
            # payloads of ~100 kB: a read ends with the one that takes it past 250 kB;
            # step 6's 400 kB, larger than the bound, is read alone; then the feed asks
            # for twice what fitted (2), and doubles that once all of it came
            assert got == list(range(12)), got
            assert sizes == [3, 3, 1, 2, 3], sizes
            assert cursor.within is None
        finally:
            await conn.close()

    asyncio.run(go())


def test_a_cut_read_counts_only_the_transactions_it_passed(dsn: str) -> None:
    """From a review: a read cut by bytes counted every transaction of its window, so the
    cursor's stored total and the reader's stats counted each transaction again at every
    cut read. Three transactions of three 100 kB events read 250 kB at a time: the
    reads' counts sum to 3, and a read that ends inside its first transaction counts 0."""
    big = "x" * 100_000

    async def go() -> None:
        epochs = await take(dsn, [0])
        database = Database(dsn)
        writer = BatchWriter(database, GROUP, "w")
        for t in range(3):
            envs = [
                new_envelope(
                    "agent.step",
                    txn_id=f"run-r8:{t}:{i}",
                    agent_id="a8",
                    request_id="r8",
                    payload={"run_id": "run-r8", "step": 3 * t + i, "thought": big},
                    occurred_at=T0,
                )
                for i in range(3)
            ]
            await writer.write(batch_of(envs, epochs[0], 0, 3 * t))
        await database.close()
        conn = await asyncpg.connect(dsn)
        try:
            reader = Reader("cut", Changefeed(max_bytes=250_000))
            await reader.position(conn)
            counts, got = [], []

            async def step_() -> bool:
                async with reader.next_batch(conn) as batch:
                    counts.append(batch.transactions)
                    got.extend(e.payload["step"] for e in batch.events)
                return batch.caught_up and not batch.pending

            await eventually(step_, 60, "the reader to catch up")
            assert got == list(range(9)), got
            assert counts[0] == 0, counts  # it ended on the first transaction, cut
            assert sum(counts) == reader.stats.transactions == 3, counts
            stored = await conn.fetchval(
                "SELECT transactions FROM feed_cursors WHERE reader = 'cut'"
            )
            assert stored == 3
        finally:
            await conn.close()

    asyncio.run(go())


def test_a_read_the_server_cancels_shrinks_and_names_the_setting(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """From a review: a read the server cancels (a statement_timeout shorter than one read)
    was retried at the same size for ever. Each cancel of the feed's read now halves the
    next one, down to one event, where an ERROR names statement_timeout; once the reads
    fit (here: the lock that made them wait is gone) the reader goes on at the smaller
    size, growing back after 16 answered reads, and delivers every event once. The
    transactions a read spans halve with each cancel and grow back the same way. A cancel
    of anything else (here the cursor's read, behind a lock on feed_cursors) is retried
    at the same size."""
    caplog.set_level(logging.WARNING, logger="ackline.sinks.feed.follow")

    async def lock(table: str) -> tuple[asyncpg.Connection, Any]:
        conn = await asyncpg.connect(dsn)
        tx = conn.transaction()
        await tx.start()
        await conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        return conn, tx

    async def go() -> None:
        await write_steps(dsn, "r6", "a6", 40)
        plain = connector(dsn, "t")

        async def connect() -> asyncpg.Connection:
            conn = await plain()
            await conn.execute("SET statement_timeout = 100")
            return conn

        delivered: list[Any] = []
        sizes: list[int] = []
        cancels: list[BaseException] = []

        async def handle(conn: asyncpg.Connection, batch: FeedBatch) -> None:
            delivered.extend(e.event_id for e in batch.events)

        async def count(n: int) -> bool:
            return len(cancels) >= n

        cursors, cursors_tx = await lock("feed_cursors")
        reading = asyncio.create_task(
            follow(
                Reader("shrunk", Changefeed(max_events=8)),
                connect,
                handle,
                asyncio.Event(),
                wait=False,
                on_commit=lambda c: sizes.append(len(c.batch.events)),
                on_transient=cancels.append,
            )
        )
        try:
            await eventually(lambda: count(2), 30, "two cancels of the cursor's read")
            assert "reading at most" not in caplog.text  # not the feed's read: same size
            feed, feed_tx = await lock("activity")
            await cursors_tx.rollback()

            async def one_event() -> bool:
                return "the read of one event" in caplog.text

            try:
                await eventually(one_event, 60, "reads cancelled down to one event")
            finally:
                await feed_tx.rollback()
                await feed.close()
        finally:
            await cursors.close()
        await asyncio.wait_for(reading, 60)
        assert all(isinstance(e, asyncpg.exceptions.QueryCanceledError) for e in cancels)
        said = [r.getMessage() for r in caplog.records if "reading at most" in r.getMessage()]
        # the transactions a read spans halve too: the statement sorts all their keys
        # before it cuts at the events asked for, so fewer events alone may not fit
        assert [m.split("at most ", 1)[1] for m in said] == [
            "4 event(s) of at most 32 transaction(s) a batch",
            "2 event(s) of at most 16 transaction(s) a batch",
            "1 event(s) of at most 8 transaction(s) a batch",
        ], said
        assert len(delivered) == len(set(delivered)) == 40
        assert sizes[:16] == [1] * 16 and max(sizes) == 2, sizes  # doubled after 16 reads

    asyncio.run(go())


def test_a_read_too_slow_for_its_window_shrinks_the_window_not_only_the_events(dsn: str) -> None:
    """The statement sorts the keys of every event of the transactions a read spans
    (64) before it cuts at the events asked for. A statement_timeout shorter than that
    sort cancelled every read: the events asked for halved down to one, the window did
    not, and the reader retried the same read for ever. The window now halves with each
    cancel too. Calibrated on this host: the timeout sits between a read of one event
    over 64 transactions and one over a single transaction."""

    async def go() -> None:
        await write_batches(dsn, [f"r{b}" for b in range(64)], 1000)

        async def one_read(window: int) -> float:
            conn = await asyncpg.connect(dsn)
            try:
                feed, best = Changefeed(max_transactions=window), float("inf")
                for _ in range(3):
                    began = time.perf_counter()
                    await feed.read(conn, START, 1)
                    best = min(best, time.perf_counter() - began)
                return best
            finally:
                await conn.close()

        wide, narrow = await one_read(64), await one_read(1)
        assert wide > 6 * narrow, (wide, narrow)  # else the window is not what costs
        timeout_ms = max(1, round(1000 * (wide * narrow) ** 0.5))
        plain = connector(dsn, "t")

        async def connect() -> asyncpg.Connection:
            conn = await plain()
            await conn.execute(f"SET statement_timeout = {timeout_ms}")
            return conn

        delivered: list[Any] = []

        async def handle(conn: asyncpg.Connection, batch: FeedBatch) -> None:
            delivered.extend(e.event_id for e in batch.events)

        feed = Changefeed()
        await asyncio.wait_for(
            follow(LocalReader(feed), connect, handle, asyncio.Event(), limit=50), 60
        )
        assert feed.cancelled > 0 and feed.window < 64, (feed.cancelled, feed.window)
        assert len(delivered) == len(set(delivered)) >= 50, (len(delivered), timeout_ms)

    asyncio.run(go())


def test_a_filtered_reader_s_window_grows_back_over_transactions_it_filters_out(
    dsn: str,
) -> None:
    """From a review: after cancelled reads the window grew back only on reads that
    returned events, so a filtered reader passing transactions it filters out (a
    processor's filter, `tail --agent`) read one small window at a time for good. A read
    that passed transactions counts now."""

    async def go() -> None:
        await write_batches(dsn, [f"r{k}" for k in range(200)], 1)
        feed = Changefeed(Filter.of(agents=["nobody"]))
        locker = await asyncpg.connect(dsn)
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("SET statement_timeout = 100")
            tx = locker.transaction()
            await tx.start()
            await locker.execute("LOCK TABLE activity IN ACCESS EXCLUSIVE MODE")
            for _ in range(3):
                with pytest.raises(asyncpg.exceptions.QueryCanceledError):
                    await feed.read(conn, START)
            await tx.rollback()
            await conn.execute("SET statement_timeout = 0")  # no cancel from a slow moment
            assert feed.window == 8
            cursor, reads = START, 0
            while True:
                batch = await feed.read(conn, cursor)
                if batch.caught_up:
                    break
                assert batch.events == []
                cursor, reads = batch.end, reads + 1
            # 16 reads of 8 transactions, then of 16: the window grew back
            assert feed.window == 16 and reads == 16 + 5, (feed.window, reads)
        finally:
            await conn.close()
            await locker.close()

    asyncio.run(go())


def test_a_one_shot_read_held_behind_an_open_transaction_names_it(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """From a review: `tail` without --follow and `dispatch --once` waited in silence while
    a transaction left open anywhere in the cluster held committed batches back. After
    5 s the reader names the oldest open transaction (here a session of the test's, idle
    in it), then reads the batches once it ends."""
    caplog.set_level(logging.WARNING, logger="ackline.sinks.feed.follow")

    async def go() -> None:
        holder = await asyncpg.connect(dsn, server_settings={"application_name": "the-holder"})
        open_tx = holder.transaction()
        await open_tx.start()
        await holder.fetchval("SELECT pg_current_xact_id()")  # an xid older than the batch
        await write_steps(dsn, "r7", "a7", 3)
        got: list[Any] = []

        async def handle(conn: asyncpg.Connection, batch: FeedBatch) -> None:
            got.extend(e.event_id for e in batch.events)

        reading = asyncio.create_task(
            follow(
                Reader("held", Changefeed()),
                connector(dsn, "t"),
                handle,
                asyncio.Event(),
                wait=False,
            )
        )

        async def named() -> bool:
            return "session" in caplog.text and "the-holder" in caplog.text

        try:
            await eventually(named, 30, "the reader to name the open transaction")
            assert not reading.done() and got == []
        finally:
            await open_tx.rollback()
            await holder.close()
        await asyncio.wait_for(reading, 30)
        assert len(got) == 3

    asyncio.run(go())


def test_a_connection_lost_mid_batch_reconnects_and_delivers_once(dsn: str) -> None:
    """The reader's backend is terminated after its side effects, before COMMIT: the
    transaction is gone, follow() reconnects, reads the stored cursor and delivers the
    same batch again; the table holds each event once."""

    async def go() -> tuple[int, list[Any]]:
        await write_batches(dsn, [f"r{k}" for k in range(3)], 3)
        admin = await asyncpg.connect(dsn)
        await admin.execute(DELIVERIES)
        handled: list[Any] = []
        stop = asyncio.Event()

        async def handle(conn: asyncpg.Connection, batch: FeedBatch) -> None:
            await deliver_into_table(conn, batch, "x")
            handled.extend(e.event_id for e in batch.events)
            if len(handled) == 6:  # the second batch: lose the connection before COMMIT
                await admin.execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())

        reader = Reader("lossy", Changefeed(max_transactions=1))
        await follow(reader, connector(dsn, "lossy"), handle, stop, wait=False)
        await admin.close()
        return reader.stats.delivered, handled

    delivered, handled = asyncio.run(go())
    rows = db(dsn, "SELECT event_id, count(*) AS n FROM deliveries GROUP BY event_id")
    assert len(rows) == 9 and all(r["n"] == 1 for r in rows)
    assert len(handled) == 12 and handled[3:6] == handled[6:9]  # batch 2 handled twice
    assert delivered == 9  # counted after COMMIT only


# --- two instances of one reader ---------------------------------------------------------


def test_the_loser_of_the_cursor_race_reads_on_from_the_winner(dsn: str) -> None:
    """A holds the batch (cursor updated, not committed); B reads the same cursor, blocks
    on the cursor row, loses the compare-and-set when A commits, and reads on."""

    async def go() -> None:
        epochs = await take(dsn, [0])
        database = Database(dsn)
        writer = BatchWriter(database, GROUP, "w")
        await writer.write(batch_of([step("r1", "a1", i) for i in range(3)], epochs[0], 0, 0))
        first = [step("r2", "a1", i) for i in range(2)]
        conn_a, conn_b, watch = [await asyncpg.connect(dsn) for _ in range(3)]
        try:
            await conn_a.execute(DELIVERIES)
            a = Reader("shared", Changefeed(max_transactions=1))
            b = Reader("shared", Changefeed(max_transactions=1))
            await a.position(conn_a)
            got_b: list[Any] = []

            async def run_b() -> None:
                async with b.next_batch(conn_b) as batch:
                    await deliver_into_table(conn_b, batch, "b")
                    got_b.extend(e.event_id for e in batch.events)

            async with a.next_batch(conn_a) as batch_a:
                task_b = asyncio.create_task(run_b())
                pid_b = conn_b.get_server_pid()

                async def b_waits_on_the_row_lock() -> bool:
                    return bool(
                        await watch.fetchval(
                            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
                            pid_b,
                        )
                    )

                await eventually(b_waits_on_the_row_lock, 30, "B to block on the cursor row")
                await deliver_into_table(conn_a, batch_a, "a")
                # a second batch commits while B waits: B must get it after its retry
                await writer.write(batch_of(first, epochs[0], 0, 3))
            await asyncio.wait_for(task_b, 60)
        finally:
            for c in (conn_a, conn_b, watch):
                await c.close()
            await database.close()
        assert len(batch_a.events) == 3
        assert b.stats.lost_races == 1
        assert not set(got_b) & {e.event_id for e in batch_a.events}
        # B read on from A's cursor: the second batch, or nothing yet if another
        # transaction in the cluster still held the horizon below it
        assert got_b in ([], [e.event_id for e in first])

    asyncio.run(go())
    rows = db(dsn, "SELECT event_id, count(*) AS n FROM deliveries GROUP BY event_id")
    assert len(rows) >= 3 and all(r["n"] == 1 for r in rows)


def test_two_instances_under_concurrent_writers_deliver_each_event_once(dsn: str) -> None:
    async def go() -> None:
        partitions = [0, 1, 2]
        epochs = await take(dsn, partitions)
        setup = await asyncpg.connect(dsn)
        await setup.execute(DELIVERIES)
        await setup.close()
        stop = asyncio.Event()
        readers = [Reader("shared", Changefeed(max_transactions=2)) for _ in range(2)]

        def runner(instance: int) -> Coroutine[Any, Any, Cursor]:
            async def handle(conn: asyncpg.Connection, batch: FeedBatch) -> None:
                await deliver_into_table(conn, batch, str(instance))

            return follow(
                readers[instance],
                connector(dsn, f"reader-{instance}"),
                handle,
                stop,
                poll_interval=0.5,
            )

        async def write(partition: int) -> int:
            database = Database(dsn)
            writer = BatchWriter(database, GROUP, f"w{partition}")
            total = 0
            for k in range(25):
                envs = [step(f"r{partition}-{k}", f"a{partition}", i) for i in range(4)]
                await writer.write(batch_of(envs, epochs[partition], partition, k * 4))
                total += len(envs)
            await database.close()
            return total

        tasks = [asyncio.create_task(runner(i)) for i in range(2)]
        written = sum(await asyncio.gather(*(write(p) for p in partitions)))

        async def all_delivered() -> bool:
            for t in tasks:
                if t.done():
                    t.result()  # surface a reader's crash
            return sum(r.stats.delivered for r in readers) >= written

        await eventually(all_delivered, 60, "every event delivered")
        stop.set()
        await asyncio.gather(*tasks)
        assert written == 300
        assert sum(r.stats.delivered for r in readers) == 300

    asyncio.run(go())
    rows = db(dsn, "SELECT event_id, count(*) AS n FROM deliveries GROUP BY event_id")
    activity = db(dsn, "SELECT event_id FROM activity")
    assert {r["event_id"] for r in rows} == {r["event_id"] for r in activity}
    assert all(r["n"] == 1 for r in rows), "an event was delivered twice"
    stored = db(dsn, "SELECT delivered FROM feed_cursors WHERE reader = 'shared'")
    assert stored[0]["delivered"] == 300


# --- waking --------------------------------------------------------------------------------


def test_notify_wakes_a_follower_long_before_its_poll_interval(dsn: str) -> None:
    async def go() -> None:
        epochs = await take(dsn, [0])
        stop = asyncio.Event()
        seen: list[Any] = []
        reads: list[FeedBatch] = []

        async def handle(conn: asyncpg.Connection, batch: FeedBatch) -> None:
            reads.append(batch)
            seen.extend(e.event_id for e in batch.events)

        reader = LocalReader(Changefeed())
        task = asyncio.create_task(
            follow(reader, connector(dsn, "waker"), handle, stop, poll_interval=120)
        )

        async def idle() -> bool:
            return bool(reads) and reads[-1].caught_up and not reads[-1].pending

        await eventually(idle, 30, "the follower to be caught up and asleep")
        envs = [step("r1", "a1", i) for i in range(3)]
        database = Database(dsn)
        t0 = time.monotonic()
        await BatchWriter(database, GROUP, "w").write(batch_of(envs, epochs[0], 0, 0))
        await database.close()

        async def arrived() -> bool:
            return len(seen) == 3

        await eventually(arrived, 30, "the follower to get the batch")
        latency = time.monotonic() - t0
        stop.set()
        await task
        assert seen == [e.event_id for e in envs]
        assert latency < 30  # the poll interval was two minutes: NOTIFY woke it

    asyncio.run(go())


# --- `ackline tail` --------------------------------------------------------------------------


def _ackline(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``ackline ARGS`` against ``dsn``, faults disarmed; its status and output."""
    env = {**os.environ, "ACKLINE_DATABASE_URL": dsn}
    env.pop("ACKLINE_FAULTS", None)
    return subprocess.run(
        [sys.executable, "-m", "ackline", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _tail(dsn: str, *args: str) -> tuple[list[dict[str, Any]], str]:
    done = _ackline(dsn, "tail", *args)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    return lines, done.stderr


def test_tail_prints_filters_cuts_resumes_and_commits(dsn: str) -> None:
    async def setup() -> list[Envelope]:
        epochs = await take(dsn, [0, 1])
        database = Database(dsn)
        writer = BatchWriter(database, GROUP, "w")
        first = [requested("r1", "a1"), step("r1", "a1", 1), requested("r2", "a2")]
        second = [step("r2", "a2", 1), requested("r3", "a1"), step("r3", "a1", 1)]
        await writer.write(batch_of(first, epochs[0], 0, 0))
        await writer.write(batch_of(second, epochs[1], 1, 0))
        await database.close()
        return first + second

    envs = asyncio.run(setup())
    ids = [str(e.event_id) for e in envs]
    everything, _ = _tail(dsn, "--from-start")
    assert [o["event_id"] for o in everything] == ids
    assert set(everything[0]) >= {
        "event_id",
        "type",
        "agent_id",
        "request_id",
        "occurred_at",
        "payload",
        "batch_id",
        "cursor",
    }
    assert everything[0]["payload"]["prompt"] == "summarise the incident"

    wanted, _ = _tail(dsn, "--from-start", "--type", "agent.requested", "--agent", "a1")
    assert [o["request_id"] for o in wanted] == ["r1", "r3"]

    # reads of one event each (cut inside every transaction): the same lines, once each
    small, _ = _tail(dsn, "--from-start", "--batch-events", "1")
    assert small == everything
    # reads of one payload's bytes each: each ends after its first event, as above
    assert _tail(dsn, "--from-start", "--batch-bytes", "1")[0] == everything

    # cut inside the first transaction, resume from the last line's cursor
    head, _ = _tail(dsn, "--from-start", "--limit", "2")
    rest, stderr = _tail(dsn, "--from-cursor", head[-1]["cursor"])
    assert [o["event_id"] for o in head + rest] == ids
    final = stderr.strip().rsplit(" ", 1)[-1]
    assert _tail(dsn, "--from-cursor", final)[0] == []

    # a committed reader: two runs of --limit 4 then --limit 4 see everything once
    a, _ = _tail(dsn, "--reader", "ops", "--commit", "--limit", "4")
    peek, _ = _tail(dsn, "--reader", "ops")  # read-only: does not move the cursor
    b, _ = _tail(dsn, "--reader", "ops", "--commit", "--limit", "4")
    assert [o["event_id"] for o in a] == ids[:4]
    assert peek == b
    assert [o["event_id"] for o in a + b] == ids
    stored = db(dsn, "SELECT delivered FROM feed_cursors WHERE reader = 'ops'")
    assert stored[0]["delivered"] == 6

    bad = _ackline(dsn, "tail", "--from-start", "--type", "agent.teleported")
    assert bad.returncode == 2 and "agent.teleported" in bad.stderr


def test_a_reader_starting_behind_a_retention_drop_is_told_what_the_feed_lost(dsn: str) -> None:
    """A cursor kept outside feed_cursors (`tail --from-cursor`), or a reader a forced
    drop left behind, starts behind events retention dropped: the feed goes on from the
    first batch it still holds, and nothing said some were taken. Each now says so at
    WARNING as it starts (a stored reader left behind at the start too); a reader from the
    start (a new one too) says it at INFO, and one
    that starts after the drop's events says nothing. A batch of the dropped day that
    commits after the drop (into a partition made anew) is not counted lost."""
    asyncio.run(write_batches(dsn, ["r-old"], 3))
    _, end = _tail(dsn, "--from-start")
    past_old = end.strip().rsplit(" ", 1)[-1]  # the cursor after the old events
    kept, _ = _tail(dsn, "--reader", "keep", "--commit", "--limit", "1")  # behind the drop
    assert len(kept) == 1
    db(dsn, "INSERT INTO feed_cursors (reader) VALUES ('zero')")  # stored, read nothing yet
    dropped = asyncio.run(_apply_retention(dsn, next_utc_midnight(dsn)))
    assert [d.readers_behind for d in dropped if d.dropped] == [("keep", "zero")], dropped
    asyncio.run(write_batches(dsn, ["r-new"], 2, first=3))  # into a partition made anew
    cases = {
        "warning": [
            ["--from-cursor", "1"],
            ["--reader", "keep", "--commit"],
            ["--reader", "zero", "--commit"],  # left behind at the start: not a new reader
        ],
        "info": [["--from-start"], ["--reader", "late", "--follow"]],  # late: made now
    }
    for level, runs in cases.items():
        for args in runs:
            if "--follow" in args:
                lines, err = _tail_until_caught_up(dsn, *args)
            else:
                lines, err = _tail(dsn, *args)
            assert [o["request_id"] for o in lines] == ["r-new", "r-new"], (args, lines)
            said = [json.loads(x) for x in err.splitlines() if "retention dropped 1 " in x]
            assert [x["level"] for x in said] == [level], (args, err)
    lines, err = _tail(dsn, "--from-cursor", past_old)
    assert [o["request_id"] for o in lines] == ["r-new", "r-new"]
    assert "retention dropped" not in err, err


def test_a_running_reader_behind_a_forced_drop_is_told_while_it_runs(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A reader already running is behind when `retention --force` drops a partition
    holding events after its cursor (here `tail` reading the backlog into a slow
    consumer: its first batch's lines wait, in no transaction, while the drop runs). It
    looked at the drops only as it started: it read on from the first batch the feed
    still held, in silence. It now notices the new drop while it runs and says so at
    WARNING, as a reader starting behind one does."""
    caplog.set_level(logging.INFO, logger="ackline.sinks.feed.follow")
    tomorrow = next_utc_midnight(dsn)

    async def go() -> None:
        await write_batches(dsn, ["r1", "r2", "r3"], 2)  # three batches of today's partition
        got: list[str] = []
        first_read = asyncio.Event()
        dropped = asyncio.Event()

        async def handle(conn: asyncpg.Connection, batch: FeedBatch) -> None:
            got.extend(e.request_id for e in batch.events)
            if got and not first_read.is_set():
                first_read.set()
                await dropped.wait()  # the slow consumer: r2 and r3 not read yet

        stop = asyncio.Event()
        reading = asyncio.create_task(
            follow(
                LocalReader(Changefeed(max_transactions=1)),
                connector(dsn, "t"),
                handle,
                stop,
                poll_interval=0.2,
            )
        )
        try:
            await asyncio.wait_for(first_read.wait(), 30)
            took = await _apply_retention(dsn, tomorrow)
            assert [d.dropped for d in took] == [True], took
            await write_batches(dsn, ["r-new"], 2, first=6)  # into a partition made anew
            dropped.set()

            async def told() -> bool:
                return any("retention dropped 1 partition(s)" in r.message for r in caplog.records)

            await eventually(told, 30, "the running reader to say what the drop took")
            assert not reading.done()
        finally:
            stop.set()
            await asyncio.wait_for(reading, 30)
        assert got == ["r1", "r1", "r-new", "r-new"]  # r2 and r3 went with the partition
        said = [r for r in caplog.records if "retention dropped" in r.message]
        assert [(r.levelno, r.message.split(":")[0]) for r in said] == [
            (logging.WARNING, "reader (local)")
        ], caplog.text

    asyncio.run(go())


def _follow_as_s(
    dsn: str, got: list[str], stop: asyncio.Event, on_commit: Callable[[Any], None] | None = None
) -> asyncio.Task[Cursor]:
    """Stored reader "s" following the feed a transaction at a time into ``got``."""

    async def handle(conn: asyncpg.Connection, batch: FeedBatch) -> None:
        got.extend(e.request_id for e in batch.events)

    return asyncio.create_task(
        follow(
            Reader("s", Changefeed(max_transactions=1)),
            connector(dsn, "t"),
            handle,
            stop,
            poll_interval=0.2,
            on_commit=on_commit,
        )
    )


def test_a_stored_reader_is_not_warned_of_an_unforced_drop_of_what_it_had_read(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Retention drops unforced only once every stored reader has read past (its
    readers_behind is empty). A running stored reader that read the partition within the
    5 s before the drop was warned all the same: the drop was measured from its cursor at
    its previous look. It is told only of a drop that named it as left behind."""
    caplog.set_level(logging.INFO, logger="ackline.sinks.feed.follow")
    tomorrow = next_utc_midnight(dsn)

    async def go() -> None:
        await write_batches(dsn, ["r1", "r2", "r3"], 2)
        got: list[str] = []
        stop = asyncio.Event()
        reading = _follow_as_s(dsn, got, stop)
        try:
            for _ in range(500):
                if len(got) == 6:
                    break
                await asyncio.sleep(0.02)
            assert len(got) == 6, got
            took = await _apply_retention(dsn, tomorrow, force=False)
            assert [(d.dropped, list(d.readers_behind)) for d in took] == [(True, [])], took
            await write_batches(dsn, ["r-new"], 2, first=6)
            await asyncio.sleep(GAP_LOOK_EVERY_S + 2)  # past the next look
        finally:
            stop.set()
            await asyncio.wait_for(reading, 30)
        assert got[-2:] == ["r-new", "r-new"], got
        said = [r for r in caplog.records if "retention dropped" in r.message]
        assert said == [], [(r.levelname, r.message) for r in said]

    asyncio.run(go())


def test_a_stored_reader_left_behind_by_a_forced_drop_is_told_while_it_runs(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The same stored reader, running and behind (between two transactions: its
    handler's transaction would hold the drop's DETACH) when a forced drop names it as
    left behind, is told at WARNING, once."""
    caplog.set_level(logging.INFO, logger="ackline.sinks.feed.follow")
    tomorrow = next_utc_midnight(dsn)
    took: list[Any] = []
    dropping_once: list[bool] = []

    def drop_in_a_thread() -> None:
        took.extend(asyncio.run(_apply_retention(dsn, tomorrow)))

    async def go() -> None:
        await write_batches(dsn, ["r1", "r2", "r3"], 2)
        got: list[str] = []

        def committed(_: object) -> None:
            # out of its transaction, behind r2 and r3: drop now, once (a read that finds
            # nothing commits too, and a second retention run would drop the partition the
            # next write makes anew: a fresh-clone run saw two drops)
            if got == ["r1", "r1"] and not dropping_once:
                dropping_once.append(True)
                dropping = threading.Thread(target=drop_in_a_thread)
                dropping.start()
                dropping.join(30)

        stop = asyncio.Event()
        reading = _follow_as_s(dsn, got, stop, committed)
        try:
            await asyncio.sleep(1)
            await write_batches(dsn, ["r-new"], 2, first=6)
            await asyncio.sleep(GAP_LOOK_EVERY_S + 2)
        finally:
            stop.set()
            await asyncio.wait_for(reading, 30)
        assert [(d.dropped, list(d.readers_behind)) for d in took] == [(True, ["s"])], took
        assert got == ["r1", "r1", "r-new", "r-new"], got
        said = [r for r in caplog.records if "retention dropped 1 partition(s)" in r.message]
        assert [r.levelno for r in said] == [logging.WARNING], caplog.text

    asyncio.run(go())


def test_a_one_shot_read_that_ended_returns_when_its_server_stops_answering(dsn: str) -> None:
    """A one-shot read (`tail` without --follow, `dispatch --once`) that has read all it
    asked for looks once more at retention's drops. Its connection has no statement
    bound, so a host that died then (here: its backend stopped) held the finished read
    open for ever; the look is bounded as the close after it is."""

    async def go() -> None:
        await write_batches(dsn, ["r1"], 2)
        pids: list[int] = []

        async def handle(conn: asyncpg.Connection, batch: FeedBatch) -> None:
            pids.append(conn.get_server_pid())

        def ended() -> None:
            os.kill(pids[-1], signal.SIGSTOP)

        try:
            await asyncio.wait_for(
                follow(
                    LocalReader(Changefeed()),
                    connector(dsn, "t"),
                    handle,
                    asyncio.Event(),
                    wait=False,
                    on_end=ended,
                ),
                LAST_LOOK_S * 4,
            )
        finally:
            for pid in set(pids):
                os.kill(pid, signal.SIGCONT)

    asyncio.run(go())


def test_drops_made_before_migration_0014_are_worked_out_by_it(services: Services) -> None:
    """Migration 0014 records what each drop took as it drops (a reader's start read it
    by joining every drop with every batch: 85 s on a year of history). For the drops
    made before it, it works it out once, from each UTC day's newest batch."""
    with database_upto(services, upto=13) as dsn:
        asyncio.run(write_batches(dsn, ["r-old"], 3))
        newest = db(dsn, "SELECT max(commit_xid)::text AS x FROM ingest_batches")[0]["x"]
        dropped = asyncio.run(_apply_retention(dsn, next_utc_midnight(dsn)))
        assert any(d.dropped for d in dropped), dropped
        asyncio.run(_migrate_all(dsn))
        assert [r["u"] for r in db(dsn, "SELECT up_to::text AS u FROM retention_drops")] == [newest]
        _, err = _tail(dsn, "--from-cursor", "1")
        assert "retention dropped 1 partition(s) holding events after cursor 1" in err, err


async def _migrate_all(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn, load_migrations())
    finally:
        await conn.close()


async def _apply_retention(dsn: str, now: datetime, force: bool = True) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await apply_retention(conn, timedelta(0), now=now, force=force))
    finally:
        await conn.close()


def _tail_until_caught_up(dsn: str, *args: str) -> tuple[list[dict[str, Any]], str]:
    """``ackline tail ARGS`` (following) until it printed the new events, then SIGTERM."""
    env = {**os.environ, "ACKLINE_DATABASE_URL": dsn}
    env.pop("ACKLINE_FAULTS", None)
    with subprocess.Popen(
        [sys.executable, "-m", "ackline", "tail", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        deadline = threading.Timer(60, proc.kill)  # fewer lines than that: fail, not hang
        deadline.start()
        try:
            lines = [json.loads(proc.stdout.readline() or "null") for _ in range(2)]
        finally:
            deadline.cancel()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    return lines, err


# --- the dispatcher through Kafka -----------------------------------------------------------


class Deliveries:
    """Kafka delivery reports: the last offset produced per partition."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}
        self.errors: list[Any] = []

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(err)
            return
        p, o = int(msg.partition() or 0), int(msg.offset() or 0)
        self.last[p] = max(self.last.get(p, -1), o)


def ingested(dsn: str, group: str, seen: Deliveries) -> bool:
    rows = db(dsn, "SELECT partition, next_offset FROM consumer_offsets WHERE group_id = $1", group)
    done = {r["partition"]: r["next_offset"] or 0 for r in rows}
    return all(done.get(p, 0) > last for p, last in seen.last.items())


class Dispatch:
    """One `ackline dispatch` process; its summary line is on stdout at exit."""

    def __init__(
        self,
        dsn: str,
        tmp_path: Path,
        instance: str,
        reader: str = "dispatcher",
        faults: str = "",
        **settings: str,
    ) -> None:
        env = {**os.environ, "ACKLINE_DATABASE_URL": dsn, "ACKLINE_FAULTS": faults, **settings}
        self.instance = instance
        self.out_path = tmp_path / f"{instance}.out"
        self.log_path = tmp_path / f"{instance}.log"
        with self.out_path.open("wb") as out, self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ackline",
                    "dispatch",
                    "--reader",
                    reader,
                    "--instance",
                    instance,
                    "--poll-interval",
                    "1",
                    "--max-transactions",
                    "2",
                ],
                env=env,
                stdout=out,
                stderr=log,
            )
        wait_until(self._ready, 60, f"dispatcher {instance} to handle SIGTERM")

    def _ready(self) -> bool:
        self.ensure_alive()
        return "following the feed" in self.log_path.read_text(errors="replace")

    def ensure_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"dispatcher {self.instance} exited {self.proc.returncode}:\n"
                + self.log_path.read_text(errors="replace")[-3000:]
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self) -> dict[str, Any]:
        """SIGTERM; it must exit 0 and print its summary."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(60)
        assert code == 0, self.log_path.read_text(errors="replace")[-3000:]
        summary: dict[str, Any] = json.loads(self.out_path.read_text().splitlines()[-1])
        return summary


def caught_up(dsn: str, reader: str) -> bool:
    rows = db(
        dsn,
        "SELECT c.position >= coalesce((SELECT max(commit_xid) FROM ingest_batches), '0') AS ok "
        "FROM feed_cursors AS c WHERE c.reader = $1",
        reader,
    )
    return bool(rows) and bool(rows[0]["ok"])


def send(producer: ActivityProducer, envs: Iterable[Envelope], seen: Deliveries) -> None:
    with producer.transaction():
        for env in envs:
            producer.send(env, on_delivery=seen)


def test_dispatcher_starts_one_run_per_ingested_request(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Redeliveries, producer retries, conflicting sends, an aborted request, the whole
    topic re-produced and then re-ingested by a second group: one run per request that
    reached activity, none for the others, and no event handed out twice."""
    dispatcher = Dispatch(dsn, tmp_path, "d1")
    agents = [f"agent-{k}" for k in range(6)]
    originals = [requested(f"r{i}", agents[i % 6]) for i in range(30)]
    steps = [step(f"r{i}", agents[i % 6], 1) for i in range(30)]
    redelivered = originals[:10]  # the same bytes again
    retried = [requested(f"r{i}", agents[i % 6], eid=uuid.uuid4()) for i in range(10, 20)]
    conflict_ledger = requested("r20", agents[2], eid=uuid.uuid4(), prompt="changed")
    conflict_pk = requested("r-ghost", agents[3], txn="req:r-ghost", eid=originals[21].event_id)
    asked_again = requested("r22", agents[4], txn="req2:r22", eid=uuid.uuid4())  # new txn_id
    aborted = requested("r-aborted", agents[5])

    producer = ActivityProducer(services.bootstrap, topic, transactional_id=f"tx-{topic}")
    producer.start()
    seen = Deliveries()
    try:
        send(producer, [e for pair in zip(originals, steps, strict=True) for e in pair], seen)
        producer.client.begin_transaction()
        producer.send(aborted, on_delivery=seen)
        producer.client.flush(30)
        producer.abort()
        send(producer, [*redelivered, *retried, conflict_ledger, conflict_pk, asked_again], seen)
        assert not seen.errors
        group = f"g-{topic}"
        worker = Worker(services, dsn, topic, tmp_path, name="w1", batch_max_events=7)

        def ingested_by_w1() -> bool:
            worker.ensure_alive()
            dispatcher.ensure_alive()
            return ingested(dsn, group, seen)

        wait_until(ingested_by_w1, 90, "the first ingest")
        send(producer, [e for pair in zip(originals, steps, strict=True) for e in pair], seen)
        wait_until(ingested_by_w1, 90, "the re-produced range")
        assert worker.stop() == 0
    finally:
        producer.close()
    replay = Worker(services, dsn, topic, tmp_path, name="w2", group=f"replay-{topic}")

    def ingested_by_w2() -> bool:
        replay.ensure_alive()
        return ingested(dsn, f"replay-{topic}", seen)

    wait_until(ingested_by_w2, 90, "the second group to re-ingest the whole topic")
    assert replay.stop() == 0
    wait_until(lambda: caught_up(dsn, "dispatcher"), 60, "the dispatcher to catch up")
    summary = dispatcher.stop()

    runs = {r["request_id"]: r for r in db(dsn, "SELECT * FROM agent_runs")}
    assert set(runs) == {f"r{i}" for i in range(30)}  # not r-aborted, not r-ghost
    assert {r: run["deliveries"] for r, run in runs.items() if run["deliveries"] != 1} == {"r22": 2}
    for i, env in enumerate(originals):
        assert runs[f"r{i}"]["event_id"] == env.event_id  # the first event won everywhere
        assert runs[f"r{i}"]["dispatcher"] == "d1"
    requested_rows = db(dsn, "SELECT count(*) AS n FROM activity WHERE type = 'agent.requested'")
    assert requested_rows[0]["n"] == 31  # 30 originals + r22 asked again under a new txn_id
    # r22's second request is counted in `deliveries` (asserted above); whether the summary
    # calls it "already started" depends on whether both landed in one feed read.
    assert summary["started"] == 30 and summary["already_started"] in (0, 1)
    replayed = db(
        dsn, "SELECT count(*) AS n FROM ingest_batches WHERE group_id = $1", f"replay-{topic}"
    )
    assert replayed[0]["n"] > 0  # the replay did commit batches (with nothing new in them)


def test_dispatch_or_tail_on_another_processors_cursor_is_refused(dsn: str) -> None:
    """An operator's hunt: `dispatch --reader runs` took over the `runs` projection's
    cursor (the newest instance of a name does) and moved it past every event, the
    projection never applying them, then superseded. Refused now, the cursor unmoved.
    `tail --reader runs --commit` was refused by the database, with a traceback."""
    asyncio.run(ingest(dsn, [[requested("r1", "agent-x")]], 0))
    built = _ackline(dsn, "process", "runs", "--until-caught-up")
    assert built.returncode == 0, built.stderr
    before = db(dsn, "SELECT position::text AS p FROM feed_cursors WHERE reader = 'runs'")
    asyncio.run(ingest(dsn, [[requested("r2", "agent-y")]], 1))
    taken = _ackline(dsn, "dispatch", "--once", "--reader", "runs")
    assert taken.returncode == 2, (taken.returncode, taken.stdout, taken.stderr)
    assert "processor runs" in taken.stderr and "Traceback" not in taken.stderr, taken.stderr
    after = db(dsn, "SELECT position::text AS p FROM feed_cursors WHERE reader = 'runs'")
    assert after == before, (before, after)
    # a processor not installed where dispatch runs (given as module:attribute) is known
    # by its row in the database: the entry points alone let dispatch take it over
    journal = "tests.support.processors:JOURNAL"
    assert _ackline(dsn, "processors", "setup", journal).returncode == 0
    built = _ackline(dsn, "process", journal, "--until-caught-up")
    assert built.returncode == 0, built.stderr
    where = "SELECT position::text AS p FROM feed_cursors WHERE reader = 'journal'"
    journal_at = db(dsn, where)
    asyncio.run(ingest(dsn, [[requested("r3", "agent-z")]], 2))
    taken = _ackline(dsn, "dispatch", "--once", "--reader", "journal")
    assert taken.returncode == 2, (taken.returncode, taken.stdout, taken.stderr)
    assert "processor journal" in taken.stderr and "Traceback" not in taken.stderr, taken.stderr
    assert db(dsn, where) == journal_at
    # the dispatcher's own cursor, once registered, passes
    mine = _ackline(dsn, "dispatch", "--once", "--reader", "mine")
    assert mine.returncode == 0, mine.stderr
    assert _ackline(dsn, "dispatch", "--once", "--reader", "mine").returncode == 0
    # tail --commit on it: the database's guard refuses (0012), said in one line
    tailed = _ackline(dsn, "tail", "--reader", "runs", "--commit")
    assert tailed.returncode == 2, (tailed.returncode, tailed.stderr)
    assert "is in effect" in tailed.stderr and "Traceback" not in tailed.stderr, tailed.stderr
    again = db(dsn, "SELECT position::text AS p FROM feed_cursors WHERE reader = 'runs'")
    assert again == before, (before, again)


def test_a_following_dispatch_says_what_it_applied(dsn: str, tmp_path: Path) -> None:
    """`ackline dispatch` ran its runner alone, not as `process dispatcher` does: following
    the feed it logged nothing between its start line and its summary. Every
    ACKLINE_PROGRESS_LOG_S (1 s here) it says what it applied since the last line: the
    lines add up to the requests started, then one caught-up line and nothing more
    applied; the summary line is unchanged."""
    dispatcher = Dispatch(dsn, tmp_path, "d1", ACKLINE_PROGRESS_LOG_S="1")

    def said() -> list[str]:
        return re.findall(r"progress: processor dispatcher: (.*)", dispatcher.log())

    def applied() -> int:
        dispatcher.ensure_alive()
        found = (re.match(r"([\d,]+) events applied", line) for line in said())
        return sum(int(m.group(1).replace(",", "")) for m in found if m)

    requests = [requested(f"r{i}", f"agent-{i % 5}") for i in range(120)]
    try:
        asyncio.run(ingest(dsn, [requests[k : k + 40] for k in range(0, 120, 40)], 0))
        wait_until(lambda: applied() == len(requests), 60, "the lines to add up")
        wait_until(
            lambda: re.match(r"nothing applied .*; lag 0 events", said()[-1]) is not None,
            30,
            "a caught-up line",
        )
        quiet = len(said())
        time.sleep(3)  # caught up: nothing more applied (a late lag sample may say one more)
        assert all(line.startswith("nothing applied") for line in said()[quiet:]), said()
        summary = dispatcher.stop()
    finally:
        dispatcher.kill()
    assert summary == {
        "outcome": "stopped",
        "reader": "dispatcher",
        "instance": "d1",
        "started": len(requests),
        "already_started": 0,
        "transactions": 3,
        "lost_races": 0,
        "cursor": summary["cursor"],
        "stopped": "SIGTERM",
    }
    assert len(db(dsn, "SELECT request_id FROM agent_runs")) == len(requests)


def test_a_following_dispatch_is_seen_running(dsn: str, tmp_path: Path) -> None:
    """`processors status` showed a running `ackline dispatch` as never seen: its lag was
    never sampled nor its heartbeat written (`processors.last_seen_at`, `last_instance`),
    which `process dispatcher` writes every few seconds. Now it is seen, as itself."""
    began = datetime.now(UTC)
    dispatcher = Dispatch(dsn, tmp_path, "d7")

    def status() -> dict[str, Any]:
        dispatcher.ensure_alive()
        done = _ackline(dsn, "processors", "status", "dispatcher", "--json")
        assert done.returncode == 0, done.stderr
        found: list[dict[str, Any]] = json.loads(done.stdout)
        assert len(found) == 1
        return found[0]

    try:
        wait_until(lambda: status()["last_instance"] == "d7", 30, "d7 to be seen")
        seen = status()["last_seen_at"]
        assert seen is not None and datetime.fromisoformat(seen) >= began - timedelta(seconds=1)
        dispatcher.stop()
    finally:
        dispatcher.kill()


def test_two_dispatchers_and_one_killed_before_its_commit(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Two instances share one cursor while small batches stream in; one is SIGKILLed
    after its inserts and before its COMMIT (third non-empty batch) and restarted.
    Every request gets one run, and every agent.requested event was handed out once."""
    producer = ActivityProducer(services.bootstrap, topic, transactional_id=f"tx-{topic}")
    producer.start()
    seen = Deliveries()
    group = f"g-{topic}"
    worker = Worker(services, dsn, topic, tmp_path, name="w1", batch_max_events=5)
    first = Dispatch(dsn, tmp_path, "d1", faults="feed_before_commit=kill@3")
    second = Dispatch(dsn, tmp_path, "d2")
    try:
        for chunk in range(6):
            envs: list[Envelope] = []
            for i in range(chunk * 10, chunk * 10 + 10):
                agent = f"agent-{i % 7}"
                envs += [
                    requested(f"r{i}", agent),
                    step(f"r{i}", agent, 1),
                    step(f"r{i}", agent, 2),
                ]
            send(producer, envs, seen)
    finally:
        producer.close()
    assert not seen.errors
    wait_until(lambda: first.proc.poll() is not None, 90, "d1 to die at its armed kill")
    assert first.proc.returncode == -signal.SIGKILL
    restarted = Dispatch(dsn, tmp_path, "d1-restarted")

    def done() -> bool:
        for p in (worker, second, restarted):
            p.ensure_alive()
        return ingested(dsn, group, seen) and caught_up(dsn, "dispatcher")

    wait_until(done, 120, "ingest and both dispatchers to finish")
    assert worker.stop() == 0
    summaries = [second.stop(), restarted.stop()]
    runs = db(dsn, "SELECT request_id, deliveries, dispatcher FROM agent_runs")
    assert sorted(r["request_id"] for r in runs) == sorted(f"r{i}" for i in range(60))
    assert all(r["deliveries"] == 1 for r in runs), "an event was handed out twice"
    assert sum(s["already_started"] for s in summaries) == 0
    by = {r["dispatcher"] for r in runs}
    assert by <= {"d1", "d2", "d1-restarted"}
    cursor = db(dsn, "SELECT transactions, delivered FROM feed_cursors WHERE reader = 'dispatcher'")
    assert cursor[0]["delivered"] == 60


def test_a_cursor_only_reset_never_skips_requests_the_dispatcher_has_not_started(
    dsn: str,
) -> None:
    """From a review: `processors reset dispatcher --cursor-only --to-now` (the way the
    refusal of a full reset pointed to) moved the cursor past requests not started yet,
    exit 0: they were never started, and nothing said so. A kept-state move forward past
    transactions the feed holds is refused now unless --skip-events; one with nothing to
    skip, and one back, go on. `dispatch --once` on a paused dispatcher says it is paused."""
    asyncio.run(ingest(dsn, [[requested("r1", "agent-x")]], 0))
    _dispatch_once(dsn)
    asyncio.run(ingest(dsn, [[requested("r2", "agent-x"), requested("r3", "agent-y")]], 1))
    refused = _ackline(dsn, "processors", "reset", "dispatcher", "--cursor-only", "--to-now")
    assert refused.returncode == 2, (refused.returncode, refused.stderr)
    assert "--skip-events" in refused.stderr and "never started" in refused.stderr
    assert "Traceback" not in refused.stderr

    paused = _ackline(dsn, "processors", "pause", "dispatcher")
    assert paused.returncode == 0, paused.stderr
    idle = _ackline(dsn, "dispatch", "--once", "--instance", "d1")
    assert idle.returncode == 0 and json.loads(idle.stdout)["outcome"] == "paused", idle.stdout
    assert "is paused, after 0 transaction(s) read" in idle.stderr, idle.stderr
    assert _ackline(dsn, "processors", "resume", "dispatcher").returncode == 0

    _dispatch_once(dsn)
    runs = db(dsn, "SELECT request_id FROM agent_runs ORDER BY request_id")
    assert [r["request_id"] for r in runs] == ["r1", "r2", "r3"]
    nothing = _ackline(dsn, "erase", "--agent", "nobody-at-all", "--reason", "test")
    assert nothing.returncode == 0, nothing.stderr  # an erasure that erased nothing
    caught_up = _ackline(dsn, "processors", "reset", "dispatcher", "--cursor-only", "--to-now")
    assert caught_up.returncode == 0, caught_up.stderr  # nothing to skip
    asyncio.run(ingest(dsn, [[requested("r4", "agent-x")]], 3))
    skipped = _ackline(
        dsn, "processors", "reset", "dispatcher", "--cursor-only", "--to-now", "--skip-events"
    )
    assert skipped.returncode == 0, skipped.stderr
    _dispatch_once(dsn)
    assert db(dsn, "SELECT count(*) AS n FROM agent_runs")[0]["n"] == 3  # r4 skipped, as asked
    # past the readable feed: a batch still running at or below it would commit behind it
    ahead = _ackline(
        dsn, "processors", "reset", "dispatcher", "--cursor-only", "--to-cursor", str(2**62)
    )
    assert ahead.returncode == 2 and "past the readable feed" in ahead.stderr, ahead.stderr
    back = _ackline(dsn, "processors", "reset", "dispatcher", "--cursor-only", "--to-cursor", "1")
    assert back.returncode == 0, back.stderr  # back: re-delivered, each request started once
    _dispatch_once(dsn)
    runs = db(dsn, "SELECT request_id, deliveries FROM agent_runs ORDER BY request_id")
    assert [(r["request_id"], r["deliveries"]) for r in runs] == [
        ("r1", 2),
        ("r2", 2),
        ("r3", 2),
        ("r4", 1),
    ]


def _dispatch_once(dsn: str) -> None:
    done = _ackline(dsn, "dispatch", "--once", "--instance", "d1")
    assert done.returncode == 0, done.stderr


def test_the_cleanup_after_an_erasure_keeps_a_request_from_starting_twice(dsn: str) -> None:
    """docs/retention.md told the operator to delete an erased agent's `agent_runs` rows.
    Ingest keeps only the erased events' keys, so the request sent again under a new
    txn_id is a new event, and with its row deleted the dispatcher started it a second
    time. The documented cleanup (ERASE_AGENT) blanks the agent and keeps the row: the
    request is delivered again and counted, never started again."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "retention.md").read_text()
    assert ERASE_AGENT in doc  # the statement the page gives is the one tested here

    async def forget(agent: str) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await erase(conn, "agent", agent, reason="test")
            await conn.execute(ERASE_AGENT, agent)
        finally:
            await conn.close()

    asyncio.run(ingest(dsn, [[requested("r1", "agent-x")]], 0))
    _dispatch_once(dsn)
    asyncio.run(forget("agent-x"))
    asyncio.run(ingest(dsn, [[requested("r1", "agent-x", txn="req:r1:again")]], 1))
    assert db(dsn, "SELECT count(*) AS n FROM activity WHERE request_id = 'r1'")[0]["n"] == 1
    _dispatch_once(dsn)
    runs = db(dsn, "SELECT request_id, agent_id, deliveries FROM agent_runs")
    assert [(r["request_id"], r["agent_id"], r["deliveries"]) for r in runs] == [("r1", "", 2)]
