"""Schema evolution: agent.started v2 arrives through a migration and a payload plugin
while old and new workers share one group and one topic (docs/schema.md, "Evolving the schema").

The old worker is this build without the plugin; the new one loads
``tests.support.payloads_v2`` through ACKLINE_PAYLOAD_PLUGINS. Both run with
ACKLINE_NEWER_VERSION_WAIT_S, so a worker that meets v2 before it knows it holds the
partition instead of rejecting. Nothing either version accepts is rejected.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.error import URLError

import asyncpg
import pytest
from confluent_kafka import Consumer, KafkaError, Message

from ackline.roles import READER, with_user
from ackline.schemas import canonical_json, new_envelope
from ackline.sinks.admin.migrate import Migration, load_migrations, migrate
from ackline.streams.producer import ActivityProducer, record_key
from tests.integration.harness import Services, Worker, db, wait_until
from tests.support.payloads_v2 import AgentStartedV2

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "tests.support.payloads_v2:PAYLOADS"
MIGRATION = ROOT / "tests" / "support" / "sql" / "9001_agent_started_v2.sql"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def _migrate_v2(dsn: str) -> None:
    extra = Migration(9001, "agent_started_v2", MIGRATION.read_text(encoding="utf-8"))

    async def go() -> list[int]:
        conn = await asyncpg.connect(dsn)
        try:
            return await migrate(conn, [*load_migrations(), extra])
        finally:
            await conn.close()

    assert asyncio.run(go()) == [9001]


class Sent:
    """What was produced: (partition, offset) -> (event_id, schema_version, value)."""

    def __init__(self) -> None:
        self.records: dict[tuple[int, int], tuple[uuid.UUID, int, bytes]] = {}
        self.errors: list[Any] = []

    def hook(self, event_id: uuid.UUID, version: int, value: bytes) -> Any:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                self.errors.append(err)
            else:
                self.records[(msg.partition() or 0, msg.offset() or 0)] = (event_id, version, value)

        return on_delivery

    def last(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for p, o in self.records:
            out[p] = max(out.get(p, -1), o)
        return out

    def first_v2(self, partition: int) -> int | None:
        found = [o for (p, o), (_, v, _) in self.records.items() if p == partition and v == 2]
        return min(found) if found else None


def v1_step(agent: int, i: int) -> tuple[bytes, bytes, uuid.UUID]:
    env = new_envelope(
        "agent.step",
        txn_id=f"run-{agent}:{i}",
        agent_id=f"agent-{agent}",
        request_id=f"req-{agent}",
        payload={"run_id": f"run-{agent}", "step": i, "thought": f"step {i} ✓"},
        occurred_at=T0 + timedelta(seconds=i),
    )
    value = canonical_json(env.model_dump(mode="json"))
    return record_key(env, "agent"), value, env.event_id


def v2_started(agent: int, i: int) -> tuple[bytes, bytes, uuid.UUID]:
    """An agent.started v2 record, built without registering v2 in this test process."""
    payload = AgentStartedV2.model_validate(
        {"run_id": f"run-{agent}-{i}", "model": "m-2", "provider": "acme", "max_tokens": 4096 + i}
    )
    base = new_envelope(
        "agent.started",
        txn_id=f"start-{agent}:{i}",
        agent_id=f"agent-{agent}",
        request_id=f"req-{agent}",
        payload={"run_id": "x", "model": "x"},
        occurred_at=T0 + timedelta(seconds=i),
    ).model_dump(mode="json")
    body = {**base, "schema_version": 2, "payload": payload.model_dump(mode="json")}
    return record_key_of(body), canonical_json(body), uuid.UUID(body["event_id"])


def record_key_of(body: dict[str, Any]) -> bytes:
    return str(body["agent_id"]).encode()


def produce(
    services: Services, topic: str, sent: Sent, records: Iterable[tuple[bytes, bytes, uuid.UUID]]
) -> None:
    producer = ActivityProducer(services.bootstrap, topic, transactional_id=f"tx-{uuid.uuid4()}")
    producer.start()
    try:
        with producer.transaction():
            for key, value, event_id in records:
                version = int(json.loads(value)["schema_version"])
                producer.send_bytes(key, value, None, sent.hook(event_id, version, value))
    finally:
        producer.close()
    assert not sent.errors


def _assigned(worker: Worker) -> int:
    worker.ensure_alive()
    try:
        return int(worker.metric("ackline_assigned_partitions"))
    except (URLError, OSError):
        return 0


def _next_offsets(dsn: str, group: str) -> dict[int, tuple[int, str]]:
    rows = db(
        dsn,
        "SELECT partition, next_offset, owner FROM consumer_offsets WHERE group_id = $1",
        group,
    )
    return {int(r["partition"]): (int(r["next_offset"] or 0), str(r["owner"])) for r in rows}


def test_old_and_new_workers_share_a_topic_with_v1_and_v2(
    services: Services, dsn: str, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _migrate_v2(dsn)  # step 1 of the rollout: the database first (additive)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the plugin module, for the new worker
    group = f"g-{topic}"
    old = Worker(services, dsn, topic, tmp_path, name="old", newer_version_wait_s=300)
    new = Worker(
        services, dsn, topic, tmp_path, name="new", payload_plugins=PLUGIN, newer_version_wait_s=300
    )
    wait_until(
        lambda: (
            _assigned(old) >= 1 and _assigned(new) >= 1 and _assigned(old) + _assigned(new) == 3
        ),
        60,
        "both workers to own partitions",
    )

    # Phase A: v1 only. Both workers ingest side by side.
    sent = Sent()
    produce(services, topic, sent, [v1_step(a, 0) for a in range(30)])
    assert set(sent.last()) == {0, 1, 2}, "every partition gets records"

    def committed(partitions: Iterable[int]) -> bool:
        offsets = _next_offsets(dsn, group)
        last = sent.last()
        return all(offsets.get(p, (0, ""))[0] > last[p] for p in partitions)

    wait_until(lambda: committed(range(3)), 60, "phase A to be ingested")
    writers = {str(r["worker"]) for r in db(dsn, "SELECT DISTINCT worker FROM ingest_batches")}
    assert writers == {"old", "new"}

    # Phase B: producers emit v2 (and v1) while the old worker still runs.
    mix = []
    for a in range(30):
        mix += [v1_step(a, 1), v2_started(a, 1), v1_step(a, 2), v2_started(a, 2), v1_step(a, 3)]
    produce(services, topic, sent, mix)
    owners = {p: owner for p, (_, owner) in _next_offsets(dsn, group).items()}
    old_parts = [p for p, o in owners.items() if o == "old"]
    new_parts = [p for p, o in owners.items() if o == "new"]
    assert old_parts and new_parts

    def old_holds_at_first_v2() -> bool:
        old.ensure_alive()
        offsets = _next_offsets(dsn, group)
        log = old.log()
        return all(
            offsets[p][0] == sent.first_v2(p) and f"[{p}] at offset {sent.first_v2(p)}" in log
            for p in old_parts
        )

    # No downtime: the new worker ingests everything on its partitions, v1 and v2,
    # while the old one holds its partitions at their first v2 record, rejecting nothing.
    wait_until(lambda: committed(new_parts), 60, "the new worker to ingest v1 and v2")
    wait_until(old_holds_at_first_v2, 60, "the old worker to hold at the first v2 record")
    assert db(dsn, "SELECT count(*) AS n FROM rejects")[0]["n"] == 0
    assert old.metric("ackline_held_partitions") == len(old_parts)  # an operator sees it

    # Rolling deploy: the old worker stops; the new one takes over where it held.
    assert old.stop() == 0, old.log()[-3000:]
    wait_until(lambda: _assigned(new) == 3, 60, "the new worker to own every partition")
    wait_until(lambda: committed(range(3)), 60, "every record to be ingested")
    assert new.stop() == 0, new.log()[-3000:]

    rows = db(dsn, "SELECT event_id, schema_version, body_hash FROM activity")
    produced = {eid: (v, value) for eid, v, value in sent.records.values()}
    assert len(rows) == len(produced) == 30 + 150
    assert {r["event_id"] for r in rows} == set(produced)
    for r in rows:
        version, value = produced[r["event_id"]]
        assert r["schema_version"] == version
        body = {k: v for k, v in json.loads(value).items() if k != "event_id"}
        assert bytes(r["body_hash"]) == hashlib.sha256(canonical_json(body)).digest()
    assert db(dsn, "SELECT count(*) AS n FROM rejects")[0]["n"] == 0
    assert db(dsn, "SELECT count(*) AS n FROM conflicts")[0]["n"] == 0
    # The read model of the migration, as the read-only role: v2 fields where v2.
    starts = db(
        with_user(dsn, READER),
        "SELECT schema_version, provider, max_tokens FROM agent_starts ORDER BY max_tokens",
    )
    assert len(starts) == 60
    assert {(s["schema_version"], s["provider"]) for s in starts} == {(2, "acme")}


def test_hold_expires_into_a_reprocessable_reject(
    services: Services, dsn: str, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No worker that knows v2 comes: after the wait, v2 is rejected (reject row + dead
    letter), the partition flows on, and a worker that knows v2 ingests it when the
    dead-letter records are produced again."""
    _migrate_v2(dsn)
    group = f"g-{topic}"
    sent = Sent()
    produce(
        services,
        topic,
        sent,
        [v1_step(7, 0), v2_started(7, 0), v1_step(7, 1), v2_started(7, 1), v1_step(7, 2)],
    )
    (partition,) = set(sent.last())
    old = Worker(services, dsn, topic, tmp_path, name="old", newer_version_wait_s=1)

    def committed() -> bool:
        old.ensure_alive()
        return _next_offsets(dsn, group).get(partition, (0, ""))[0] > sent.last()[partition]

    wait_until(committed, 60, "the old worker to get past the v2 records")
    assert old.metric("ackline_held_partitions") == 0  # the hold ended
    assert old.stop() == 0, old.log()[-3000:]
    assert "holding" in old.log() and "rejecting the held record" in old.log()
    rejects = db(dsn, "SELECT reason, raw_key, raw_value FROM rejects ORDER BY src_offset")
    v2_values = [value for _, v, value in sorted(sent.records.values()) if v == 2]
    assert [r["reason"] for r in rejects] == ["unsupported_version"] * 2
    assert sorted(bytes(r["raw_value"]) for r in rejects) == sorted(v2_values)
    assert db(dsn, "SELECT count(*) AS n FROM activity")[0]["n"] == 3

    # Reprocess: a worker that knows v2, and the dead-letter records produced again
    # (key and value as they came; the worker deduplicates whatever was already stored).
    dead = _dead_letters(services.bootstrap, f"{topic}.dlq", 2)
    assert {dict(m.headers() or [])["ackline.reason"] for m in dead} == {b"unsupported_version"}
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    new = Worker(services, dsn, topic, tmp_path, name="new", payload_plugins=PLUGIN)
    again = Sent()
    produce(
        services, topic, again, [(m.key() or b"", m.value() or b"", uuid.uuid4()) for m in dead]
    )

    def reprocessed() -> bool:
        new.ensure_alive()
        return _next_offsets(dsn, group)[partition][0] > again.last()[partition]

    wait_until(reprocessed, 60, "the reprocessed v2 records to be ingested")
    assert new.stop() == 0, new.log()[-3000:]
    versions = db(dsn, "SELECT schema_version, count(*) AS n FROM activity GROUP BY 1 ORDER BY 1")
    assert [(r["schema_version"], r["n"]) for r in versions] == [(1, 3), (2, 2)]


def test_a_hold_behind_which_more_than_a_batch_is_buffered_loses_and_repeats_nothing(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """A buffer holds up to two batches' worth of records, and a batch takes the front of
    it: a hold that begins in one batch has later records of its partition still
    buffered. They are parked behind the held record, in order, and after the wait every
    v1 record is ingested once and only the v2 one is rejected."""
    _migrate_v2(dsn)
    group = f"g-{topic}"
    sent = Sent()
    records = [v1_step(9, i) for i in range(5)] + [v2_started(9, 0)]
    records += [v1_step(9, i) for i in range(5, 400)]
    produce(services, topic, sent, records)
    (partition,) = set(sent.last())
    w = Worker(
        services, dsn, topic, tmp_path, name="w", newer_version_wait_s=2, batch_max_events=20
    )

    def committed() -> bool:
        w.ensure_alive()
        return _next_offsets(dsn, group).get(partition, (0, ""))[0] > sent.last()[partition]

    wait_until(committed, 90, "the worker to get past the held record")
    assert w.stop() == 0, w.log()[-3000:]
    assert "holding" in w.log() and "rejecting the held record" in w.log()
    assert [r["reason"] for r in db(dsn, "SELECT reason FROM rejects")] == ["unsupported_version"]
    v1 = sorted(str(e) for e, v, _ in sent.records.values() if v == 1)
    stored = db(dsn, "SELECT event_id::text AS e FROM activity ORDER BY 1")
    assert [r["e"] for r in stored] == v1  # each v1 record once, none lost
    offsets = db(dsn, "SELECT src_offset FROM txn_ledger UNION ALL SELECT src_offset FROM rejects")
    assert sorted(r["src_offset"] for r in offsets) == sorted(o for _, o in sent.records)


def _dead_letters(bootstrap: str, topic: str, expected: int) -> list[Message]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reprocess-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[Message] = []

    def read() -> bool:
        got.extend(m for m in consumer.consume(100, timeout=0.5) if m.error() is None)
        return len(got) >= expected

    try:
        wait_until(read, 60, f"{expected} dead-letter records")
    finally:
        consumer.close()
    assert len(got) == expected
    return got
