"""The producer SDK: validated envelopes on a transactional, idempotent producer.

An envelope is stamped once (event_id, occurred_at) by :func:`schemas.new_envelope` and
serialized once; the same bytes go out on every retry, so a retry can be recognised
downstream (same txn_id and body, and the same event_id when librdkafka retries).

Usage::

    producer = ActivityProducer(bootstrap, "agent-activity", transactional_id="svc-1")
    producer.start()
    with producer.transaction():
        producer.send(envelope)
    producer.close()
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ackline.core.logs import kafka_logger
from ackline.schemas.canonical import canonical_json
from ackline.schemas.envelope import Envelope
from ackline.streams.errors import ProduceError

log = logging.getLogger(__name__)

DeliveryHook = Callable[[KafkaError | None, Message], None]
CONTENT_TYPE = b"application/json"


def serialize(envelope: Envelope) -> bytes:
    """The wire form of an envelope: its canonical JSON (sorted keys, no whitespace)."""
    return canonical_json(envelope.model_dump(mode="json"))


def record_key(envelope: Envelope, key_by: Literal["agent", "request"]) -> bytes:
    """Partition key: every event of one agent (or one request) stays in order."""
    return (envelope.agent_id if key_by == "agent" else envelope.request_id).encode()


class ActivityProducer:
    """A transactional producer of activity envelopes. Nothing connects until start()."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        transactional_id: str,
        *,
        key_by: Literal["agent", "request"] = "agent",
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.topic = topic
        self.key_by = key_by
        self._conf: dict[str, Any] = {
            # librdkafka's lines through Python logging, de-duplicated (`extra` may
            # replace it with the service's own logger)
            "logger": kafka_logger(),
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 10,
            "compression.type": "lz4",
            "transaction.timeout.ms": 60_000,
            **(extra or {}),
        }
        self._producer: Producer | None = None

    def start(self, timeout: float = 30.0) -> None:
        """Connect and fence older producers with the same transactional.id."""
        producer = Producer(self._conf)
        try:
            producer.init_transactions(timeout)
        except KafkaException as exc:
            raise ProduceError(f"cannot initialise transactions: {exc}") from exc
        self._producer = producer

    @property
    def client(self) -> Producer:
        if self._producer is None:
            raise ProduceError("ActivityProducer.start() was not called")
        return self._producer

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Begin; run the block; commit. Any exception in the block aborts instead.

        Order of effects: begin_transaction; the block's sends; commit_transaction, which
        flushes and waits for every record and the commit marker. A crash before the
        commit marker is written leaves the records invisible to read_committed consumers
        (the broker aborts the transaction when it times out or the id is re-initialised).
        """
        producer = self.client
        producer.begin_transaction()
        try:
            yield
        except BaseException:
            self.abort()
            raise
        self._commit(producer)

    def _commit(self, producer: Producer) -> None:
        while True:
            try:
                producer.commit_transaction(60)
                return
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.retriable():
                    log.warning("commit_transaction retriable error, retrying: %s", err)
                    continue
                if err.txn_requires_abort():
                    self.abort()
                    raise ProduceError(f"transaction aborted: {err}") from exc
                raise ProduceError(f"transaction commit failed: {err}") from exc

    def abort(self) -> None:
        try:
            self.client.abort_transaction(60)
        except KafkaException as exc:
            raise ProduceError(f"abort_transaction failed: {exc}") from exc

    def send(self, envelope: Envelope, on_delivery: DeliveryHook | None = None) -> None:
        """Queue one validated envelope inside the current transaction."""
        headers: list[tuple[str, str | bytes | None]] = [
            ("content-type", CONTENT_TYPE),
            ("ackline.type", envelope.type.encode()),
            ("ackline.schema-version", str(envelope.schema_version).encode()),
        ]
        self.send_bytes(
            record_key(envelope, self.key_by), serialize(envelope), headers, on_delivery
        )

    def send_bytes(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        on_delivery: DeliveryHook | None = None,
    ) -> None:
        """Queue raw bytes (tests and load generation use this to send poison)."""
        producer = self.client
        while True:
            try:
                producer.produce(
                    self.topic, value=value, key=key, headers=headers or [], on_delivery=on_delivery
                )
                return
            except BufferError:
                producer.poll(0.05)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(30)
            self._producer = None
