"""The producer SDK's pure parts: one set of bytes per event, and what a commit error means."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from confluent_kafka import KafkaError, KafkaException

from ackline.schemas import Envelope, SchemaError, hash_envelope, new_envelope
from ackline.schemas.decode import Row, decode
from ackline.streams.errors import OutcomeUnknownError, ProducerFencedError, kafka_error
from ackline.streams.producer import prepare, serialize, settle, txn_action

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def called(arguments: object) -> Envelope:
    return new_envelope(
        "tool.called",
        "run-1:3",
        "agent-1",
        "req-1",
        {"run_id": "run-1", "call_id": "c1", "tool": "search", "arguments": arguments},
        occurred_at=T0,
    )


def test_prepare_fixes_the_bytes_the_worker_will_read() -> None:
    env = called({"q": "x"})
    first, again = prepare(env), prepare(env)
    assert first == again and first.value == serialize(env)
    assert first.key == b"agent-1" and prepare(env, "request").key == b"req-1"
    assert first.body_hash == hash_envelope(env)
    row = decode(first.value)
    assert isinstance(row, Row) and (row.event_id, row.txn_id) == (first.event_id, first.txn_id)
    assert dict(first.headers)["ackline.type"] == b"tool.called"


def test_prepare_refuses_what_the_worker_would_reject() -> None:
    deep: object = "leaf"
    for _ in range(40):  # the model allows it; the decoder's depth limit (32) does not
        deep = {"d": deep}
    env = called(deep)
    with pytest.raises(SchemaError, match="too_deep"):
        prepare(env)
    with pytest.raises(SchemaError, match="expected an Envelope"):
        prepare({"type": "agent.step"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("err", "action"),
    [
        (KafkaError(KafkaError._FENCED, "fenced", fatal=True), "fenced"),
        (KafkaError(KafkaError.PRODUCER_FENCED, "fenced"), "fenced"),
        (KafkaError(KafkaError._FATAL, "fatal", fatal=True), "fatal"),
        (KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "big", txn_requires_abort=True), "abort"),
        (KafkaError(KafkaError._TIMED_OUT, "slow", retriable=True), "retry"),
        (KafkaError(KafkaError._STATE, "state"), "unknown"),
    ],
)
def test_commit_errors_are_judged_once_for_both_producers(err: KafkaError, action: str) -> None:
    assert txn_action(err) == action


def test_settled_errors_and_wrapped_fatal_errors() -> None:
    fenced = KafkaError(KafkaError._FENCED, "fenced", fatal=True)
    assert isinstance(settle(fenced, "commit"), ProducerFencedError)
    unknown = settle(KafkaError(KafkaError._STATE, "state"), "commit")
    assert isinstance(unknown, OutcomeUnknownError) and not isinstance(unknown, ProducerFencedError)
    # AIOProducer raises a fatal error as a SystemError caused by the KafkaException.
    try:
        try:
            raise KafkaException(fenced)
        except KafkaException as exc:
            raise SystemError("result with an exception set") from exc
    except SystemError as wrapped:
        assert kafka_error(wrapped) is fenced
    assert kafka_error(ValueError("no kafka here")) is None
