"""The default runtime's librdkafka configuration: properties that decide throughput."""

from __future__ import annotations

from confluent_kafka import Consumer

from ackline.streams.consumer_config import RuntimeConfig


def _conf() -> dict[str, object]:
    return RuntimeConfig("127.0.0.1:9", "t", "g", "w").consumer_conf()


def test_a_full_prefetch_queue_does_not_stop_fetching_for_a_second() -> None:
    """librdkafka backs a partition's fetch off for fetch.queue.backoff.ms (default 1 s)
    once the prefetch queue is over its bounds. A worker empties the bounded queue in well
    under a second, then waited: a 1M-event drain showed a 130-730 ms gap once a second,
    7.5 s of its 31 s (a batch of 1,000 from one partition after each)."""
    assert int(str(_conf()["fetch.queue.backoff.ms"])) <= 50


def test_librdkafka_takes_the_whole_configuration() -> None:
    """An unknown or misspelt property is refused when the consumer is made, not ignored."""
    conf = _conf()
    conf.pop("stats_cb", None)
    Consumer(conf).close()
