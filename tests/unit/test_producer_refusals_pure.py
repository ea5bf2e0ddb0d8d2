"""The SDK's pure checks before and after a transaction: sizes and what a failure means."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable
from typing import cast

import pytest
from confluent_kafka import KafkaError

from ackline.schemas import Envelope, SchemaError
from ackline.schemas.decode import DEFAULT_LIMITS
from ackline.streams.errors import OutcomeUnknownError, ProduceError, TransientProduceError
from ackline.streams.producer import (
    SDK_MESSAGE_MAX_BYTES,
    ActivityProducer,
    Outgoing,
    batch_within,
    check_callbacks,
    check_fits,
    client_limits,
    connection_config,
    failure_causes,
    not_committed,
    record_size,
    send_failed,
    send_refused,
    topic_missing,
    transactional_config,
)


def _record(value: int, key: int = 7) -> Outgoing:
    return Outgoing(
        b"k" * key, b"v" * value, (("content-type", b"application/json"),), uuid.uuid4(), "t", b""
    )


def test_the_size_is_key_value_and_headers() -> None:
    assert record_size(_record(100, 7)) == 100 + 7 + len("content-type") + 16


def test_every_value_the_decoder_accepts_fits_the_sdk_default() -> None:
    limits = client_limits(transactional_config("127.0.0.1:1", "t", None))
    assert limits.message_max_bytes == SDK_MESSAGE_MAX_BYTES
    check_fits([_record(DEFAULT_LIMITS.max_bytes, key=4 * 200)], limits)


def test_a_record_over_the_limit_is_named_with_the_setting() -> None:
    limits = client_limits({"message.max.bytes": 1_000})
    with pytest.raises(ProduceError, match=r"record 1 .* message\.max\.bytes \(1,000 bytes\)"):
        check_fits([_record(10), _record(1_000)], limits)


def test_a_record_larger_than_the_whole_local_queue_is_named_with_the_setting() -> None:
    limits = client_limits({"queue.buffering.max.kbytes": 1})
    with pytest.raises(ProduceError, match=r"queue\.buffering\.max\.kbytes \(1,024 bytes\)"):
        check_fits([_record(2_000)], limits)


def test_a_bad_limit_setting_names_it() -> None:
    with pytest.raises(ProduceError, match=r"message\.max\.bytes must be a positive count"):
        client_limits({"message.max.bytes": "lots"})
    with pytest.raises(ProduceError, match=r"queue\.buffering\.max\.messages must be"):
        client_limits({"queue.buffering.max.messages": 0})


def test_only_the_brokers_absence_is_transient() -> None:
    away = [KafkaError(KafkaError._MSG_TIMED_OUT), KafkaError(KafkaError._TRANSPORT)]
    assert isinstance(not_committed(away), TransientProduceError)
    refused = [KafkaError(KafkaError._MSG_TIMED_OUT), KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)]
    error = not_committed(refused)
    assert type(error) is ProduceError and "nothing committed: 2 record(s)" in str(error)


def test_a_missing_topic_is_transient_and_named() -> None:
    """librdkafka fails the records of a topic it never saw (after
    ``topic.metadata.propagation.max.ms``) with UNKNOWN_TOPIC_OR_PART: not a refusal of
    the records, which go through once the topic exists."""
    missing = [KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), KafkaError(KafkaError._TRANSPORT)]
    error = not_committed(missing, "t-1")
    assert type(error) is TransientProduceError, repr(error)
    assert "topic t-1 does not exist" in str(error) and "from a new instance" not in str(error)
    timed_out = topic_missing("t-1")
    assert type(timed_out) is TransientProduceError
    assert "topic t-1 does not exist" in str(timed_out) and "new instance" in str(timed_out)
    refused = [KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), KafkaError(KafkaError.INVALID_RECORD)]
    assert type(not_committed(refused, "t-1")) is ProduceError


def test_a_batch_too_large_beside_a_refusal_is_not_called_transient() -> None:
    """A batch refused as too large while the topic's limit is below the producer's
    batches is transient (a new instance batches within the limit); the same abort also
    holding a refusal no new instance cures (here the topic's authorization) was called
    transient too, and a caller that sends again on a TransientProduceError retried it
    for ever."""
    big = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    alone = not_committed([big, KafkaError(KafkaError._MSG_TIMED_OUT)], "t-1", (20_000, 1_000_000))
    assert type(alone) is TransientProduceError, repr(alone)
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    mixed = not_committed([big, denied], "t-1", (20_000, 1_000_000))
    assert type(mixed) is ProduceError, repr(mixed)
    assert "from a new one" in str(mixed)  # and the instance's batches are still named
    missing = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    assert type(not_committed([big, missing], "t-1", (20_000, 1_000_000))) is (
        TransientProduceError
    )


def test_batches_are_kept_within_the_topics_limit() -> None:
    """librdkafka fills a batch of several records up to ``batch.size`` (or
    ``message.max.bytes``, the smaller) and never splits one the broker refused."""
    conf = transactional_config("127.0.0.1:1", "t", None)
    assert batch_within(conf, None) is conf  # the limit unknown
    assert batch_within(conf, 1_048_588) is conf  # Kafka's default: above 1,000,000
    assert batch_within(conf, 20_000)["batch.size"] == 20_000
    own = {**conf, "batch.size": 10_000}
    assert batch_within(own, 20_000) is own  # the service's own, lower, is kept
    low = {**conf, "message.max.bytes": 15_000}
    assert batch_within(low, 20_000) is low
    assert "batch.size" not in conf


def test_the_admin_client_gets_the_connection_settings_only() -> None:
    conf = transactional_config(
        "127.0.0.1:1", "t", {"security.protocol": "SSL", "sasl.mechanism": "PLAIN"}
    )
    assert connection_config(conf) == {
        "bootstrap.servers": "127.0.0.1:1",
        "security.protocol": "SSL",
        "sasl.mechanism": "PLAIN",
    }


def test_refusals_and_purges_after_a_failure_are_not_its_cause() -> None:
    """Records that timed out behind a full queue fail the transaction; librdkafka then
    refuses later records (``_STATE``) and purges the queued ones: judged as refusals they
    turned the broker's absence into a ProduceError."""
    after = [
        KafkaError(KafkaError._MSG_TIMED_OUT),
        KafkaError(KafkaError._STATE),
        KafkaError(KafkaError._PURGE_QUEUE),
        KafkaError(KafkaError._PURGE_INFLIGHT),
    ]
    causes = failure_causes(after)
    assert [err.code() for err in causes] == [KafkaError._MSG_TIMED_OUT]
    assert isinstance(not_committed(causes), TransientProduceError)
    assert failure_causes(after[1:]) == []


def test_a_send_the_block_caught_keeps_its_meaning() -> None:
    """A ``transaction()`` block that caught a send's error and went on is aborted: the
    error says so, names the send's error, and stays transient only if that one was."""
    away = send_failed(TransientProduceError("the local queue had no room for 2 s"))
    assert isinstance(away, TransientProduceError)
    assert "nothing committed" in str(away) and "TransientProduceError: the local" in str(away)
    # a caller's timeout around a send cancels it: no verdict on the record
    for unknown in (asyncio.CancelledError(), OutcomeUnknownError("flush not confirmed")):
        assert type(send_failed(unknown)) is TransientProduceError
    for refused in (ProduceError("record 0 is over"), ValueError("bad")):
        error = send_failed(refused)
        assert type(error) is ProduceError and str(refused) in str(error)


def test_a_failed_send_is_kept_whichever_call_raised_it_and_only_the_first() -> None:
    """``send``, ``send_record`` and ``send_bytes`` each keep the first error a send raised
    (a transaction() block then aborts instead of committing without the record). Checked
    on producers never started: the failures come before anything would connect."""
    oversize = _record(SDK_MESSAGE_MAX_BYTES)
    calls: list[Callable[[ActivityProducer], None]] = [
        lambda p: p.send(cast(Envelope, object())),  # not an Envelope: SchemaError
        lambda p: p.send_record(oversize),  # over message.max.bytes: ProduceError
        lambda p: p.send_bytes(b"k", b"v"),  # not started: ProduceError
    ]
    for call in calls:
        producer = ActivityProducer("127.0.0.1:1", "t", "svc-unit")
        with pytest.raises(ProduceError if call is not calls[0] else SchemaError) as first:
            call(producer)
        assert producer._failed is first.value
        for later in calls:
            with pytest.raises((ProduceError, SchemaError)):
                later(producer)
        assert producer._failed is first.value


def test_a_send_after_a_failed_one_is_refused_naming_it_with_its_meaning() -> None:
    """A send in a ``transaction()`` block after one that raised is refused at once: the
    error names the first one and is transient only if that one was (as send_failed)."""
    away = send_refused(TransientProduceError("the local queue had no room for 2 s"))
    assert isinstance(away, TransientProduceError)
    assert "not sent" in str(away) and "TransientProduceError: the local" in str(away)
    refused = send_refused(ProduceError("record 0 is over"))
    assert type(refused) is ProduceError and "record 0 is over" in str(refused)


def test_the_asyncio_producer_refuses_a_default_on_delivery_naming_it() -> None:
    """AIOProducer gives every record a callback of its own (its future), so an
    ``on_delivery`` in ``extra`` would never fire: refused when the producer is made,
    naming the setting and what to use instead."""
    from ackline.streams.aio_producer import AsyncActivityProducer

    with pytest.raises(ProduceError, match=r"on_delivery.*delivery future"):
        AsyncActivityProducer("127.0.0.1:9", "t", "svc", extra={"on_delivery": print})


class _AsyncCallable:
    """A callback object whose ``__call__`` is a coroutine function: AIOProducer awaits
    what it returns, as it does a coroutine function's."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, raw: str) -> None:
        self.seen.append(raw)
        raise RuntimeError("the service's stats_cb failed")


def test_an_object_with_an_async_call_is_a_coroutine_callback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Judged by ``inspect.iscoroutinefunction`` alone, such an object was refused by the
    asyncio SDK (it works there) and accepted by the synchronous one (where it never runs),
    and shielded() wrapped it as a plain function: AIOProducer then awaited None."""
    callback = _AsyncCallable()
    check_callbacks({"stats_cb": callback}, coroutines=True)
    with pytest.raises(ProduceError, match="stats_cb in extra must be a plain function"):
        check_callbacks({"stats_cb": callback}, coroutines=False)
    wrapped = transactional_config("127.0.0.1:9", "svc-x", {"stats_cb": callback})["stats_cb"]
    assert asyncio.run(wrapped("{}")) is None
    assert callback.seen == ["{}"]
    assert "stats_cb raised" in caplog.text


def test_a_coroutine_delivery_hook_is_refused_by_the_synchronous_sdk() -> None:
    """librdkafka calls a delivery hook; a coroutine's would never be awaited, so the hook
    silently never ran. It is refused, in ``extra`` when the producer is made."""

    async def hook(err: KafkaError | None, msg: object) -> None:
        pass

    for bad in (hook, _AsyncCallable(), "not callable"):
        with pytest.raises(ProduceError, match="on_delivery must be a plain callable"):
            ActivityProducer("127.0.0.1:9", "t", "svc-x", extra={"on_delivery": bad})


def test_a_partial_of_an_async_callable_is_async() -> None:
    """functools.partial hides its function's kind from the check of __call__."""
    callback = functools.partial(_AsyncCallable())
    check_callbacks({"stats_cb": callback}, coroutines=True)
    with pytest.raises(ProduceError, match="must be a plain function"):
        check_callbacks({"stats_cb": callback}, coroutines=False)
