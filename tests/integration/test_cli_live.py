"""CLI manners against the real services (issue 18): `tail --reader NEW --follow`
creates the reader, `conflicts list` says when it is cut short, `conflicts show` shows
what changed, and `migrate` needs PostgreSQL only."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg

from ackline.load.produce import Knobs
from tests.integration.harness import Services, Worker, db, dsn_for
from tests.integration.windows import produce_mix, wait_drained

CLEAN = Knobs(redeliver=0.0, retry=0.0, conflict_ledger=0.0, conflict_pk=0.0, poison=0.0, abort=0.0)


def ackline(
    *argv: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ACKLINE_")}
    full.update({"ACKLINE_LOG_FORMAT": "text", **env})
    return subprocess.run(
        [sys.executable, "-m", "ackline", *argv],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_tail_follow_creates_a_new_reader(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    manifest = produce_mix(services, topic, tmp_path, 40, seed=3, knobs=CLEAN)
    worker = Worker(services, dsn, topic, tmp_path)
    wait_drained(dsn, manifest, f"g-{topic}", [worker])
    worker.stop()
    env = {"ACKLINE_DATABASE_URL": dsn}
    out = ackline("tail", "--reader", "fresh", "--follow", "--limit", "5", env=env)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == 5 and all(line["event_id"] for line in lines)
    rows = db(dsn, "SELECT delivered FROM feed_cursors WHERE reader = 'fresh'")
    assert len(rows) == 1 and rows[0]["delivered"] == 0  # created, not advanced (no --commit)
    peek = ackline("tail", "--reader", "fresh", "--limit", "1", env=env)
    assert peek.returncode == 0 and len(peek.stdout.splitlines()) == 1, peek.stderr
    unknown = ackline("tail", "--reader", "nobody", env=env)
    assert unknown.returncode == 2 and "--follow" in unknown.stderr


async def _conflicts(dsn: str, n: int) -> None:
    """A stored activity row and ``n`` ledger conflicts with it, as the writer leaves them."""
    conn = await asyncpg.connect(dsn)
    stored = uuid.uuid4()
    body = {
        "agent_id": "agent-1",
        "occurred_at": "2026-11-01T12:00:00.000000Z",
        "payload": {"run_id": "r1", "step": 1, "thought": "plan"},
        "request_id": "req-1",
        "schema_version": 1,
        "txn_id": "run-1:1",
        "type": "agent.step",
    }
    try:
        await conn.execute(
            """
            INSERT INTO activity (event_id, txn_id, type, agent_id, request_id, occurred_at,
                                  schema_version, payload, body_hash, src_topic, src_partition,
                                  src_offset, batch_id, ingested_on)
            VALUES ($1, 'run-1:1', 'agent.step', 'agent-1', 'req-1',
                    '2026-11-01T12:00:00Z', 1, $2::jsonb, $3, 't', 0, 0, 1,
                    (now() AT TIME ZONE 'UTC')::date)
            """,
            stored,
            json.dumps(body["payload"]),
            b"\x01" * 32,
        )
        changed = {**body, "payload": {"run_id": "r1", "step": 1, "thought": "rewritten"}}
        changed["agent_id"] = "agent-2"
        await conn.executemany(
            """
            INSERT INTO conflicts (layer, event_id, txn_id, stored_event_id, stored_hash,
                                   incoming_hash, incoming_body, group_id, src_topic,
                                   src_partition, src_offset, batch_id)
            VALUES ('ledger', $1, 'run-1:1', $2, $3, $4, $5::jsonb, 'ackline', 't', 0, $6, 2)
            """,
            [
                (uuid.uuid4(), stored, b"\x01" * 32, b"\x02" * 32, json.dumps(changed), i + 1)
                for i in range(n)
            ],
        )
    finally:
        await conn.close()


def test_conflicts_list_says_it_is_cut_and_show_gives_the_diff(dsn: str) -> None:
    asyncio.run(_conflicts(dsn, 25))
    env = {"ACKLINE_DATABASE_URL": dsn, "ACKLINE_GROUP_ID": "ackline"}
    listed = ackline("conflicts", env=env)  # no subcommand: the newest 20
    assert listed.returncode == 0, listed.stderr
    assert "showing the newest 20 of 25 conflicts" in listed.stdout
    full = ackline("conflicts", "list", "--limit", "30", env=env)
    assert "showing" not in full.stdout and len(full.stdout.splitlines()) == 2 + 25
    first = db(dsn, "SELECT min(conflict_id) AS id FROM conflicts")[0]["id"]
    shown = ackline("conflicts", "show", str(first), env=env)
    assert shown.returncode == 0, shown.stderr
    assert 'payload.thought: "plan" -> "rewritten"' in shown.stdout
    assert 'agent_id: "agent-1" -> "agent-2"' in shown.stdout
    assert (
        "occurred_at"
        not in shown.stdout.split("changed (stored -> incoming):")[1].split("incoming body:")[0]
    )  # equal once both are in the canonical form
    as_json = json.loads(ackline("conflicts", "show", str(first), "--json", env=env).stdout)
    assert len(as_json["changed"]) == 2


def test_migrate_needs_postgresql_only(services: Services, tmp_path: Path) -> None:
    """No Kafka setting and no local stack in the state dir: migrate still works."""
    name = f"m_{uuid.uuid4().hex[:10]}"
    db(services.database_url, f'CREATE DATABASE "{name}"')
    try:
        env = {
            "ACKLINE_DATABASE_URL": dsn_for(services.database_url, name),
            "ACKLINE_STATE_DIR": str(tmp_path / "no-stack-here"),
        }
        out = ackline("migrate", env=env)
        assert out.returncode == 0, out.stderr
        assert "applied migrations" in out.stdout
    finally:
        db(services.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
