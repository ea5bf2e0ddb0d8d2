"""The batch writer against a real PostgreSQL: fencing, unknown commit outcomes, races."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import asyncpg
import pytest

from ackline.core.faults import Faults
from ackline.schemas import new_envelope
from ackline.schemas.decode import Row, decode
from ackline.sinks.connection import Database
from ackline.sinks.errors import FencedError
from ackline.sinks.ingest.batch import Batch, Coord, Incoming, PartitionRange
from ackline.sinks.ingest.offsets import claim
from ackline.sinks.ingest.writer import BatchWriter
from ackline.streams.producer import serialize

GROUP = "g"
TOPIC = "t"


def row(i: int, thought: str = "x") -> Row:
    env = new_envelope(
        "agent.step",
        txn_id=f"run:{i}",
        agent_id="a",
        request_id="r",
        payload={"run_id": "run", "step": i, "thought": thought},
        occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
        event_id=uuid.UUID(int=i),
    )
    decoded = decode(serialize(env))
    assert isinstance(decoded, Row)
    return decoded


def batch(first: int, rows: list[Row], epoch: int, partition: int = 0) -> Batch:
    events = [Incoming(Coord(TOPIC, partition, first + k), r) for k, r in enumerate(rows)]
    rng = PartitionRange(TOPIC, partition, first, first + len(rows), epoch)
    return Batch(ranges=(rng,), events=events)


async def _take(dsn: str, owner: str, partitions: list[int]) -> dict[int, int]:
    conn = await asyncpg.connect(dsn)
    try:
        claims = await claim(conn, GROUP, owner, [(TOPIC, p) for p in partitions])
    finally:
        await conn.close()
    return {c.partition: c.epoch for c in claims}


async def _count(dsn: str, sql: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


def test_zombie_with_an_old_epoch_cannot_write(dsn: str) -> None:
    async def go() -> None:
        old = (await _take(dsn, "zombie", [0]))[0]
        new = (await _take(dsn, "successor", [0]))[0]
        assert new == old + 1
        zombie_db = Database(dsn)
        zombie = BatchWriter(zombie_db, GROUP, "zombie")
        with pytest.raises(FencedError):
            await zombie.write(batch(0, [row(1), row(2)], old))
        await zombie_db.close()
        assert await _count(dsn, "SELECT count(*) FROM activity") == 0
        assert await _count(dsn, "SELECT count(*) FROM ingest_batches") == 0
        successor_db = Database(dsn)
        successor = BatchWriter(successor_db, GROUP, "successor")
        result = await successor.write(batch(0, [row(1), row(2)], new))
        await successor_db.close()
        assert result.inserted == 2
        assert await _count(dsn, "SELECT next_offset FROM consumer_offsets") == 2

    asyncio.run(go())


def test_stale_batch_behind_the_offset_is_refused(dsn: str) -> None:
    async def go() -> None:
        epoch = (await _take(dsn, "w", [0]))[0]
        database = Database(dsn)
        writer = BatchWriter(database, GROUP, "w")
        await writer.write(batch(0, [row(1), row(2)], epoch))
        with pytest.raises(FencedError):  # the same range again, same epoch
            await writer.write(batch(0, [row(1), row(2)], epoch))
        await database.close()

    asyncio.run(go())


@pytest.mark.parametrize("point", ["during_commit", "commit_reply_lost"])
def test_unknown_commit_outcome_is_reconciled_by_reading(dsn: str, point: str) -> None:
    """COMMIT lost before it reached the server (retried) or its reply lost after it
    committed (recognised by reading): either way exactly one batch commits."""

    async def go() -> None:
        epoch = (await _take(dsn, "w", [0]))[0]
        database = Database(dsn)
        writer = BatchWriter(database, GROUP, "w", Faults(f"{point}=fail"))
        result = await writer.write(batch(0, [row(1), row(2), row(3)], epoch))
        await database.close()
        assert writer.retries["commit_uncertain"] == 1
        assert result.inserted == 3
        assert await _count(dsn, "SELECT count(*) FROM ingest_batches") == 1
        assert await _count(dsn, "SELECT max(batch_id) FROM ingest_batches") == result.batch_id
        assert await _count(dsn, "SELECT count(*) FROM activity") == 3
        assert await _count(dsn, "SELECT next_offset FROM consumer_offsets") == 3

    asyncio.run(go())


def test_connection_killed_mid_batch_is_retried(dsn: str) -> None:
    async def go() -> None:
        epoch = (await _take(dsn, "w", [0]))[0]
        stall_then_go_on = Faults("mid_copy=stall", stall_seconds=2.0)
        database = Database(dsn, application_name="victim")
        writer = BatchWriter(database, GROUP, "w", stall_then_go_on)
        task = asyncio.create_task(writer.write(batch(0, [row(1), row(2)], epoch)))
        admin = await asyncpg.connect(dsn)
        try:
            for _ in range(100):
                killed = await admin.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = 'victim' AND state = 'idle in transaction'"
                )
                if killed:
                    break
                await asyncio.sleep(0.05)
            assert killed == 1
        finally:
            await admin.close()
        result = await task
        await database.close()
        assert result.inserted == 2
        assert writer.retries["transient"] >= 1
        assert await _count(dsn, "SELECT count(*) FROM activity") == 2

    asyncio.run(go())


def test_concurrent_inserter_race_is_rechecked(dsn: str) -> None:
    """Another transaction holds the key when we insert: we roll back, re-read, and see
    a duplicate (window 14)."""

    async def go() -> None:
        epochs = await _take(dsn, "w", [0, 1])
        shared = row(7)
        other = await asyncpg.connect(dsn)
        tr = other.transaction()
        await tr.start()
        await other.execute(
            "INSERT INTO txn_ledger (txn_id, event_id, body_hash, src_topic, src_partition, "
            "src_offset, batch_id) VALUES ($1, $2, $3, 't', 1, 0, 0)",
            shared.txn_id,
            shared.event_id,
            shared.body_hash,
        )
        database = Database(dsn)
        writer = BatchWriter(database, GROUP, "w")
        other_admin = await asyncpg.connect(dsn)
        task = asyncio.create_task(writer.write(batch(0, [row(6), shared], epochs[0])))
        for _ in range(200):  # until the writer blocks on the ledger's unique index
            waiting = await other_admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
            if waiting:
                break
            await asyncio.sleep(0.05)
        assert waiting == 1 and not task.done()
        await tr.commit()
        await other.close()
        await other_admin.close()
        result = await task
        await database.close()
        assert writer.retries["race"] == 1
        assert result.inserted == 1
        assert result.duplicates["ledger"] == 1

    asyncio.run(go())
