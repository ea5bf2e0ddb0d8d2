"""Which Kafka admin errors a second ask cures (streams/kafkainfo.py, streams/admin.py):
confluent-kafka's admin results say ``retriable()`` False whatever the error, so these
are told apart by ``code()``."""

from __future__ import annotations


def test_a_coordinator_moving_or_loading_is_asked_again_and_nothing_else_is() -> None:
    from confluent_kafka import KafkaError, KafkaException

    from ackline.streams.kafkainfo import coordinator_not_ready

    for code in (16, 15, 14):  # NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, ..._LOAD_IN_...
        assert coordinator_not_ready(KafkaException(KafkaError(code)))
    assert not coordinator_not_ready(
        KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))
    )
    assert not coordinator_not_ready(KafkaException("no error object"))


def test_a_partition_end_is_asked_again_for_errors_a_second_ask_cures_only() -> None:
    """confluent-kafka's admin results say retriable() False whatever the error: the
    ends a worker starting from latest reads are retried by code."""
    from confluent_kafka import KafkaError, KafkaException

    from ackline.streams.admin import end_not_ready

    for code in (KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION):
        assert end_not_ready(KafkaException(KafkaError(code)))
    assert not end_not_ready(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    assert not end_not_ready(KafkaException("no error object"))
