"""A service's delivery hook never decides what the synchronous SDK says was committed.

librdkafka serves delivery reports inside ``commit_transaction`` (its flush), and
confluent-kafka lets an exception that a Python callback raised there out of
``commit_transaction`` in place of its result, whatever the commit did. So a hook that
raised made a committed transaction look failed, and a service that sends the same records
again on an error wrote them twice into the topic. The SDK calls every hook itself and
logs what a hook raises, as Kafka's Java producer does with its callbacks.
"""

from __future__ import annotations

import logging
import uuid

import pytest
from confluent_kafka import KafkaError, Message

from ackline.streams.errors import OutcomeUnknownError
from ackline.streams.producer import ActivityProducer, DeliveryHook, prepare
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


def test_an_interrupt_from_a_hook_inside_the_commit_leaves_the_instance_unusable(
    services: Services, topic: str
) -> None:
    """A hook raises KeyboardInterrupt while the commit serves its reports: the interrupt
    comes out as it was, the commit's outcome is unknown, so the instance refuses more
    work; a new instance with the same transactional.id sends the same records."""
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-h", 1)]
    slot = f"svc-{uuid.uuid4().hex[:8]}"
    interrupted: list[bool] = []

    def interrupt_once(err: KafkaError | None, msg: Message) -> None:
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt

    producer = ActivityProducer(services.bootstrap, topic, slot)
    producer.start()
    try:
        with pytest.raises(KeyboardInterrupt), producer.transaction(timeout=30):
            for record in records:
                producer.send_record(record, on_delivery=interrupt_once)
        with pytest.raises(OutcomeUnknownError, match="unusable"):
            producer.send_transaction(records, timeout=30)
    finally:
        producer.close()
    again = ActivityProducer(services.bootstrap, topic, slot)
    again.start()
    try:
        again.send_transaction(records, timeout=30)
    finally:
        again.close()
    assert set(committed_values(services.bootstrap, topic)) == {r.value for r in records}
