"""Each dedup, conflict, poison and abort case through a real broker, worker and database."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Message

from ackline.schemas import Envelope, hash_envelope, new_envelope
from ackline.streams.producer import ActivityProducer
from tests.integration.harness import Services, Worker, db, wait_until

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def step(
    i: int, thought: str = "plan", txn: str | None = None, eid: uuid.UUID | None = None
) -> Envelope:
    return new_envelope(
        "agent.step",
        txn_id=txn or f"run-1:{i}",
        agent_id="agent-1",
        request_id="req-1",
        payload={"run_id": "run-1", "step": i, "thought": thought},
        occurred_at=T0,
        event_id=eid,
    )


POISON: dict[str, bytes | None] = {
    "not_utf8": b'\xff\xfe{"a": 1}',
    "invalid_json": b'{"event_id": ',
    "duplicate_key": b'{"type": "agent.step", "type": "agent.step"}',
    "non_finite_number": b'{"x": NaN}',
    "too_deep": b'{"a": ' + b"[" * 100 + b"]" * 100 + b"}",
    "unknown_type": None,  # filled below from a valid envelope
    "unsupported_version": None,
    "schema_invalid": None,
    "empty": b"",
    "too_large": b"{" + b" " * 5000 + b"}",
}


def _poison_values() -> dict[str, bytes]:
    good = step(99).model_dump(mode="json")
    values = {k: v for k, v in POISON.items() if v is not None}
    values["unknown_type"] = json.dumps({**good, "type": "agent.teleported"}).encode()
    values["unsupported_version"] = json.dumps({**good, "schema_version": 7}).encode()
    missing = dict(good)
    del missing["request_id"]
    values["schema_invalid"] = json.dumps(missing).encode()
    return values


class Deliveries:
    def __init__(self) -> None:
        self.last: dict[int, int] = {}
        self.errors: list[Any] = []

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(err)
            return
        p, o = msg.partition(), msg.offset()
        self.last[p] = max(self.last.get(p, -1), o)


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_every_case_lands_once(
    services: Services, dsn: str, topic: str, tmp_path: Path, protocol: str
) -> None:
    """Both group protocols: classic cooperative-sticky and KIP-848 `consumer`."""
    producer = ActivityProducer(services.bootstrap, topic, transactional_id=f"tx-{topic}")
    producer.start()
    seen = Deliveries()
    e1, e2, e3, e4, e5 = step(1), step(2), step(3), step(4), step(5)
    retry_e3 = step(3, eid=uuid.uuid4())  # producer retry: same txn and body, new event_id
    conflict_ledger = step(4, thought="changed", eid=uuid.uuid4())  # same txn_id, new body
    conflict_pk = step(50, thought="other", txn="run-1:other", eid=e5.event_id)  # same event_id
    aborted = step(6)
    poison = _poison_values()

    with producer.transaction():
        for env in (e1, e1, e2, e3, e4, e5):  # e1 twice: a duplicate inside one batch
            producer.send(env, on_delivery=seen)
    producer.client.begin_transaction()
    producer.send(aborted, on_delivery=seen)
    producer.client.flush(30)
    producer.abort()
    with producer.transaction():
        for env in (e2, retry_e3, conflict_ledger, conflict_pk):
            producer.send(env, on_delivery=seen)
        for reason, value in poison.items():
            producer.send_bytes(b"agent-1", value, [("reason", reason.encode())], on_delivery=seen)
    producer.close()
    assert not seen.errors

    worker = Worker(services, dsn, topic, tmp_path, max_message_bytes=4096, group_protocol=protocol)
    group = f"g-{topic}"

    def caught_up() -> bool:
        worker.ensure_alive()
        rows = db(
            dsn, "SELECT partition, next_offset FROM consumer_offsets WHERE group_id = $1", group
        )
        done = {r["partition"]: r["next_offset"] or 0 for r in rows}
        return all(done.get(p, 0) > last for p, last in seen.last.items())

    wait_until(caught_up, 90, "the worker to commit every produced offset")
    assert worker.stop() == 0, worker.log()[-3000:]

    rows = db(dsn, "SELECT event_id, body_hash FROM activity ORDER BY src_offset")
    assert {r["event_id"]: bytes(r["body_hash"]) for r in rows} == {
        e.event_id: hash_envelope(e) for e in (e1, e2, e3, e4, e5)
    }
    conflicts = db(
        dsn, "SELECT layer, event_id, stored_hash, incoming_hash FROM conflicts ORDER BY layer"
    )
    assert [(c["layer"], c["event_id"]) for c in conflicts] == [
        ("ledger", conflict_ledger.event_id),
        ("primary_key", conflict_pk.event_id),
    ]
    for c in conflicts:
        assert bytes(c["stored_hash"]) != bytes(c["incoming_hash"])
    assert bytes(conflicts[0]["stored_hash"]) == hash_envelope(e4)
    rejects = db(dsn, "SELECT reason, raw_value, dlq_offset FROM rejects ORDER BY src_offset")
    assert [r["reason"] for r in rejects] == list(poison)
    assert [bytes(r["raw_value"] or b"") for r in rejects] == list(poison.values())
    totals = db(
        dsn,
        "SELECT sum(inserted) AS ins, sum(duplicates_ledger) AS dl, sum(duplicates_pk) AS dp, "
        "sum(conflicts_ledger) AS cl, sum(conflicts_pk) AS cp, sum(rejects) AS rj "
        "FROM ingest_batches",
    )[0]
    # duplicates: e1 (in batch), e2 (redelivered later), retry_e3 (new event_id, same txn)
    assert dict(totals) == {"ins": 5, "dl": 3, "dp": 0, "cl": 1, "cp": 1, "rj": len(poison)}

    dead = _read_all(services.bootstrap, f"{topic}.dlq", expected=len(poison))
    reasons = sorted(dict(m.headers() or [])["ackline.reason"].decode() for m in dead)
    assert reasons == sorted(poison)
    for m in dead:
        headers = dict(m.headers() or [])
        assert headers["ackline.source.topic"].decode() == topic
        assert int(headers["ackline.source.offset"]) >= 0


def _read_all(bootstrap: str, topic: str, expected: int) -> list[Message]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    got: list[Message] = []
    try:
        wait_until(lambda: _drain(consumer, got) >= expected, 60, f"{expected} records on {topic}")
    finally:
        consumer.close()
    assert len(got) == expected
    return got


def _drain(consumer: Consumer, into: list[Message]) -> int:
    for m in consumer.consume(100, timeout=0.5):
        if m.error() is None:
            into.append(m)
    return len(into)
