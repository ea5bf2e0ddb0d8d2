"""librdkafka's log lines go through Python logging, each shape once per window
(issue 18: ~20 identical FAIL lines a second with the broker down buried the real error)."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from ackline.core.logs import KAFKA_LOGGER, KafkaLogBridge
from ackline.streams.aio_producer import AsyncActivityProducer
from ackline.streams.errors import TransientProduceError
from ackline.streams.producer import ActivityProducer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fail(n: int) -> tuple[int, str, str, str, str]:
    return (
        logging.ERROR,
        "%s [%s] %s",
        "FAIL",
        "rdkafka#consumer-1",
        f"[thrd:127.0.0.1:1/bootstrap]: Connect to ipv4#127.0.0.1:1 failed: Connection "
        f"refused (after {n}ms in state CONNECT, {n % 7} identical error(s) suppressed)",
    )


def test_repeats_are_folded_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    bridge = KafkaLogBridge(window_s=60, clock=clock)
    with caplog.at_level(logging.DEBUG, logger=KAFKA_LOGGER):
        for n in range(1200):  # a minute of a broker down, 20 a second
            clock.now += 0.05 if n else 0
            bridge.log(*_fail(n))
        bridge.log(
            logging.ERROR, "%s [%s] %s", "ERROR", "rdkafka#consumer-1", "1/1 brokers are down"
        )
        clock.now += 1
        bridge.log(*_fail(5))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith("librdkafka: FAIL [rdkafka#consumer-1]")
    assert "1/1 brokers are down" in lines[1]
    assert lines[2].endswith("(and 1199 more like it in the last 60 s)")
    assert all(r.levelno == logging.ERROR and r.name == KAFKA_LOGGER for r in caplog.records)


def test_memory_is_bounded_by_shapes(caplog: pytest.LogCaptureFixture) -> None:
    bridge = KafkaLogBridge(max_shapes=8, clock=Clock())
    with caplog.at_level(logging.DEBUG, logger=KAFKA_LOGGER):
        for word in ("alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota"):
            bridge.log(logging.WARNING, "%s", word)
    assert len(bridge._seen) == 8
    assert len(caplog.records) == 9


def test_a_real_client_logs_through_the_bridge(caplog: pytest.LogCaptureFixture) -> None:
    """librdkafka itself, a producer pointed at a closed port: its connect failures
    arrive as log records of ackline.kafka, folded."""
    bridge = KafkaLogBridge()
    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "logger": bridge})
    with caplog.at_level(logging.DEBUG, logger=KAFKA_LOGGER):
        producer.produce("t", b"v")
        producer.flush(2)
        producer.purge()
        producer.flush(1)
    fails = [r for r in caplog.records if "FAIL" in r.getMessage()]
    assert len(fails) == 1, [r.getMessage() for r in caplog.records]
    repeats = sum(int(e[1]) for e in bridge._seen.values())
    assert repeats >= 1  # librdkafka retried meanwhile: counted, not logged


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _start_sync(bootstrap: str) -> None:
    ActivityProducer(bootstrap, "t", "tx-log-sync").start(timeout=3)


def _start_aio(bootstrap: str) -> None:
    asyncio.run(AsyncActivityProducer(bootstrap, "t", "tx-log-aio").start(timeout=3))


@pytest.mark.parametrize("start", [_start_sync, _start_aio], ids=["sync", "aio"])
def test_the_sdk_producers_print_no_raw_librdkafka_lines(
    start: Callable[[str], None], capfd: pytest.CaptureFixture[str]
) -> None:
    """Both SDK producers against a closed port for 3 s: the asyncio one passed librdkafka
    no logger, so librdkafka printed its own raw lines on stderr (105 ``%3|...|FAIL|``
    lines in 5 s, where the synchronous producer printed none). Both pass the bridge,
    whose lines go through Python logging, folded."""
    with pytest.raises(TransientProduceError):
        start(_closed_port())
    raw = [line for line in capfd.readouterr().err.splitlines() if re.match(r"%\d\|", line)]
    assert raw == [], raw[:3]
