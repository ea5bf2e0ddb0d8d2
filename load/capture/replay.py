"""Re-produce captured (or live) records into a topic at a chosen pace.

Paces (:meth:`Pace.parse`): ``original`` (the gaps between the records' timestamps),
``2x`` / ``0.5x`` (a multiple of that), ``5000/s`` (a fixed rate) and ``max`` (as fast
as the producer goes). Keys, headers and values are sent unchanged. A record goes to
its captured partition when the target has it (else the key picks the partition) and
gets a fresh CreateTime unless ``keep_timestamps`` (then the captured timestamp).

The producer is idempotent with ``acks=all``; :func:`replay` returns once every record
is acknowledged, or raises LoadError saying how many were not.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ackline.load.capture.file import CapturedRecord
from ackline.load.capture.topics import KAFKA_LOG
from ackline.load.errors import LoadError
from ackline.streams.admin import max_message_bytes, topic_shape
from ackline.streams.errors import TopicError, error_code
from ackline.streams.producer import LIBRDKAFKA_MESSAGE_MAX_BYTES

PROGRESS_EVERY_S = 0.5
"""A paced replay tells its progress at least this often (and every 1,000 records)."""

RECORD_OVERHEAD = 512
"""Bytes a record takes in a batch on top of its captured body (batch header, varints):
what :func:`needed_bytes` adds to a capture's largest record."""

PaceMode = Literal["original", "speed", "rate", "max"]
_SPEED = re.compile(r"^(\d+(?:\.\d+)?)x$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)/s$")


@dataclass(frozen=True)
class Pace:
    mode: PaceMode
    value: float = 1.0
    """The speed factor (speed) or records per second (rate)."""

    @classmethod
    def parse(cls, text: str) -> Pace:
        """``original``, ``<factor>x``, ``<records>/s`` or ``max``."""
        text = text.strip().lower()
        if text in ("original", "1x"):
            return cls("original")
        if text in ("max", "fast", "asap"):
            return cls("max")
        paced: tuple[tuple[re.Pattern[str], PaceMode, str], ...] = (
            (_SPEED, "speed", "a speed factor"),
            (_RATE, "rate", "a rate (records/s)"),
        )
        for pattern, mode, what in paced:
            if m := pattern.match(text):
                value = float(m.group(1))  # inf when the digits overflow
                if not 0 < value < math.inf:
                    raise LoadError(f"pace {text!r}: {what} must be a finite number above 0")
                return cls(mode, value)
        raise LoadError(
            f"pace {text!r} is not one of: original, <factor>x (2x, 0.5x), <n>/s (5000/s), max"
        )

    def describe(self) -> str:
        if self.mode == "speed":
            return f"{self.value:g}x original"
        if self.mode == "rate":
            return f"{self.value:,.0f} records/s"
        return "original pace" if self.mode == "original" else "as fast as possible"


class Pacer:
    """When each record is due, relative to the first one sent (pure but for ``clock``).

    ``due(i, timestamp_ms)`` is the monotonic time at which record ``i`` (0-based) may
    be sent; the caller sleeps until then when ahead.
    """

    def __init__(self, pace: Pace, clock: Callable[[], float] = time.monotonic) -> None:
        self.pace = pace
        self._clock = clock
        self._start: float | None = None
        self._first_ts: int | None = None

    def due(self, index: int, timestamp_ms: int) -> float:
        if self._start is None:
            self._start = self._clock()
            self._first_ts = timestamp_ms
        mode = self.pace.mode
        if mode == "max":
            return self._start
        if mode == "rate":
            return self._start + index / self.pace.value
        factor = self.pace.value if mode == "speed" else 1.0
        gap_ms = max(timestamp_ms - (self._first_ts or 0), 0)
        return self._start + gap_ms / 1000 / factor


@dataclass(frozen=True)
class ReplaySummary:
    target: str
    records: int
    bytes: int
    seconds: float
    pace: str
    partitioning: str

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def render(self) -> str:
        return (
            f"replayed {self.records:,} records ({self.bytes / 1e6:,.1f} MB) into "
            f"{self.target} in {self.seconds:.1f} s, {self.rate:,.0f} records/s "
            f"(pace: {self.pace}; partitions: {self.partitioning})"
        )


def needed_bytes(largest_record: int) -> int:
    """The ``max.message.bytes`` a topic needs for a record body of ``largest_record``
    bytes sent alone (a batch is not compressed smaller than random bytes)."""
    return largest_record + RECORD_OVERHEAD


def producer_config(
    bootstrap: str,
    conf: Mapping[str, Any] | None = None,
    max_bytes: int = LIBRDKAFKA_MESSAGE_MAX_BYTES,
) -> dict[str, Any]:
    """``max_bytes``: the largest record the producer sends rather than refuses itself
    (the target's limit: the broker is then the one judge); ``conf`` may allow more."""
    return {
        **(conf or {}),
        "logger": KAFKA_LOG,
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "compression.type": "lz4",
        "message.timeout.ms": 120_000,
        "message.max.bytes": max(
            max_bytes, int((conf or {}).get("message.max.bytes", LIBRDKAFKA_MESSAGE_MAX_BYTES))
        ),
    }


def replay(
    bootstrap: str,
    records: Iterable[CapturedRecord],
    target: str,
    pace: Pace,
    *,
    source_partitions: Iterable[int] = (),
    keep_timestamps: bool = False,
    conf: Mapping[str, Any] | None = None,
    on_progress: Callable[[int], None] | None = None,
    flush_timeout: float = 120.0,
    timeout: float = 10.0,
    stop_flush_timeout: float = 5.0,
    warm: int = 0,
    on_warm: Callable[[], object] | None = None,
    largest: int | None = None,
) -> ReplaySummary:
    """Send ``records`` to ``target`` at ``pace``; return once all are acknowledged.

    ``warm``: the first ``warm`` records are sent as fast as possible and acknowledged,
    then ``on_warm()`` is called, and only then does the pace start. A latency
    measurement needs it: an idempotent producer holds what it is given until the broker
    has assigned it a producer id, so the first paced records would otherwise wait out
    the producer's own start-up (up to a second) and count it as the consumer's latency.
    The summary then describes the paced records only.

    ``largest``: the largest record body (a capture's
    :meth:`~ackline.load.capture.file.CaptureReader.largest_record`); a target whose
    ``max.message.bytes`` is below what it needs is refused before anything is sent,
    not after part of the records went in.

    ``source_partitions`` are the partitions the records come from: when the target has
    all of them, each record keeps its partition; otherwise the key decides. ``timeout``
    bounds the wait for the broker's first answer. A stop request (SIGTERM, Ctrl-C)
    stops sending at once; the records already handed to the producer get
    ``stop_flush_timeout`` seconds to be acknowledged, then the stop propagates.
    """
    # An unreachable broker raises KafkaUnavailableError after ``timeout``.
    shape = topic_shape(bootstrap, target, timeout, conf={**(conf or {}), "logger": KAFKA_LOG})
    if shape is None:
        raise TopicError(
            f"target topic {target} does not exist on {bootstrap}: create it, or pass "
            "--create-topic to `ackline replay`"
        )
    count, limit = shape.partitions, max_message_bytes(shape)
    need = needed_bytes(largest) if largest is not None else None
    if need is not None and limit is not None and need > limit:
        raise LoadError(
            f"replay into {target}: nothing sent, its largest record needs "
            f"max.message.bytes {need} and topic {target} has {limit}: "
            f"{_raise_hint(target, need)}"
        )
    keep = all(p < count for p in source_partitions)
    partitioning = "as captured" if keep else f"by key ({count} partitions)"
    failed: list[KafkaError] = []
    acked = 0

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        nonlocal acked
        if err is not None:
            failed.append(err)
        else:
            acked += 1

    producer = Producer(producer_config(bootstrap, conf, max(limit or 0, need or 0)))
    started = time.monotonic()
    remaining = iter(records)
    send = functools.partial(
        _send_all,
        producer,
        target=target,
        keep_partition=keep,
        keep_timestamps=keep_timestamps,
        on_delivery=on_delivery,
        failed=failed,
    )
    try:
        sent = size = left = warm_sent = 0
        if warm > 0:
            sent, _ = send(
                itertools.islice(remaining, warm), pacer=Pacer(Pace("max")), on_progress=on_progress
            )
            left = producer.flush(flush_timeout)
            if not left and not failed and on_warm is not None:
                on_warm()
            warm_sent, started = sent, time.monotonic()
        if not left and not failed:
            progress = on_progress and (lambda n: on_progress(warm_sent + n))
            more, more_size = send(remaining, pacer=Pacer(pace), on_progress=progress)
            sent, size = sent + more, more_size
            left = producer.flush(flush_timeout)
    except _SendError as exc:
        producer.flush(stop_flush_timeout)  # what went in, for the message
        raise LoadError(
            f"replay into {target} failed after {warm_sent + exc.sent} records: {exc}"
            f"{_too_large(exc.code, target, limit, acked)}"
        ) from exc
    except BaseException:
        try:
            producer.flush(stop_flush_timeout)
        finally:  # a second Ctrl-C cuts the flush, not the report of the first stop
            logging.getLogger("ackline.replay").warning(
                "replay into %s stopped: %d records acknowledged", target, acked
            )
        raise
    if failed:
        raise LoadError(
            f"{len(failed)} records were not delivered to {target}: {failed[0]}"
            f"{_too_large(failed[0].code(), target, limit, acked)}"
        )
    if left or acked != sent:
        raise LoadError(
            f"{sent - acked} of {sent} records not acknowledged by {bootstrap} within "
            f"{flush_timeout:.0f} s (is the broker reachable?)"
        )
    if on_progress is not None:
        on_progress(sent)
    return ReplaySummary(
        target, sent - warm_sent, size, time.monotonic() - started, pace.describe(), partitioning
    )


def _raise_hint(target: str, need: int | None) -> str:
    at_least = f" to at least {need}" if need is not None else ""
    return (
        f"raise topic {target}'s max.message.bytes{at_least} (kafka-configs.sh --alter "
        f"--entity-type topics --entity-name {target} --add-config "
        f"max.message.bytes={need or '<bytes>'}), or replay into a new topic with "
        "--create-topic (made to fit)"
    )


def _too_large(code: int | None, target: str, limit: int | None, acked: int) -> str:
    """What to do when a record was too large for the target (else nothing): the
    librdkafka message names neither the topic's setting nor what is already in."""
    if code != KafkaError.MSG_SIZE_TOO_LARGE:
        return ""
    has = f" (it has {limit})" if limit is not None else ""
    return (
        f"; a record is larger than topic {target} takes{has}: "
        f"{_raise_hint(target, None)}; {acked} records were already written to {target}"
    )


class _SendError(Exception):
    def __init__(self, sent: int, cause: KafkaException) -> None:
        super().__init__(str(cause))
        self.sent = sent
        self.code: int | None = error_code(cause)


def _send_all(
    producer: Producer,
    records: Iterable[CapturedRecord],
    *,
    target: str,
    pacer: Pacer,
    keep_partition: bool,
    keep_timestamps: bool,
    on_delivery: Callable[[KafkaError | None, Message], None],
    on_progress: Callable[[int], None] | None,
    failed: list[KafkaError],
) -> tuple[int, int]:
    """Produce every record at the pacer's times; stops early once a delivery failed."""
    sent = size = 0
    told_at = time.monotonic()
    try:
        for rec in records:
            ahead = pacer.due(sent, rec.timestamp) - time.monotonic()
            if ahead > 0.001:
                producer.poll(0)
                time.sleep(ahead)
            kwargs: dict[str, Any] = {
                "key": rec.key,
                "value": rec.value,
                "on_delivery": on_delivery,
            }
            if rec.headers:
                kwargs["headers"] = list(rec.headers)
            if keep_partition:
                kwargs["partition"] = rec.partition
            if keep_timestamps:
                kwargs["timestamp"] = rec.timestamp
            _produce(producer, target, kwargs)
            sent += 1
            size += len(rec.value or b"")
            # every 1,000 records, and every PROGRESS_EVERY_S of a paced replay (at 20/s
            # the bar moved once in 50 s: an operator's probe saw 0/5,312 for 8 s); the
            # clock looked at every 16th record, or after a pacing sleep
            due = sent % 1000 == 0
            if not due and (sent % 16 == 0 or ahead > 0.001):
                due = time.monotonic() - told_at >= PROGRESS_EVERY_S
            if due:
                told_at = time.monotonic()
                producer.poll(0)
                if on_progress is not None:
                    on_progress(sent)
            if failed:
                break
    except KafkaException as exc:
        raise _SendError(sent, exc) from exc
    return sent, size


def _produce(producer: Producer, topic: str, kwargs: dict[str, Any]) -> None:
    while True:
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)


__all__ = ["Pace", "Pacer", "ReplaySummary", "needed_bytes", "replay"]
