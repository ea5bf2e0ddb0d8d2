"""Read a range of a live topic: by offsets or by a time window, every partition or some.

:func:`open_range` resolves the range against the broker (watermarks, offsets for
times) and returns the resolved offsets with an iterator of :class:`CapturedRecord`;
:func:`capture` writes such a range to a capture file (:mod:`ackline.load.capture.file`).
Records are read as the pipeline reads them (``read_committed``): records of aborted
transactions and transaction markers are not returned, so a range may hold fewer
records than ``end - first``. Nothing is committed to Kafka (no consumer group joins).
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from ackline.core.logs import kafka_logger
from ackline.load.capture.file import CapturedRecord, CaptureHeader, CaptureWriter
from ackline.load.errors import LoadError
from ackline.load.paths import check_target
from ackline.streams.admin import answered
from ackline.streams.errors import KafkaUnavailableError, TopicError

Ranges = dict[int, tuple[int, int]]

KAFKA_LOG = kafka_logger()
"""librdkafka's own log lines (one per failed connect attempt, 20 a second while a broker
is down) go through Python logging, each distinct line once a minute
(:class:`ackline.core.logs.KafkaLogBridge`); an unreachable broker also surfaces as the
timeout error these modules raise."""


class EmptyRangeError(LoadError):
    """The chosen range of the topic holds no records."""


@dataclass(frozen=True)
class RangeSpec:
    """Which records: offsets ``[start_offset, end_offset)`` and/or a time window
    ``[since_ms, until_ms)`` (milliseconds since the epoch), on ``partitions`` (None:
    all). Unset bounds mean the partition's first record and its end when resolved."""

    start_offset: int | None = None
    end_offset: int | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    partitions: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("start_offset", "end_offset", "since_ms", "until_ms"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise LoadError(f"{name} must be >= 0, not {value}")
        if (
            self.start_offset is not None
            and self.end_offset is not None
            and self.end_offset <= self.start_offset
        ):
            raise EmptyRangeError(
                f"the offset range [{self.start_offset}, {self.end_offset}) is empty"
            )
        if (
            self.since_ms is not None
            and self.until_ms is not None
            and self.until_ms <= self.since_ms
        ):
            raise EmptyRangeError("the time window is empty (until is not after since)")

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def _consumer(bootstrap: str, conf: Mapping[str, Any] | None) -> Consumer:
    return Consumer(
        {
            **(conf or {}),
            "logger": KAFKA_LOG,
            "bootstrap.servers": bootstrap,
            "group.id": f"ackline-capture-{uuid.uuid4().hex[:8]}",  # never joined: assign only
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "allow.auto.create.topics": False,
            "enable.partition.eof": False,
            "auto.offset.reset": "earliest",
        }
    )


def _partitions(consumer: Consumer, bootstrap: str, topic: str, timeout: float) -> list[int]:
    try:
        meta = answered(functools.partial(consumer.list_topics, topic), timeout)
    except KafkaException as exc:
        raise KafkaUnavailableError(
            f"cannot reach Kafka at {bootstrap} (no answer within {timeout:g} s): {exc}"
        ) from exc
    found = meta.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise TopicError(f"topic {topic} does not exist on {bootstrap}")
    return sorted(found.partitions)


def _offset_at(consumer: Consumer, topic: str, partition: int, ms: int, timeout: float) -> int:
    """First offset whose timestamp is >= ``ms``; -1 when there is none."""
    asked = [TopicPartition(topic, partition, ms)]
    found = answered(functools.partial(consumer.offsets_for_times, asked), timeout)
    return int(found[0].offset)


def resolve(
    consumer: Consumer, bootstrap: str, topic: str, spec: RangeSpec, timeout: float
) -> Ranges:
    """Each chosen partition's ``[first, end)`` offsets, empty partitions left out."""
    available = _partitions(consumer, bootstrap, topic, timeout)
    chosen = list(spec.partitions) if spec.partitions is not None else available
    missing = sorted(set(chosen) - set(available))
    if missing:
        raise TopicError(f"topic {topic} has no partition {missing} (it has {len(available)})")
    ranges: Ranges = {}
    try:
        for p in chosen:
            read = functools.partial(consumer.get_watermark_offsets, TopicPartition(topic, p))
            low, high = answered(read, timeout)
            first, end = low, high
            if spec.start_offset is not None:
                first = max(first, spec.start_offset)
            if spec.end_offset is not None:
                end = min(end, spec.end_offset)
            if spec.since_ms is not None:
                at = _offset_at(consumer, topic, p, spec.since_ms, timeout)
                first = max(first, high if at < 0 else at)
            if spec.until_ms is not None:
                at = _offset_at(consumer, topic, p, spec.until_ms, timeout)
                end = min(end, high if at < 0 else at)
            if first < end:
                ranges[p] = (first, end)
    except KafkaException as exc:
        raise KafkaUnavailableError(
            f"cannot read offsets of {topic} at {bootstrap}: {exc}"
        ) from exc
    if not ranges:
        raise EmptyRangeError(f"the chosen range of {topic} holds no records ({spec.describe()})")
    return ranges


def _headers(raw: Any) -> tuple[tuple[str, bytes | None], ...]:
    if not raw:
        return ()
    items = raw.items() if isinstance(raw, dict) else raw
    return tuple(
        (str(k), v if v is None or isinstance(v, bytes) else str(v).encode()) for k, v in items
    )


def _records(
    consumer: Consumer, topic: str, ranges: Ranges, idle_timeout: float
) -> Iterator[CapturedRecord]:
    """The records of ``ranges``; closes the consumer when done or abandoned."""
    try:
        consumer.assign([TopicPartition(topic, p, first) for p, (first, _) in ranges.items()])
        open_parts = set(ranges)
        last_progress = time.monotonic()
        while open_parts:
            msgs = consumer.consume(num_messages=1000, timeout=0.5)
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.fatal():
                        raise KafkaUnavailableError(f"reading {topic} failed: {err}")
                    continue
                p, offset = msg.partition(), msg.offset()
                if p is None or offset is None:
                    continue
                if p not in open_parts or offset >= ranges[p][1]:
                    open_parts.discard(p)
                    continue
                ts_type, ts = msg.timestamp()
                yield CapturedRecord(
                    p, offset, ts_type, ts, msg.key(), msg.value(), _headers(msg.headers())
                )
                if offset + 1 >= ranges[p][1]:
                    open_parts.discard(p)
            if msgs:
                last_progress = time.monotonic()
                continue
            # No data: transaction markers or aborted records may fill the rest of a range.
            for tp in consumer.position([TopicPartition(topic, p) for p in open_parts]):
                if tp.offset >= ranges[tp.partition][1]:
                    open_parts.discard(tp.partition)
            if open_parts and time.monotonic() - last_progress > idle_timeout:
                stuck = {p: ranges[p] for p in sorted(open_parts)}
                raise KafkaUnavailableError(
                    f"no progress reading {topic} for {idle_timeout:.0f} s; partitions "
                    f"{stuck} did not reach their end (an open transaction, or the broker "
                    "stopped answering)"
                )
    finally:
        consumer.close()


def open_range(
    bootstrap: str,
    topic: str,
    spec: RangeSpec,
    *,
    conf: Mapping[str, Any] | None = None,
    timeout: float = 10.0,
    idle_timeout: float = 30.0,
) -> tuple[Ranges, Iterator[CapturedRecord]]:
    """Resolve ``spec`` now; the iterator reads the records (and closes its consumer)."""
    consumer = _consumer(bootstrap, conf)
    try:
        ranges = resolve(consumer, bootstrap, topic, spec, timeout)
    except BaseException:
        consumer.close()
        raise
    return ranges, _records(consumer, topic, ranges, idle_timeout)


@dataclass(frozen=True)
class CaptureSummary:
    path: Path
    topic: str
    records: int
    ranges: Ranges
    bytes_in: int
    file_bytes: int
    seconds: float

    def render(self) -> str:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        ratio = self.bytes_in / self.file_bytes if self.file_bytes else 0.0
        return (
            f"captured {self.records:,} records of {self.topic} "
            f"({len(self.ranges)} partitions) in {self.seconds:.1f} s, {rate:,.0f} records/s\n"
            f"  file        {self.path}  {self.file_bytes / 1e6:,.1f} MB "
            f"(keys+values {self.bytes_in / 1e6:,.1f} MB, {ratio:.1f}x compressed)"
        )


def capture(
    bootstrap: str,
    topic: str,
    path: Path,
    spec: RangeSpec,
    *,
    conf: Mapping[str, Any] | None = None,
    timeout: float = 10.0,
    idle_timeout: float = 30.0,
    on_progress: Callable[[int, int], None] | None = None,
    overwrite: bool = True,
) -> CaptureSummary:
    """Write the records of ``spec`` on ``topic`` to the capture file ``path``.

    ``on_progress(done, upper_bound)`` is called every 1,000 records. The file appears
    at ``path`` only when complete (see :class:`ackline.load.capture.file.CaptureWriter`).
    Order: check ``path`` (writable, not a directory, replaced only with ``overwrite``:
    TargetError before anything is read), resolve the range, read it into the partial
    file, rename. An error or a stop request (SIGTERM, Ctrl-C) removes the partial file.
    """
    check_target(Path(path), what="capture file", overwrite=overwrite)
    started = time.monotonic()
    ranges, records = open_range(
        bootstrap, topic, spec, conf=conf, timeout=timeout, idle_timeout=idle_timeout
    )
    bound = sum(end - first for first, end in ranges.values())
    header = CaptureHeader(
        topic=topic,
        created_at=datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        ranges=ranges,
        selection=spec.describe(),
    )
    with CaptureWriter(path, header) as writer:
        for rec in records:
            writer.write(rec)
            if on_progress is not None and writer.records % 1000 == 0:
                on_progress(writer.records, bound)
        if writer.records == 0:  # offsets, but only aborted records or markers in them
            raise EmptyRangeError(f"the chosen range of {topic} holds no committed records")
    if on_progress is not None:
        on_progress(writer.records, writer.records)
    return CaptureSummary(
        path=Path(path),
        topic=topic,
        records=writer.records,
        ranges=ranges,
        bytes_in=writer.bytes_in,
        file_bytes=Path(path).stat().st_size,
        seconds=time.monotonic() - started,
    )


__all__ = [
    "CaptureSummary",
    "EmptyRangeError",
    "RangeSpec",
    "capture",
    "open_range",
    "resolve",
]
