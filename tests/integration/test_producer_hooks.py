"""A service's delivery hook never decides what the synchronous SDK says was committed.

librdkafka serves delivery reports inside ``commit_transaction`` (its flush), and
confluent-kafka lets an exception that a Python callback raised there out of
``commit_transaction`` in place of its result, whatever the commit did. So a hook that
raised made a committed transaction look failed, and a service that sends the same records
again on an error wrote them twice into the topic. The SDK calls every hook itself and
logs what a hook raises, as Kafka's Java producer does with its callbacks.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import KafkaError, Message

from ackline.streams.aio_producer import AsyncActivityProducer
from ackline.streams.errors import OutcomeUnknownError, ProduceError, TransientProduceError
from ackline.streams.producer import ActivityProducer, DeliveryHook, Outgoing, prepare
from tests.integration.harness import Services
from tests.integration.producing import committed_values, unit_of_work

pytestmark = pytest.mark.integration


class HookFailed(Exception):
    """What the service's hook raises."""


def _raising(seen: list[bytes]) -> DeliveryHook:
    def hook(err: KafkaError | None, msg: Message) -> None:
        seen.append(msg.value())
        raise HookFailed("the service's hook failed")

    return hook


def test_a_raising_hook_in_a_transaction_block_leaves_the_commit_as_it_was(
    services: Services, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each record's own hook raises: the block commits, every record once, the hook saw
    every report, each error is logged, and the instance goes on to a second transaction."""
    first = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-h", 1)]
    second = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-h", 1)]
    seen: list[bytes] = []
    producer = ActivityProducer(services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}")
    producer.start()
    try:
        with caplog.at_level(logging.ERROR, logger="ackline"):
            for records in (first, second):
                with producer.transaction(timeout=30):
                    for record in records:
                        producer.send_record(record, on_delivery=_raising(seen))
    finally:
        producer.close()
    values = sorted(r.value for r in first + second)
    assert sorted(committed_values(services.bootstrap, topic)) == values
    assert sorted(seen) == values
    failures = [r for r in caplog.records if r.exc_info and r.exc_info[0] is HookFailed]
    assert len(failures) == len(values), caplog.text


def test_a_raising_default_hook_leaves_send_transaction_s_deliveries_as_they_were(
    services: Services, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The configuration's ``on_delivery`` raises for every record: ``send_transaction``
    still returns each record's delivery, and the records are committed once."""
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-h", 2)]
    seen: list[bytes] = []
    producer = ActivityProducer(
        services.bootstrap,
        topic,
        f"svc-{uuid.uuid4().hex[:8]}",
        extra={"on_delivery": _raising(seen)},
    )
    producer.start()
    try:
        with caplog.at_level(logging.ERROR, logger="ackline"):
            deliveries = producer.send_transaction(records, timeout=30)
    finally:
        producer.close()
    assert [d.offset >= 0 for d in deliveries] == [True] * len(records)
    values = sorted(r.value for r in records)
    assert sorted(committed_values(services.bootstrap, topic)) == values
    assert sorted(seen) == values
    failures = [r for r in caplog.records if r.exc_info and r.exc_info[0] is HookFailed]
    assert len(failures) == len(values), caplog.text


def _interrupting(at_call: int) -> DeliveryHook:
    """A hook that raises KeyboardInterrupt on its ``at_call``-th report, and only then."""
    calls = 0

    def hook(err: KafkaError | None, msg: Message) -> None:
        nonlocal calls
        calls += 1
        if calls == at_call:
            raise KeyboardInterrupt

    return hook


def _resend(services: Services, topic: str, slot: str, records: list[Outgoing]) -> None:
    """The same records from a new instance of ``slot`` (its start settles the old one's
    transaction)."""
    again = ActivityProducer(services.bootstrap, topic, slot)
    again.start()
    try:
        again.send_transaction(records, timeout=30)
    finally:
        again.close()


@pytest.mark.parametrize("at", ["first", "last"])
def test_an_interrupt_from_a_hook_inside_the_commit_leaves_the_instance_unusable(
    services: Services, topic: str, at: str
) -> None:
    """A hook raises KeyboardInterrupt while the commit serves the transaction's reports
    (on the first, or on the last): the interrupt comes out as it was and the instance
    refuses more work, since the commit may have completed before it surfaced; a new
    instance with the same transactional.id sends the same records. Interrupted on the
    first report the flush stops with records undelivered: nothing was committed, so
    each record is in the topic once; on the last it may have been (once or twice)."""
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-h", 1)]
    slot = f"svc-{uuid.uuid4().hex[:8]}"
    interrupt = _interrupting(1 if at == "first" else len(records))
    producer = ActivityProducer(services.bootstrap, topic, slot)
    producer.start()
    try:
        with pytest.raises(KeyboardInterrupt), producer.transaction(timeout=30):
            for record in records:
                producer.send_record(record, on_delivery=interrupt)
        with pytest.raises(OutcomeUnknownError, match="unusable"):
            producer.send_transaction(records, timeout=30)
    finally:
        producer.close()
    _resend(services, topic, slot, records)
    counts = Counter(committed_values(services.bootstrap, topic))
    assert set(counts) == {r.value for r in records}
    if at == "first":
        assert set(counts.values()) == {1}
    else:
        assert set(counts.values()) <= {1, 2}


def test_an_interrupt_from_a_hook_inside_an_abort_leaves_the_instance_unusable(
    services: Services, topic: str
) -> None:
    """The block fails, and the abort's flush serves the reports of the records it
    purged: their hook raises KeyboardInterrupt. The interrupt comes out as it was,
    nothing is committed, and the instance refuses more work (a next transaction would
    meet the abort still in progress)."""
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-h", 1)]
    slot = f"svc-{uuid.uuid4().hex[:8]}"
    interrupt = _interrupting(1)  # once: close() serves the reports the abort did not
    producer = ActivityProducer(services.bootstrap, topic, slot)
    producer.start()
    try:
        with pytest.raises(KeyboardInterrupt), producer.transaction(timeout=30):
            for record in records:
                producer.send_record(record, on_delivery=interrupt)
            raise HookFailed("the block failed")
        with pytest.raises(TransientProduceError, match="unusable"):
            producer.send_transaction(records, timeout=30)
    finally:
        producer.close()
    _resend(services, topic, slot, records)
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in records)


def test_a_raising_stats_cb_is_logged_and_the_transactions_commit(
    services: Services, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A service's ``stats_cb`` that raises: librdkafka queues statistics every 50 ms
    and nothing but the SDK's calls serves them, so they are served inside its commits.
    Every transaction's result stands; the errors are logged."""
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-h", 1)]
    stats: list[str] = []

    def stats_cb(raw: str) -> None:
        stats.append(raw)
        raise HookFailed("the service's stats_cb failed")

    producer = ActivityProducer(
        services.bootstrap,
        topic,
        f"svc-{uuid.uuid4().hex[:8]}",
        extra={"stats_cb": stats_cb, "statistics.interval.ms": 50},
    )
    producer.start()
    sent = 0
    try:
        with caplog.at_level(logging.ERROR, logger="ackline"):
            deadline = time.monotonic() + 30
            while len(stats) < 3 and time.monotonic() < deadline:
                producer.send_transaction(records, timeout=30)
                sent += 1
    finally:
        producer.close()
    assert len(stats) >= 3, "librdkafka served no statistics in 30 s"
    counts = Counter(committed_values(services.bootstrap, topic))
    assert counts == Counter({r.value: sent for r in records})
    failures = [r for r in caplog.records if r.exc_info and r.exc_info[0] is HookFailed]
    assert len(failures) == len(stats), caplog.text


def test_a_raising_async_stats_cb_is_logged_and_the_asyncio_transactions_commit(
    services: Services, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The asyncio SDK's ``stats_cb`` is a coroutine function (confluent-kafka's
    AIOProducer awaits it): one that raises is logged as the synchronous SDK's is, and
    every transaction's result stands."""
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-h", 1)]
    stats: list[str] = []

    async def stats_cb(raw: str) -> None:
        stats.append(raw)
        raise HookFailed("the service's stats_cb failed")

    async def run() -> int:
        producer = AsyncActivityProducer(
            services.bootstrap,
            topic,
            f"svc-{uuid.uuid4().hex[:8]}",
            extra={"stats_cb": stats_cb, "statistics.interval.ms": 50},
        )
        await producer.start()
        sent = 0
        try:
            deadline = time.monotonic() + 30
            while len(stats) < 3 and time.monotonic() < deadline:
                await producer.send_transaction(records, timeout=30)
                sent += 1
        finally:
            await producer.close()
        return sent

    with caplog.at_level(logging.ERROR, logger="ackline"):
        sent = asyncio.run(run())
    assert len(stats) >= 3, "librdkafka served no statistics in 30 s"
    counts = Counter(committed_values(services.bootstrap, topic))
    assert counts == Counter({r.value: sent for r in records})
    failures = [r for r in caplog.records if r.exc_info and r.exc_info[0] is HookFailed]
    assert failures, caplog.text


def test_a_callback_of_the_wrong_kind_is_refused() -> None:
    """AIOProducer awaits ``error_cb``, ``throttle_cb`` and ``stats_cb``: a plain function
    would fail with a TypeError inside whatever call served it; the synchronous producer
    would never await a coroutine function's. Either is refused when the producer is
    made, naming the setting."""
    with pytest.raises(ProduceError, match="stats_cb in extra must be a coroutine"):
        AsyncActivityProducer("127.0.0.1:9", "t", "svc-x", extra={"stats_cb": print})

    async def error_cb(err: KafkaError) -> None:
        pass

    with pytest.raises(ProduceError, match="error_cb in extra must be a plain function"):
        ActivityProducer("127.0.0.1:9", "t", "svc-x", extra={"error_cb": error_cb})


def test_delivery_reports_of_errors_only_are_refused() -> None:
    """Both SDKs confirm a committed transaction from every record's report: a setting
    that drops the reports of delivered records is refused when the producer is made."""
    for make in (ActivityProducer, AsyncActivityProducer):
        with pytest.raises(ProduceError, match=re.escape("delivery.report.only.error")):
            make("127.0.0.1:9", "t", "svc-x", extra={"delivery.report.only.error": "true"})


def test_a_coroutine_hook_of_a_record_sent_in_a_transaction_block_is_refused(
    services: Services, topic: str
) -> None:
    """A record's own hook is wrapped by the SDK before librdkafka sees it: judged after
    the wrapping, a coroutine function passed the check and silently never ran. It is
    refused as the send's error, and the block's transaction is aborted whole."""
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-h", 1)]

    async def hook(err: KafkaError | None, msg: Message) -> None:
        pass

    producer = ActivityProducer(services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}")
    producer.start()
    try:
        with (
            pytest.raises(ProduceError, match="on_delivery must be a plain callable"),
            producer.transaction(timeout=30),
        ):
            producer.send_record(records[0])
            producer.send_record(records[1], on_delivery=hook)
    finally:
        producer.close()
    assert committed_values(services.bootstrap, topic) == []
