"""Retention drops only what it may: not through a caller's temp tables, not a batch that
committed into the partition while its detach waited. On the real server (migration 0011).
"""

from __future__ import annotations

import asyncio
import json
from datetime import date, timedelta

import asyncpg
import pytest

from ackline.roles import INGEST, with_user
from ackline.sinks.admin.migrate import migrate
from ackline.sinks.admin.partitions import apply_retention
from tests.integration.harness import Services, database_upto, db, next_utc_midnight

pytestmark = pytest.mark.integration

_SHADOW = """
CREATE TEMP TABLE activity_partitions
    (name text, lower_day date, upper_day date, ends_before timestamptz);
CREATE TEMP TABLE feed_cursors (reader text, position xid8, within_batch bigint);
CREATE TEMP TABLE ingest_batches (commit_xid xid8, committed_at timestamptz);
CREATE TEMP TABLE retention_drops
    (drop_id bigint GENERATED ALWAYS AS IDENTITY, partition_name text, lower_day date,
     upper_day date, ends_before timestamptz, approx_rows bigint, forced boolean,
     readers_behind text[], snap pg_snapshot, dropped_by text DEFAULT session_user,
     dropped_at timestamptz DEFAULT now());
GRANT ALL ON activity_partitions, feed_cursors, ingest_batches, retention_drops TO PUBLIC;
"""


def _today(dsn: str) -> date:
    day: date = db(dsn, "SELECT (now() AT TIME ZONE 'UTC')::date AS d")[0]["d"]
    return day


def _attached(dsn: str, name: str) -> bool:
    rows = db(
        dsn,
        "SELECT count(*) AS n FROM pg_inherits"
        " WHERE inhparent = 'activity'::regclass AND inhrelid = to_regclass($1)",
        f"public.{name}",
    )
    return int(rows[0]["n"]) == 1


_ROW = """
INSERT INTO activity (event_id, txn_id, type, agent_id, request_id, occurred_at,
    schema_version, payload, body_hash, src_topic, src_partition, src_offset, batch_id,
    ingested_on)
VALUES (gen_random_uuid(), $1, 'agent.step', 'a', 'r', now(), 1, '{}', $2, 't', 0, $3, $4,
    (now() AT TIME ZONE 'UTC')::date)
"""
_BATCH = """
INSERT INTO ingest_batches (batch_id, group_id, worker, ranges, events, inserted,
    duplicates_ledger, duplicates_pk, conflicts_ledger, conflicts_pk, rejects)
VALUES ($1, 'g', 'w', $2::jsonb, 1, 1, 0, 0, 0, 0, 0)
"""


async def _commit_batch(conn: asyncpg.Connection, batch: int) -> None:
    await conn.execute(_ROW, f"txn-{batch}", bytes(32), batch, batch)
    await conn.execute(_BATCH, batch, json.dumps([]))


def test_the_ingest_role_cannot_steer_retention_through_temp_tables(dsn: str) -> None:
    """The worker's role shadows the tables the drop function reads with temp tables of
    its own, lists today's partition as long expired, and asks for retention: today's
    partition and its row stay, and nothing is recorded as dropped."""
    today = _today(dsn)
    name = f"activity_p{today:%Y%m%d}"

    async def go() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(dsn)
        try:
            async with conn.transaction():
                await _commit_batch(conn, 1)
            await conn.execute("UPDATE retention_policy SET min_keep = interval '90 days'")
        finally:
            await conn.close()
        ingest = await asyncpg.connect(with_user(dsn, INGEST))
        try:
            await ingest.execute(_SHADOW)
            await ingest.execute(
                "INSERT INTO activity_partitions VALUES"
                " ($1, '2000-01-01', '2000-01-02', '2000-01-02 00:00:00+00')",
                name,
            )
            return list(await ingest.fetch("SELECT * FROM ackline_apply_retention('90 days')"))
        finally:
            await ingest.close()

    result = asyncio.run(go())
    assert not any(r["dropped"] for r in result), result
    assert _attached(dsn, name)
    assert db(dsn, f"SELECT count(*) AS n FROM {name}")[0]["n"] == 1
    assert db(dsn, "SELECT count(*) AS n FROM retention_drops")[0]["n"] == 0


def test_a_batch_committed_while_the_detach_waited_keeps_its_partition(dsn: str) -> None:
    """A reader has read everything; a batch writing today's partition is in flight when
    retention (its clock past midnight, keep 0) looks at the readers: none behind. Its
    detach waits for the batch, which commits: the reader is now behind, so the partition
    must stay, attached, with the batch's row, unless forced."""
    after_midnight = next_utc_midnight(dsn)
    name = f"activity_p{after_midnight - timedelta(days=1):%Y%m%d}"

    async def go() -> list[tuple[str, bool, tuple[str, ...]]]:
        admin = await asyncpg.connect(dsn)
        flight = await asyncpg.connect(dsn)
        retain = await asyncpg.connect(dsn)
        try:
            async with admin.transaction():
                await _commit_batch(admin, 1)
            await admin.execute(
                "INSERT INTO feed_cursors (reader, position)"
                " SELECT 'head', max(commit_xid) FROM ingest_batches"
            )
            tr = flight.transaction()
            await tr.start()
            await _commit_batch(flight, 2)  # in flight: not committed yet
            task = asyncio.create_task(
                apply_retention(retain, timedelta(0), now=after_midnight, set_policy=False)
            )
            # Wait until the retention's detach waits on the batch's lock.
            for _ in range(200):
                waiting = await admin.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query LIKE '%drop_partitions_before%'"
                )
                if waiting:
                    break
                await asyncio.sleep(0.05)
            assert waiting, "the retention never waited for the batch in flight"
            await tr.commit()
            async with asyncio.timeout(30):
                dropped = await task
            return [(d.name, d.dropped, d.readers_behind) for d in dropped]
        finally:
            for conn in (admin, flight, retain):
                await conn.close()

    outcome = {name_: (gone, behind) for name_, gone, behind in asyncio.run(go())}
    assert outcome[name] == (False, ("head",)), outcome
    assert _attached(dsn, name)
    assert db(dsn, f"SELECT count(*) AS n FROM {name}")[0]["n"] == 2
    # Its own partition only: an earlier day's, empty, is dropped and recorded when the
    # session's template was migrated before midnight (a run across midnight failed so).
    drops = db(dsn, "SELECT count(*) AS n FROM retention_drops WHERE partition_name = $1", name)
    assert drops[0]["n"] == 0


def test_every_security_definer_function_names_pg_temp_last(dsn: str) -> None:
    """Any SECURITY DEFINER function a later migration adds must not let a caller's temp
    tables stand in for ackline's (the first test above, for every such function)."""
    rows = db(
        dsn,
        "SELECT p.proname AS name, coalesce(p.proconfig, '{}') AS config FROM pg_proc AS p"
        " WHERE p.prosecdef AND p.pronamespace = 'public'::regnamespace",
    )
    assert len(rows) >= 5, rows
    unsafe = [
        (r["name"], r["config"])
        for r in rows
        if "search_path=pg_catalog, public, pg_temp" not in r["config"]
    ]
    assert not unsafe, unsafe


def test_the_ingest_role_cannot_create_objects_in_public(dsn: str) -> None:
    """A function of its own in public could win over pg_catalog's inside the SECURITY
    DEFINER functions (a closer signature): the worker's role may create nothing there."""

    async def go() -> str:
        conn = await asyncpg.connect(with_user(dsn, INGEST))
        try:
            await conn.execute(
                "CREATE FUNCTION public.format(text, text) RETURNS text LANGUAGE sql AS 'SELECT $1'"
            )
        except asyncpg.InsufficientPrivilegeError as exc:
            return str(exc)
        finally:
            await conn.close()
        return "created"

    assert "permission denied for schema public" in asyncio.run(go())


def test_migrating_a_database_that_lets_public_create_takes_that_right_away(
    services: Services,
) -> None:
    """A database made before PostgreSQL 15 (or by hand) lets every role create in
    public: migration 0011 takes it back."""
    with database_upto(services, upto=10) as dsn:
        db(dsn, "GRANT CREATE ON SCHEMA public TO PUBLIC")

        async def go() -> tuple[bool, bool]:
            conn = await asyncpg.connect(dsn)
            try:
                await migrate(conn)
                before = "SELECT has_schema_privilege('public', 'public', 'CREATE')"
                after = "SELECT has_schema_privilege('ackline_ingest', 'public', 'CREATE')"
                return bool(await conn.fetchval(before)), bool(await conn.fetchval(after))
            finally:
                await conn.close()

        assert asyncio.run(go()) == (False, False)
