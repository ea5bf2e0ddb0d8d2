"""Least privilege, proven on the real server: the roles of ``0010_roles.sql``.

The ingest role appends and cannot rewrite, empty, erase or drop event data; the reader
reads and cannot write anything; the eraser deletes activity rows and nothing else of
them; every table (partitions included) is covered by the grants (the rule every later
migration follows); and a whole worker run as the ingest role still ingests exactly once.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from ackline.load.produce import Knobs, produce
from ackline.load.verify import drained, verify
from ackline.roles import (
    ERASER,
    INGEST,
    MIGRATOR,
    READER,
    scram_sha256_verifier,
    set_password,
    with_user,
)
from tests.integration.harness import Services, Worker, db, run_async, wait_until

TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")

# Exactly what the ingest role may do, table by table (0010_roles.sql and the grants of
# later migrations: 0016's SELECT on topic_incarnations). Anything not
# listed, on any table (the partitions of activity included), must be denied.
INGEST_ALLOWED: dict[str, set[str]] = {
    "activity": {"SELECT", "INSERT"},
    "txn_ledger": {"SELECT", "INSERT"},
    "event_keys": {"SELECT", "INSERT"},
    "conflicts": {"INSERT"},
    "rejects": {"INSERT"},
    "ingest_batches": {"SELECT", "INSERT"},
    "consumer_offsets": {"SELECT", "INSERT", "UPDATE"},
    "retention_policy": {"SELECT"},
    "erased_events": {"SELECT"},  # a conflict with an erased event keeps no body
    "topic_incarnations": {"SELECT"},  # the incarnation a reject or conflict row carries
}

# The same for the eraser (table-level; its UPDATEs are on named columns only).
ERASER_ALLOWED: dict[str, set[str]] = {
    "activity": {"SELECT", "DELETE"},
    "event_keys": {"SELECT"},
    "conflicts": {"SELECT"},
    "rejects": {"SELECT"},
    "erasures": {"SELECT", "INSERT"},
    "erased_events": {"SELECT", "INSERT"},
}

_RELATIONS = """
SELECT c.relname AS name, c.relkind AS kind, pg_get_userbyid(c.relowner) AS owner
FROM pg_class AS c
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
ORDER BY c.relname
"""


def as_role(dsn: str, role: str, action: Callable[[asyncpg.Connection], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        conn = await asyncpg.connect(with_user(dsn, role))
        try:
            return await action(conn)
        finally:
            await conn.close()

    return asyncio.run(go())


def denied(dsn: str, role: str, sql: str, *args: Any) -> None:
    """``sql`` run as ``role`` fails with insufficient_privilege (nothing else)."""

    async def go(conn: asyncpg.Connection) -> None:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(sql, *args)

    as_role(dsn, role, go)


def _seed_activity(dsn: str) -> uuid.UUID:
    """One activity row with its ledger and key rows, written by the ingest role itself
    (into today's partition, which the ingest role may make)."""
    event_id = uuid.uuid4()

    async def go(conn: asyncpg.Connection) -> None:
        await conn.execute("SELECT count(*) FROM ackline_ensure_partitions('day', 1)")
        async with conn.transaction():
            await conn.execute(
                "INSERT INTO txn_ledger (txn_id, event_id, body_hash, src_topic, src_partition,"
                " src_offset, batch_id) VALUES ('t-1', $1, $2, 'topic', 0, 0, 1)",
                event_id,
                b"\x01" * 32,
            )
            await conn.execute(
                "INSERT INTO event_keys (event_id, body_hash, batch_id) VALUES ($1, $2, 1)",
                event_id,
                b"\x01" * 32,
            )
            await conn.execute(
                "INSERT INTO activity (event_id, txn_id, type, agent_id, request_id, occurred_at,"
                " schema_version, payload, body_hash, src_topic, src_partition, src_offset,"
                " batch_id, ingested_on) VALUES ($1, 't-1', 'agent.step', 'a', 'r', now(), 1,"
                " '{}', $2, 'topic', 0, 0, 1, (now() AT TIME ZONE 'UTC')::date)",
                event_id,
                b"\x01" * 32,
            )

    as_role(dsn, INGEST, go)
    return event_id


def test_ingest_role_appends_but_cannot_rewrite_or_empty(dsn: str) -> None:
    event_id = _seed_activity(dsn)  # positive control: the role can append
    assert db(dsn, "SELECT count(*) AS n FROM activity")[0]["n"] == 1

    denied(dsn, INGEST, "UPDATE activity SET payload = '{\"x\": 1}' WHERE event_id = $1", event_id)
    denied(dsn, INGEST, "DELETE FROM activity WHERE event_id = $1", event_id)
    denied(dsn, INGEST, "UPDATE txn_ledger SET body_hash = $1", b"\x02" * 32)
    denied(dsn, INGEST, "DELETE FROM txn_ledger")
    denied(dsn, INGEST, "DELETE FROM event_keys")
    for table in (*INGEST_ALLOWED, "feed_cursors", "agent_runs", "schema_migrations"):
        denied(dsn, INGEST, f"TRUNCATE {table}")
    partition = str(db(dsn, "SELECT name FROM activity_partitions LIMIT 1")[0]["name"])
    denied(dsn, INGEST, f"DELETE FROM {partition}")  # not through a partition either
    denied(dsn, INGEST, f"ALTER TABLE activity DETACH PARTITION {partition}")
    denied(dsn, INGEST, f"DROP TABLE {partition}")
    denied(dsn, INGEST, "SELECT * FROM ackline_drop_partitions_before(now() + '9 days', true)")
    denied(dsn, INGEST, "DELETE FROM consumer_offsets")
    denied(dsn, INGEST, "DELETE FROM rejects")
    denied(dsn, INGEST, "SELECT raw_value FROM rejects")  # only the ON CONFLICT columns
    denied(dsn, INGEST, "UPDATE conflicts SET incoming_body = NULL")
    denied(dsn, INGEST, "INSERT INTO erasures (selector, value) VALUES ('agent', 'a')")
    denied(dsn, INGEST, "DELETE FROM schema_migrations")
    denied(dsn, INGEST, "CREATE TABLE sneaky (x int)")
    denied(dsn, INGEST, "ALTER TABLE activity DROP CONSTRAINT activity_pkey")

    row = db(dsn, "SELECT payload::text AS p FROM activity WHERE event_id = $1", event_id)
    assert row[0]["p"] == "{}"  # untouched


def test_reader_cannot_write_anything(dsn: str) -> None:
    event_id = _seed_activity(dsn)
    tables = [str(r["name"]) for r in db(dsn, _RELATIONS) if r["kind"] in ("r", b"r", "p", b"p")]
    assert {"activity", "consumer_offsets", "feed_cursors"} <= set(tables)

    async def reads(conn: asyncpg.Connection) -> list[int]:
        return [int(await conn.fetchval(f"SELECT count(*) FROM {t}")) for t in tables]

    counts = as_role(dsn, READER, reads)
    assert counts[tables.index("activity")] == 1
    for table in tables:
        denied(dsn, READER, f"DELETE FROM {table}")
        denied(dsn, READER, f"UPDATE {table} SET {_first_column(dsn, table)} = NULL")
        denied(dsn, READER, f"TRUNCATE {table}")
    denied(dsn, READER, "INSERT INTO activity SELECT * FROM activity")
    denied(
        dsn,
        READER,
        "INSERT INTO consumer_offsets (group_id, topic, partition) VALUES ('g', 't', 0)",
    )
    denied(dsn, READER, "INSERT INTO feed_cursors (reader) VALUES ('r')")
    denied(dsn, READER, "SELECT nextval('ingest_batch_id_seq')")
    denied(dsn, READER, "CREATE TABLE sneaky (x int)")
    assert db(dsn, "SELECT count(*) AS n FROM activity WHERE event_id = $1", event_id)[0]["n"] == 1


def _first_column(dsn: str, table: str) -> str:
    rows = db(
        dsn,
        "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 "
        "AND NOT attisdropped AND attidentity = '' ORDER BY attnum LIMIT 1",
        table,
    )
    return str(rows[0]["attname"])


def test_grants_cover_every_relation(dsn: str) -> None:
    """The rule of 0003_roles.sql's header, checked on whatever the migrations built:
    ackline_migrator owns everything (the partitions the functions make too), the reader
    can SELECT every table and view, and the ingest and eraser roles hold exactly their
    lists (a later migration that forgets a grant, or hands a role more than it needs,
    fails here)."""
    relations = db(dsn, _RELATIONS)
    assert relations
    for r in relations:
        assert r["owner"] == MIGRATOR, f"{r['name']} is owned by {r['owner']}"
    tables = [str(r["name"]) for r in relations if r["kind"] in ("r", b"r", "p", b"p", "v", b"v")]
    held = db(
        dsn,
        "SELECT r.role, t.name, p.priv FROM unnest($1::text[]) AS r(role), "
        "unnest($2::text[]) AS t(name), unnest($3::text[]) AS p(priv) "
        "WHERE has_table_privilege(r.role, t.name, p.priv)",
        [INGEST, READER, ERASER],
        tables,
        list(TABLE_PRIVILEGES),
    )
    got: dict[tuple[str, str], set[str]] = {}
    for h in held:
        got.setdefault((str(h["role"]), str(h["name"])), set()).add(str(h["priv"]))
    for table in tables:
        assert got.get((READER, table)) == {"SELECT"}, (
            f"reader on {table}: {got.get((READER, table))}"
        )
        want = INGEST_ALLOWED.get(table, set())
        assert got.get((INGEST, table), set()) == want, f"ingest on {table}"
        want = ERASER_ALLOWED.get(table, set())
        assert got.get((ERASER, table), set()) == want, f"eraser on {table}"
    sequences = [str(r["name"]) for r in relations if r["kind"] in ("S", b"S")]
    usable = {
        str(r["name"])
        for r in db(
            dsn,
            "SELECT s AS name FROM unnest($1::text[]) AS s "
            "WHERE has_sequence_privilege($2, s, 'USAGE')",
            sequences,
            INGEST,
        )
    }
    assert usable == {"ingest_batch_id_seq"}


def test_scram_verifier_matches_postgres(dsn: str) -> None:
    """The verifier `ackline roles set-password` sends is the one PostgreSQL computes."""
    probe = f"ackline_probe_{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("SET password_encryption = 'scram-sha-256'")
            await conn.execute(f"CREATE ROLE {probe} LOGIN PASSWORD 'correct horse'")
            stored = str(
                await conn.fetchval("SELECT rolpassword FROM pg_authid WHERE rolname = $1", probe)
            )
            iterations, salt = stored.split("$")[1].split(":")
            mine = scram_sha256_verifier("correct horse", base64.b64decode(salt), int(iterations))
            assert mine == stored
            # set_password gives the ingest role a verifier of the same form for its password.
            await set_password(conn, INGEST, "s3cret pass")
            stored = str(
                await conn.fetchval("SELECT rolpassword FROM pg_authid WHERE rolname = $1", INGEST)
            )
            iterations, salt = stored.split("$")[1].split(":")
            assert stored == scram_sha256_verifier(
                "s3cret pass", base64.b64decode(salt), int(iterations)
            )
        finally:
            await conn.execute(f"DROP ROLE IF EXISTS {probe}")
            await conn.execute(f"ALTER ROLE {INGEST} PASSWORD NULL")  # the dev stack trusts it
            await conn.close()

    asyncio.run(go())


def test_worker_as_ingest_role_ingests_exactly_once(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """A whole `ackline run` under the ingest role: every connection of the worker is
    ackline_ingest, and verify (run as the read-only reader) finds every event once,
    duplicates dropped, conflicts quarantined and poison rejected."""
    manifest = tmp_path / "manifest.jsonl.gz"
    produce(
        services.bootstrap,
        topic,
        partitions=3,
        events=3_000,
        knobs=Knobs(
            redeliver=0.03, retry=0.02, conflict_ledger=0.01, conflict_pk=0.01, poison=0.01
        ),
        seed=21,
        manifest_path=manifest,
        progress=False,
    )
    group = f"g-{topic}"
    worker = Worker(services, dsn, topic, tmp_path, name="ingest-w1")

    def sessions() -> set[str]:
        rows = db(
            dsn,
            "SELECT DISTINCT usename FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE '%ingest-w1'",
        )
        return {str(r["usename"]) for r in rows}

    def done() -> bool:
        worker.ensure_alive()
        return run_async(drained(dsn, manifest, group))

    wait_until(lambda: bool(sessions()), 60, "the worker's PostgreSQL sessions")
    wait_until(done, 120, "every produced offset to be committed")
    assert sessions() == {INGEST}
    assert worker.stop() == 0, worker.log()[-3000:]
    verdict = run_async(verify(with_user(dsn, READER), manifest, group))
    assert verdict.ok, verdict.to_json()
    j = verdict.to_json()
    assert j["lost"] == 0 and j["duplicated"] == 0
    assert j["duplicates_dropped"] > 0 and j["conflicts_quarantined"] > 0 and j["rejected"] > 0
