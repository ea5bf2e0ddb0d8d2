"""The consumer runtime: a confluent-kafka consumer in its own thread feeding the writer.

Threads: the consumer thread owns the confluent-kafka Consumer and all consumer state
(owned partitions, epochs, the buffer); rebalance callbacks run on it, inside
``consume``. The asyncio loop (the caller's) owns PostgreSQL. The thread hands each
batch to the loop with ``run_coroutine_threadsafe`` and keeps fetching the next batch
while one is in flight; at most one batch is in flight and one is buffered, and when
both are full the assignment is paused (backpressure, not buffering). librdkafka's own
prefetch queue is bounded by ``queued.max.messages.kbytes``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from ackline.faults import DISARMED, Faults
from ackline.logs import log_committed
from ackline.metrics import Metrics
from schemas.decode import DEFAULT_LIMITS, Limits, Rejection, decode
from sinks.batch import Batch, Coord, Incoming, PartitionRange
from sinks.connection import Database
from sinks.errors import FencedError
from sinks.offsets import claim
from sinks.writer import BatchWriter, WriteResult
from streams.deadletter import DeadLetterProducer, Poison
from streams.errors import FatalConsumerError

log = logging.getLogger(__name__)
TP = tuple[str, int]


@dataclass(frozen=True)
class RuntimeConfig:
    bootstrap: str
    topic: str
    group_id: str
    worker_id: str
    group_protocol: str = "classic"
    session_timeout_ms: int = 10_000
    start_from: str = "earliest"
    batch_max_events: int = 2_000
    batch_max_ms: int = 200
    limits: Limits = DEFAULT_LIMITS
    revoke_wait_s: float = 20.0
    shutdown_wait_s: float = 30.0
    max_poll_interval_ms: int = 300_000
    # Security properties (kafka_client_config); may hold secrets, so kept out of repr.
    kafka_extra: tuple[tuple[str, Any], ...] = field(default=(), repr=False)

    def consumer_conf(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group_id,
            "client.id": self.worker_id,
            "enable.auto.offset.store": False,  # stored only after the DB commit
            "enable.auto.commit": True,  # commits what was stored: advisory, for lag tools
            "auto.commit.interval.ms": 1_000,
            "isolation.level": "read_committed",
            "auto.offset.reset": self.start_from,
            "enable.partition.eof": False,
            "queued.max.messages.kbytes": 16_384,  # bounded prefetch
            "queued.min.messages": 10_000,
            "group.protocol": self.group_protocol,
            "max.poll.interval.ms": self.max_poll_interval_ms,
        }
        if self.group_protocol == "classic":
            conf["partition.assignment.strategy"] = "cooperative-sticky"
            conf["session.timeout.ms"] = self.session_timeout_ms
            conf["heartbeat.interval.ms"] = max(self.session_timeout_ms // 5, 500)
        conf.update(dict(self.kafka_extra))
        return conf


class ConsumerRuntime:
    """Runs until :meth:`request_stop`; see the module docstring for the threads."""

    def __init__(
        self,
        config: RuntimeConfig,
        control_db: Database,
        writer: BatchWriter,
        dead_letters: DeadLetterProducer,
        metrics: Metrics,
        loop: asyncio.AbstractEventLoop,
        faults: Faults = DISARMED,
    ) -> None:
        self.cfg = config
        self._control_db = control_db  # claims; the writer has its own connection
        self._writer = writer
        self._dlq = dead_letters
        self._metrics = metrics
        self._loop = loop
        self._faults = faults
        self._stop = threading.Event()
        self._consumer: Consumer | None = None
        self._epochs: dict[TP, int] = {}
        self._db_next: dict[TP, int] = {}
        self._buffer: list[Message] = []
        self._buffer_since = 0.0
        self._inflight: concurrent.futures.Future[WriteResult] | None = None
        self._inflight_batch: Batch | None = None
        self._inflight_started = 0.0
        self._paused = False
        self._last_lag = 0.0
        self._lag_labels: set[TP] = set()
        self.committed_batches = 0
        self.drain_and_stop = False
        self._topic_partitions = 0

    # ---- lifecycle -------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """The consumer thread's body. Returns after a clean shutdown; raises on fatal errors.

        Shutdown order: stop fetching; let the in-flight batch commit (or cancel it after
        ``shutdown_wait_s``: the DB decides what committed); store its offsets; drop the
        buffered, unwritten records (they are re-read from the DB offset next time);
        close the consumer, which revokes (nothing in flight now), commits the stored
        offsets and leaves the group.
        """
        consumer = Consumer(self.cfg.consumer_conf(), logger=log)
        self._consumer = consumer
        consumer.subscribe(
            [self.cfg.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        try:
            while not self._stop.is_set():
                self._step(consumer)
            self._faults.hit("shutdown")
            self._settle(self.cfg.shutdown_wait_s)
            self._buffer.clear()
        finally:
            consumer.close()
            self._consumer = None
            self._metrics.assigned.set(0)

    def _step(self, consumer: Consumer) -> None:
        if self._inflight is not None and self._inflight.done():
            self._complete()
        full = len(self._buffer) >= self.cfg.batch_max_events
        due = bool(self._buffer) and (
            time.monotonic() - self._buffer_since >= self.cfg.batch_max_ms / 1000
        )
        if (full or due) and self._inflight is None:
            self._dispatch()
            return
        if full:
            self._pause(consumer)
            self._wait_inflight(0.05)
            msg = consumer.poll(0)  # serves rebalance callbacks while paused
            if msg is not None:
                self._accept(msg)  # never drop a record of an owned partition
            return
        self._resume(consumer)
        room = self.cfg.batch_max_events - len(self._buffer)
        timeout = self.cfg.batch_max_ms / 1000 if not self._buffer else 0.02
        msgs = consumer.consume(num_messages=min(room, 1_000), timeout=timeout)
        for msg in msgs:
            self._accept(msg)
        self._report_lag(consumer)
        idle = not msgs and not self._buffer and self._inflight is None
        if self.drain_and_stop and idle and self._drained(consumer):
            log.info("drained: every partition's position is at its high watermark")
            self._stop.set()

    def _drained(self, consumer: Consumer) -> bool:
        """True when this worker owns every partition and has read each to its end."""
        if not self._topic_partitions:
            meta = consumer.list_topics(self.cfg.topic, timeout=10)
            self._topic_partitions = len(meta.topics[self.cfg.topic].partitions)
        assignment = consumer.assignment()
        if len(self._epochs) < self._topic_partitions or not assignment:
            return False
        for tp in consumer.position(assignment):
            low, high = consumer.get_watermark_offsets(tp, timeout=5)
            pos = tp.offset if tp.offset >= 0 else self._db_next.get((tp.topic, tp.partition), low)
            if pos < high:
                return False
        return True

    def _accept(self, msg: Message) -> None:
        err = msg.error()
        if err is not None:
            if err.fatal():
                raise FatalConsumerError(f"fatal consumer error: {err}")
            log.warning("consumer error: %s", err)
            return
        tp = _tp(msg)
        if tp not in self._epochs:
            return  # a partition we no longer own: its records are re-read by the owner
        if not self._buffer:
            self._buffer_since = time.monotonic()
        self._buffer.append(msg)

    # ---- batches ---------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Decode the buffer, write its poison to the dead-letter topic, submit the batch.

        Order of effects: after_fetch point; decode (pure); dead-letter records produced
        and acknowledged; then the batch is handed to the writer. A crash before the
        hand-off loses nothing (the DB offset has not moved); a crash after the dead-letter
        acknowledgement repeats those dead-letter records on redelivery, never loses them.
        """
        msgs, self._buffer = self._buffer, []
        self._faults.hit("after_fetch")
        ranges: dict[TP, list[int]] = {}
        batch = Batch(ranges=())
        poison: list[Poison] = []
        for msg in msgs:
            tp = _tp(msg)
            offset = msg.offset() or 0
            span = ranges.setdefault(tp, [offset, offset])
            span[1] = offset
            coord = Coord(tp[0], tp[1], offset)
            decoded = decode(msg.value(), self.cfg.limits)
            if isinstance(decoded, Rejection):
                poison.append(
                    Poison(
                        coord,
                        decoded.reason,
                        decoded.detail,
                        msg.key(),
                        msg.value(),
                        _headers(msg),
                    )
                )
            else:
                batch.events.append(Incoming(coord, decoded))
        if poison:
            self._faults.hit("before_dlq")
            batch.rejects = self._dlq.send_all(poison, should_stop=self._stop.is_set)
            self._metrics.dead_letters.inc(len(poison))
        batch.ranges = tuple(
            PartitionRange(t, p, first, last + 1, self._epochs[(t, p)])
            for (t, p), (first, last) in sorted(ranges.items())
        )
        self._inflight_batch = batch
        self._inflight_started = time.monotonic()
        self._inflight = asyncio.run_coroutine_threadsafe(self._writer.write(batch), self._loop)

    def _wait_inflight(self, timeout: float) -> bool:
        if self._inflight is None:
            return True
        try:
            self._inflight.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            return False
        except BaseException:  # handled in _complete
            pass
        return True

    def _settle(self, wait_s: float) -> None:
        """Let the in-flight batch end (commit, roll back, or be cancelled), then record it."""
        if self._inflight is None:
            return
        if not self._wait_inflight(wait_s):
            log.warning(
                "batch %s still in flight after %.0fs: cancelling it",
                self._inflight_batch.describe() if self._inflight_batch else "?",
                wait_s,
            )
            self._inflight.cancel()
            self._wait_inflight(5.0)
        self._complete()

    def _complete(self) -> None:
        """Record the outcome of the finished in-flight batch.

        Order of effects: read the outcome; if committed, the after_commit point, then store
        the offsets in the Kafka consumer for the partitions still owned under the same
        epoch (committed to Kafka by auto-commit: advisory only), then metrics. A crash
        between the DB commit and the store leaves Kafka behind the DB, which is harmless:
        the DB offset decides where the partition resumes.
        """
        future, batch = self._inflight, self._inflight_batch
        self._inflight, self._inflight_batch = None, None
        if future is None or batch is None:
            return
        try:
            result = future.result(timeout=0)
        except concurrent.futures.CancelledError:
            log.warning(
                "batch %s cancelled; the DB offset decides where it resumes", batch.describe()
            )
            return
        except FencedError as exc:
            self._metrics.fenced.inc()
            log.error("batch %s fenced and rolled back: %s", batch.describe(), exc)
            for tp in exc.partitions:
                self._forget([tp])
            return
        self._faults.hit("after_commit")
        self._store(batch)
        self.committed_batches += 1
        m = self._metrics
        m.batches.inc()
        m.ingested.inc(result.inserted)
        for layer, n in result.duplicates.items():
            m.duplicates.labels(layer).inc(n)
        for layer, n in result.conflicts.items():
            m.conflicts.labels(layer).inc(n)
        for reason, n in result.rejects.items():
            m.rejects.labels(reason).inc(n)
        m.batch_size.observe(result.events)
        seconds = time.monotonic() - self._inflight_started
        m.batch_seconds.observe(seconds)
        m.last_commit.set_to_current_time()
        log_committed(batch, result, seconds)

    def _store(self, batch: Batch) -> None:
        consumer = self._consumer
        offsets = []
        for r in batch.ranges:
            tp = (r.topic, r.partition)
            if self._epochs.get(tp) == r.epoch:
                self._db_next[tp] = r.next_offset
                offsets.append(TopicPartition(r.topic, r.partition, r.next_offset))
        if consumer is not None and offsets:
            try:
                consumer.store_offsets(offsets=offsets)
            except KafkaException as exc:  # advisory; the DB offset is the truth
                log.info("could not store Kafka offsets (advisory): %s", exc)

    # ---- rebalance -------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Claim the partitions in PostgreSQL, then assign them from the DB offsets.

        Order of effects: bump the epochs (one autocommitted statement, retried until it
        succeeds); the after_claim point; incremental_assign at the DB next offsets (or the
        start_from policy where none is stored). A crash after the claim and before the
        assign leaves only a higher epoch, which the next owner bumps again.
        """
        if not partitions:
            return
        tps = [(tp.topic, tp.partition) for tp in partitions]

        async def take() -> list[Any]:
            return await self._control_db.retrying(
                "claim", lambda conn: claim(conn, self.cfg.group_id, self.cfg.worker_id, tps)
            )

        claims = asyncio.run_coroutine_threadsafe(take(), self._loop).result()
        self._faults.hit("after_claim")
        default = OFFSET_BEGINNING if self.cfg.start_from == "earliest" else OFFSET_END
        assign = []
        for c in claims:
            tp = (c.topic, c.partition)
            self._epochs[tp] = c.epoch
            if c.next_offset is not None:
                self._db_next[tp] = c.next_offset
            offset = c.next_offset if c.next_offset is not None else default
            assign.append(TopicPartition(c.topic, c.partition, offset))
        consumer.incremental_assign(assign)
        self._metrics.assigned.set(len(self._epochs))
        log.info("assigned %s", [(c.partition, c.next_offset, c.epoch) for c in claims])

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Stop dispatching (we are inside consume), let the in-flight batch finish or roll
        back, drop buffered records of the revoked partitions, then unassign them."""
        self._release(consumer, partitions, lost=False)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """As revoke; the in-flight batch is likely fenced by the new owner's claim."""
        self._release(consumer, partitions, lost=True)

    def _release(self, consumer: Consumer, partitions: list[TopicPartition], lost: bool) -> None:
        if self._inflight is not None:
            self._faults.hit("revoke_in_flight")
            self._settle(self.cfg.revoke_wait_s)
        tps = [(tp.topic, tp.partition) for tp in partitions]
        self._forget(tps)
        try:
            consumer.incremental_unassign(partitions)
        except KafkaException as exc:
            log.info("unassign: %s", exc)
        self._paused = False
        log.info("%s %s", "lost" if lost else "revoked", [p for _, p in tps])

    def _forget(self, tps: list[TP]) -> None:
        gone = set(tps)
        for tp in gone:
            self._epochs.pop(tp, None)
            self._db_next.pop(tp, None)
            if tp in self._lag_labels:
                self._lag_labels.discard(tp)
                self._metrics.lag.remove(tp[0], str(tp[1]))
        self._buffer = [m for m in self._buffer if _tp(m) not in gone]
        self._metrics.assigned.set(len(self._epochs))

    # ---- flow control and lag -----------------------------------------------------------

    def _pause(self, consumer: Consumer) -> None:
        if not self._paused:
            consumer.pause(consumer.assignment())
            self._paused = True

    def _resume(self, consumer: Consumer) -> None:
        if self._paused:
            consumer.resume(consumer.assignment())
            self._paused = False

    def _report_lag(self, consumer: Consumer) -> None:
        now = time.monotonic()
        if now - self._last_lag < 5:
            return
        self._last_lag = now
        for tp in list(self._epochs):
            try:
                _, high = consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)
            except KafkaException:
                continue
            if high >= 0:
                lag = max(high - self._db_next.get(tp, 0), 0)
                self._metrics.lag.labels(tp[0], str(tp[1])).set(lag)
                self._lag_labels.add(tp)


def _tp(msg: Message) -> TP:
    return (msg.topic() or "", msg.partition() or 0)


def _headers(msg: Message) -> list[tuple[str, str | bytes | None]]:
    raw = msg.headers()
    if raw is None:
        return []
    return list(raw.items()) if isinstance(raw, dict) else list(raw)


def error_logger(prefix: str) -> Callable[[KafkaError], None]:
    def on_error(err: KafkaError) -> None:
        log.warning("%s: %s", prefix, err)

    return on_error
