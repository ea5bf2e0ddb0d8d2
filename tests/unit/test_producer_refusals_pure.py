"""The SDK's pure checks before and after a transaction: sizes and what a failure means."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError

from ackline.schemas.decode import DEFAULT_LIMITS
from ackline.streams.errors import ProduceError, TransientProduceError
from ackline.streams.producer import (
    SDK_MESSAGE_MAX_BYTES,
    Outgoing,
    check_fits,
    max_message_bytes,
    not_committed,
    record_size,
    transactional_config,
)


def _record(value: int, key: int = 7) -> Outgoing:
    return Outgoing(
        b"k" * key, b"v" * value, (("content-type", b"application/json"),), uuid.uuid4(), "t", b""
    )


def test_the_size_is_key_value_and_headers() -> None:
    assert record_size(_record(100, 7)) == 100 + 7 + len("content-type") + 16


def test_every_value_the_decoder_accepts_fits_the_sdk_default() -> None:
    conf = transactional_config("127.0.0.1:1", "t", None)
    assert max_message_bytes(conf) == SDK_MESSAGE_MAX_BYTES
    check_fits([_record(DEFAULT_LIMITS.max_bytes, key=4 * 200)], SDK_MESSAGE_MAX_BYTES)


def test_a_record_over_the_limit_is_named_with_the_setting() -> None:
    with pytest.raises(ProduceError, match=r"record 1 .* message\.max\.bytes \(1,000\)"):
        check_fits([_record(10), _record(1_000)], 1_000)


def test_a_bad_limit_setting_names_it() -> None:
    with pytest.raises(ProduceError, match=r"message\.max\.bytes must be a byte count"):
        max_message_bytes({"message.max.bytes": "lots"})


def test_only_the_brokers_absence_is_transient() -> None:
    away = [KafkaError(KafkaError._MSG_TIMED_OUT), KafkaError(KafkaError._TRANSPORT)]
    assert isinstance(not_committed(away), TransientProduceError)
    refused = [KafkaError(KafkaError._MSG_TIMED_OUT), KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)]
    error = not_committed(refused)
    assert type(error) is ProduceError and "nothing committed: 2 record(s)" in str(error)
