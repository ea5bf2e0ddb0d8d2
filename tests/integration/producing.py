"""Helpers of the producer tests: what a worker made of a topic, and what the topic holds."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

import ackline
from ackline.schemas import new_envelope
from ackline.schemas.envelope import Envelope
from ackline.streams.admin import admin_client, topic_max_message_bytes
from ackline.streams.producer import ActivityProducer, Delivery, Outgoing
from tests.integration.harness import Worker, db, wait_until

ROOT = Path(ackline.__file__).resolve().parent.parent
SCHEMA = ROOT / "schemas" / "json" / "envelope.v1.schema.json"


@dataclass(frozen=True)
class Ingested:
    """The database after a worker ran: rows and what every batch counted."""

    event_ids: frozenset[uuid.UUID]
    rows: int
    inserted: int
    duplicates: int
    conflicts: int
    rejects: int


def ingested(dsn: str) -> Ingested:
    ids = db(dsn, "SELECT event_id FROM activity")
    sums = db(
        dsn,
        "SELECT coalesce(sum(inserted), 0) AS ins,"
        " coalesce(sum(duplicates_ledger + duplicates_pk), 0) AS dup,"
        " coalesce(sum(conflicts_ledger + conflicts_pk), 0) AS con,"
        " coalesce(sum(rejects), 0) AS rej FROM ingest_batches",
    )[0]
    return Ingested(
        frozenset(r["event_id"] for r in ids),
        len(ids),
        int(sums["ins"]),
        int(sums["dup"]),
        int(sums["con"]),
        int(sums["rej"]),
    )


def last_offsets(deliveries: Iterable[Delivery]) -> dict[int, int]:
    last: dict[int, int] = {}
    for d in deliveries:
        last[d.partition] = max(d.offset, last.get(d.partition, -1))
    return last


def wait_past(
    dsn: str, worker: Worker, topic: str, last: Mapping[int, int], timeout: float = 120
) -> None:
    """Wait until the worker's offsets in PostgreSQL are past ``last`` (partition -> offset)."""

    def done() -> bool:
        worker.ensure_alive()
        rows = db(
            dsn, "SELECT partition, next_offset FROM consumer_offsets WHERE topic = $1", topic
        )
        have = {int(r["partition"]): r["next_offset"] for r in rows}
        return all((have.get(p) or 0) > off for p, off in last.items())

    wait_until(done, timeout, f"the worker to commit past {dict(last)}")


def committed_values(bootstrap: str, topic: str, partitions: int = 3) -> list[bytes]:
    """Every record value of ``topic`` a read_committed consumer sees, to the end.

    The partitions are assigned, not subscribed: no group coordinator stands between the
    reader and the log (a reader that saw no end for 60 s after a frozen broker, once in
    a full suite, could not say why). A reader that sees no end names, per partition, its
    position and the broker's watermarks, and whether an end was seen.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    values: list[bytes] = []
    at_end: set[int] = set()
    errors: list[str] = []

    def more() -> bool:
        for msg in consumer.consume(500, timeout=0.5):
            err = msg.error()
            if err is None:
                values.append(msg.value() or b"")
            elif err.code() == KafkaError._PARTITION_EOF:
                at_end.add(msg.partition() or 0)
            else:
                errors[:] = [*errors[-4:], str(err)]
        return len(at_end) >= partitions

    try:
        found = len(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        assert found == partitions, f"{topic} has {found} partitions, not {partitions}"
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        try:
            wait_until(more, 60, f"the end of every partition of {topic}", interval=0)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {_reader_state(consumer, topic, partitions, at_end)}"
                                 f"; last errors {errors}") from None  # fmt: skip
    finally:
        consumer.close()
    return values


def _reader_state(consumer: Consumer, topic: str, partitions: int, at_end: set[int]) -> str:
    """Per partition: the reader's position, the broker's low/high watermarks, end seen."""
    where = {
        tp.partition: tp.offset
        for tp in consumer.position([TopicPartition(topic, p) for p in range(partitions)])
    }
    parts = []
    for p in range(partitions):
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
            marks = f"{low}..{high}"
        except Exception as exc:  # a diagnosis, not the failure
            marks = f"watermarks unknown ({exc})"
        parts.append(
            f"[{p}] at {where.get(p)} of {marks}, end {'seen' if p in at_end else 'not seen'}"
        )
    return "; ".join(parts)


def json_schema_validator() -> Any:
    """A standard (Draft 2020-12) validator of the exported schema, formats checked."""
    from jsonschema import Draft202012Validator

    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def send_in_one_transaction(bootstrap: str, topic: str, sent: list[Outgoing]) -> None:
    """``sent`` committed to ``topic`` in one transaction of a fresh producer, then closed."""
    producer = ActivityProducer(bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}")
    producer.start()
    try:
        producer.send_transaction(sent, timeout=30)
    finally:
        producer.close()


def unit_of_work(request: str, agent: str, steps: int) -> list[Envelope]:
    """One request served by one agent run: requested, started, steps, a tool call, finished.

    ``txn_id``s follow docs/producing.md: ``req:<request>``, ``start:<request>`` (one
    request, one agent), ``<run>:<seq>`` for each later event.
    """
    run = f"run-{request}"
    events = [
        new_envelope(
            "agent.requested",
            f"req:{request}",
            agent,
            request,
            {"prompt": "summarise", "requested_by": "user-1", "priority": 3, "tools": ["search"]},
        ),
        new_envelope(
            "agent.started", f"start:{request}", agent, request, {"run_id": run, "model": "m"}
        ),
    ]
    for i in range(steps):
        events.append(
            new_envelope(
                "agent.step",
                f"{run}:{len(events)}",
                agent,
                request,
                {"run_id": run, "step": i, "thought": f"step {i} \u00e9\u00e8 \u2603"},
            )
        )
    events.append(
        new_envelope(
            "tool.called",
            f"{run}:{len(events)}",
            agent,
            request,
            {"run_id": run, "call_id": "c1", "tool": "search", "arguments": {"q": "x", "n": 1.5}},
        )
    )
    events.append(
        new_envelope(
            "agent.finished",
            f"{run}:{len(events)}",
            agent,
            request,
            {"run_id": run, "steps": steps, "tokens_in": 10, "tokens_out": 20, "summary": "ok"},
        )
    )
    return events


def set_max_message_bytes(bootstrap: str, topic: str, size: int) -> None:
    """The broker takes records of ``topic`` up to ``size`` bytes (``max.message.bytes``),
    and says so: the alteration is acknowledged before a broker describes the topic with
    it (KRaft: the broker learns it from the metadata log), and a producer started in
    between read the old limit (the producer SDK batches within what it read)."""
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("max.message.bytes", str(size), incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with admin_client(bootstrap) as client:
        for future in client.incremental_alter_configs([resource]).values():
            future.result(timeout=30)
    wait_until(
        lambda: topic_max_message_bytes(bootstrap, topic, 5.0) == size,
        30,
        f"{topic} described with max.message.bytes={size}",
    )
