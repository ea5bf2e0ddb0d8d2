"""The dead-letter producer: poison goes to a topic, acknowledged before the offset moves.

Each dead-letter record keeps the original key, value and headers, and adds headers
with the reason and the source coordinates, so readers can de-duplicate the repeats
that a crash between this write and the batch commit can cause.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from ackline.core.logs import kafka_logger
from ackline.sinks.ingest.batch import Coord, RejectRecord
from ackline.streams.admin import ensure_topic, partition_count
from ackline.streams.errors import ProduceError, TopicError

log = logging.getLogger(__name__)


Headers = list[tuple[str, str | bytes | None]]
"""A record's headers as the Kafka clients hand them: (key, value) pairs."""


def safe_headers(msg: Message) -> Headers:
    """The headers of a consumed record, or the fact that they could not be read.

    confluent-kafka turns header keys into str without checking they are UTF-8: a key
    that is not (other clients can send one) makes ``msg.headers()`` raise. The record
    must still be dead-lettered, so the headers are then replaced by one marker header.
    """
    try:
        raw = msg.headers()
    except (UnicodeDecodeError, ValueError, SystemError) as exc:
        return [("ackline.headers-unreadable", f"{type(exc).__name__}: {exc}"[:200].encode())]
    if raw is None:
        return []
    return list(raw.items()) if isinstance(raw, dict) else list(raw)


@dataclass(frozen=True, slots=True)
class Poison:
    """A consumed record that did not decode, with why."""

    coord: Coord
    reason: str
    detail: str
    key: bytes | None
    value: bytes | None
    headers: Headers


def headers_json(headers: Headers) -> list[dict[str, str | None]]:
    """Headers as JSON-safe dicts: base64 of the bytes, and the text when it is clean."""
    out: list[dict[str, str | None]] = []
    for key, raw in headers:
        text: str | None = None
        value = raw.encode() if isinstance(raw, str) else raw
        if value is not None:
            try:
                decoded = value.decode("utf-8")
                text = decoded if "\x00" not in decoded else None
            except UnicodeDecodeError:
                text = None
        clean_key = key.replace("\x00", "\\u0000")
        out.append(
            {
                "key": clean_key,
                "value": text,
                "b64": None if value is None else base64.b64encode(value).decode(),
            }
        )
    return out


DLQ_MAX_MESSAGE_BYTES = 10 * 1_048_576
"""Record size limit of the dead-letter producer and topic (oversize poison must fit)."""
DLQ_MAX_VALUE_BYTES = 8 * 1_048_576
"""A poison value larger than this is cut to its first 64 KiB in the dead-letter record
(header ``ackline.value-truncated`` gives the original length); the reject row in
PostgreSQL always keeps the whole value."""
DLQ_TOPIC_CONFIG = {"max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)}


class DeadLetterProducer:
    """Idempotent producer for the dead-letter topic. Connects lazily on first send."""

    def __init__(self, bootstrap: str, topic: str, extra: dict[str, Any] | None = None) -> None:
        self.topic = topic
        self._conf: dict[str, Any] = {
            "logger": kafka_logger(),  # librdkafka's lines, de-duplicated (core/logs.py)
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "delivery.timeout.ms": 60_000,
            "message.max.bytes": DLQ_MAX_MESSAGE_BYTES,
            "compression.type": "lz4",
            **(extra or {}),
        }
        self._producer: Producer | None = None

    def _client(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(self._conf)
        return self._producer

    def send_all(
        self, poison: list[Poison], should_stop: Callable[[], bool] = lambda: False
    ) -> list[RejectRecord]:
        """Write every poison record and wait until the broker acknowledged each one.

        Order of effects: produce all, flush, read each delivery report. Records whose
        delivery failed are produced again (a repeat is harmless: readers de-duplicate
        on the source coordinates) until all are acknowledged or ``should_stop`` says
        to give up, which raises ProduceError and must abandon the batch. Only when this
        returns may the batch that holds the matching reject rows commit.
        """
        pending = list(poison)
        acked: dict[Coord, tuple[int, int]] = {}
        delay = 0.2
        producer = self._client()
        while pending:
            # Delivery reports run inside flush(), on this thread.
            failed: list[Poison] = []
            for item in pending:
                self._produce(producer, item, _Report(item, acked, failed))
            remaining = producer.flush(30)
            if remaining:
                raise ProduceError(f"{remaining} dead-letter records unacknowledged after 30 s")
            pending = failed
            if pending:
                if should_stop():
                    raise ProduceError("stopping with dead-letter records unacknowledged")
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        return [
            RejectRecord(
                coord=p.coord,
                reason=p.reason,
                detail=p.detail,
                raw_key=p.key,
                raw_value=p.value,
                headers=headers_json(p.headers),
                dlq_topic=self.topic,
                dlq_partition=acked[p.coord][0],
                dlq_offset=acked[p.coord][1],
            )
            for p in poison
        ]

    def _produce(self, producer: Producer, item: Poison, report: _Report) -> None:
        headers: Headers = [
            *item.headers,
            ("ackline.reason", item.reason.encode()),
            ("ackline.detail", item.detail.encode("utf-8", "replace")[:1000]),
            ("ackline.source.topic", item.coord.topic.encode()),
            ("ackline.source.partition", str(item.coord.partition).encode()),
            ("ackline.source.offset", str(item.coord.offset).encode()),
        ]
        value = item.value
        if value is not None and len(value) > DLQ_MAX_VALUE_BYTES:
            headers.append(("ackline.value-truncated", str(len(value)).encode()))
            value = value[:65_536]
        while True:
            try:
                producer.produce(
                    self.topic,
                    value=value,
                    key=item.key,
                    headers=headers,
                    on_delivery=report,
                )
                return
            except BufferError:
                producer.poll(0.1)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None


class _Report:
    """Delivery callback for one dead-letter record."""

    def __init__(self, item: Poison, acked: dict[Coord, tuple[int, int]], failed: list[Poison]):
        self.item, self.acked, self.failed = item, acked, failed

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.acked[self.item.coord] = (msg.partition() or 0, msg.offset() or 0)
        else:
            log.warning("dead-letter write failed for %s: %s", self.item.coord, err)
            self.failed.append(self.item)


def prepare_topics(
    bootstrap: str, topic: str, dlq_topic: str, conf: dict[str, Any] | None = None
) -> int:
    """The source topic's partition count, once the dead-letter topic exists.

    Raises TopicError naming ``ACKLINE_TOPIC`` when the source topic does not exist: a
    worker never creates the topic it reads. Creates ``dlq_topic`` (up to 3 partitions,
    :data:`DLQ_TOPIC_CONFIG`) when it is missing, so the first reject has somewhere to go.
    """
    partitions = partition_count(bootstrap, topic, conf=conf)
    if partitions is None:
        raise TopicError(
            f"topic {topic} does not exist on {bootstrap} (create it, or set ACKLINE_TOPIC)"
        )
    ensure_topic(
        bootstrap, dlq_topic, partitions=min(partitions, 3), config=DLQ_TOPIC_CONFIG, conf=conf
    )
    return partitions
