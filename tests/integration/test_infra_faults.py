"""Faults beyond one process, short (issue 12; the long proof is `make chaos-infra`).

One stack for the whole module (ackline.dev.infra: three KRaft brokers, a PostgreSQL
primary with a streaming standby, a tmpfs tablespace per node, a Toxiproxy proxy per
client and server), in a temporary directory, stopped at the end. Each test leaves it
healthy for the next: after a failover the old primary is rebuilt as the standby.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from ackline.core.faults import Faults
from ackline.dev import infra as infra_stack
from ackline.dev.infra import Infra
from ackline.sinks.admin.migrate import migrate
from ackline.sinks.connection import Database
from ackline.sinks.errors import FencedError
from ackline.sinks.ingest.offsets import claim, locked_offsets
from ackline.sinks.ingest.writer import BatchWriter
from tests.integration.test_writer import GROUP, TOPIC, batch, row

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def infra() -> Iterator[Infra]:
    state = Path(tempfile.mkdtemp(prefix="ackline-infra-", dir="/tmp"))
    state.chmod(0o755)  # PostgreSQL runs as an unprivileged user when we are root
    try:
        stack = infra_stack.up(state, slots=3, mode="async", disk=True)
        yield stack
    finally:
        infra_stack.down(state, wipe=True)
        shutil.rmtree(state, ignore_errors=True)


async def _fresh_database(infra: Infra) -> str:
    """A migrated database on the pair; its DSN lists both nodes (superuser)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(infra.admin_dsn())
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    dsn = infra.admin_dsn(name)
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    return dsn


async def _claim(dsn: str, owner: str, partition: int) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        claims = await claim(conn, GROUP, owner, [(TOPIC, partition)])
    finally:
        await conn.close()
    return claims[0].epoch


async def _sql(dsn: str, sql: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        return str(await conn.fetchval(sql))
    finally:
        await conn.close()


async def _next_offset(dsn: str, partition: int) -> int | None:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await locked_offsets(conn, GROUP, [(TOPIC, partition)])
    finally:
        await conn.close()
    return rows[0].next_offset


def _rebuild(infra: Infra) -> None:
    """The crashed old primary becomes the standby again; its proxies come back."""
    infra.pair.rebuild("async")
    infra.set_node_reachable(infra.pair.standby.name, True)
    infra.record()


def test_async_failover_lost_commits_are_rewritten_not_skipped(infra: Infra) -> None:
    """An asynchronous failover loses acknowledged commits: rows and offset rows roll back
    together, so the writer must find its partitions behind where it left them and fail
    the batch (the runtime then re-reads from the DB offset), never commit past them.

    Two writers, one partition each. W had batch B1 acknowledged on the old primary and
    B2's COMMIT in flight when it died; on the new primary the sequence hands B2's batch
    id to another writer's batch (sequence values are reused after an async failover),
    so a reconcile that looks for the batch row by id finds it and takes B2 for
    committed. X had batch C1 acknowledged and lost, and writes C2 with no reconcile: a
    fence that only asks ``next_offset <= first_offset`` lets C2 commit past C1.
    """
    stall_s = 8.0

    async def go() -> None:
        dsn = await _fresh_database(infra)
        direct = infra.pair.primary.dsn(dsn.rsplit("/", 1)[1].split("?")[0])
        w_epoch, x_epoch, v_epoch = [
            await _claim(dsn, o, p) for o, p in (("w", 0), ("x", 1), ("v", 2))
        ]
        w_db = Database(dsn, statement_timeout=5, commit_timeout=5, application_name="ackline:w")
        x_db = Database(dsn, statement_timeout=5, commit_timeout=5, application_name="ackline:x")
        v_db = Database(dsn, statement_timeout=5, commit_timeout=5, application_name="ackline:v")
        w = BatchWriter(w_db, GROUP, "w", Faults("before_commit=stall@3", stall_s))
        x = BatchWriter(x_db, GROUP, "x")
        v = BatchWriter(v_db, GROUP, "v")
        await w.write(batch(0, [row(1), row(2)], w_epoch, partition=0))  # A: replicated
        await x.write(batch(0, [row(11), row(12)], x_epoch, partition=1))
        while not infra.pair.caught_up():
            await asyncio.sleep(0.05)
        infra.pair.hold_wal_senders()  # from here on nothing reaches the standby
        await _sql(direct, "SELECT setval('ingest_batch_id_seq', 1000)")
        await x.write(batch(2, [row(13), row(14)], x_epoch, partition=1))  # C1, acknowledged
        b1 = await w.write(batch(2, [row(3), row(4)], w_epoch, partition=0))
        assert b1.batch_id == 1002  # so B2 takes 1003
        b2 = asyncio.ensure_future(w.write(batch(4, [row(5), row(6)], w_epoch, partition=0)))
        while (
            await _sql(
                infra.pair.primary.dsn(),
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ackline:w' "
                "AND state = 'idle in transaction' AND query LIKE '%pg_notify%'",
            )
            != "1"
        ):
            await asyncio.sleep(0.05)  # B2 took batch id 1003 and stalls before its COMMIT
        await asyncio.to_thread(infra.pair.crash)
        infra.set_node_reachable(infra.pair.primary.name, False)
        await asyncio.to_thread(infra.pair.promote)
        infra.record()
        new = infra.pair.primary.dsn(dsn.rsplit("/", 1)[1].split("?")[0])
        assert await _next_offset(new, 0) == 2  # A survived, B1 rolled back with its row
        await _sql(new, "SELECT setval('ingest_batch_id_seq', 1002)")
        reused = await v.write(batch(0, [row(21)], v_epoch, partition=2))
        assert reused.batch_id == 1003  # the id B2 took on the old primary
        with pytest.raises(FencedError):
            await b2  # B2 did not commit, and B1 is gone: the writer must not go on
        with pytest.raises(FencedError):
            await x.write(batch(4, [row(15), row(16)], x_epoch, partition=1))  # C2
        assert await _next_offset(new, 0) == 2
        assert await _next_offset(new, 1) == 2
        # What the runtime does next: re-read from the DB offsets, in order.
        await w.write(batch(2, [row(3), row(4)], w_epoch, partition=0))
        await w.write(batch(4, [row(5), row(6)], w_epoch, partition=0))
        await x.write(batch(2, [row(13), row(14)], x_epoch, partition=1))
        await x.write(batch(4, [row(15), row(16)], x_epoch, partition=1))
        for db in (w_db, x_db, v_db):
            await db.close()
        assert await _sql(new, "SELECT count(*) FROM activity") == "13"
        offsets = await _sql(
            new,
            "SELECT string_agg(next_offset::text, ',' ORDER BY partition) FROM consumer_offsets",
        )
        assert offsets == "6,6,1"

    try:
        asyncio.run(go())
    finally:
        if infra.pair.standby_down:
            _rebuild(infra)
