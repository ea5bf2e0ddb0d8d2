"""The consumer runtime: a confluent-kafka consumer in its own thread feeding the writer.

Threads: the consumer thread owns the confluent-kafka Consumer and all consumer state
(owned partitions, epochs, the buffer); rebalance callbacks run on it, inside
``consume``. The asyncio loop (the caller's) owns PostgreSQL. The thread hands each
batch to the loop with ``run_coroutine_threadsafe`` and keeps fetching the next batch
while one is in flight; at most one batch is in flight and one is buffered. When both
are full the thread waits for the write; if that takes longer than a second the
assignment is paused (backpressure, not buffering). It is not paused at once because
pausing purges librdkafka's prefetched records, which the resume must fetch again: at
every batch, that made the consumer wait on the broker (measured: 4.8k -> 13k events/s).
librdkafka's own prefetch queue is bounded by ``queued.max.messages.kbytes``.

Buffered records are decoded ahead, a chunk per loop turn, while the previous batch is in
flight: decoding is the consumer thread's main cost, and doing it only at dispatch left
PostgreSQL idle while the thread decoded and the thread idle while PostgreSQL wrote.
Decoding is pure, so decoding early changes no order of effects (the dead-letter writes
and the hand-off still happen in :meth:`ConsumerRuntime._dispatch`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Collection, Coroutine
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)

from ackline.core.faults import DISARMED, Faults
from ackline.core.metrics import Metrics
from ackline.schemas.decode import DEFAULT_LIMITS, Limits, Rejection, Row, decode
from ackline.sinks.connection import Database
from ackline.sinks.errors import FencedError
from ackline.sinks.ingest.batch import TP, Batch, Coord, Incoming, PartitionRange
from ackline.sinks.ingest.offsets import claim, locked_offsets
from ackline.sinks.ingest.writer import BatchWriter, WriteResult
from ackline.streams.committed import record_committed
from ackline.streams.deadletter import DeadLetterProducer, Poison
from ackline.streams.errors import FatalConsumerError
from ackline.streams.holds import Holds

log = logging.getLogger(__name__)
_CANCEL_WAIT_S = 30.0  # a cancelled write ends within this, or it is logged again
_DECODE_CHUNK = 250  # records decoded per loop turn: keeps the in-flight check frequent
# A full buffer waits this long for the in-flight batch before pausing the assignment:
# pausing purges librdkafka's prefetched records, which must then be fetched again.
_PAUSE_AFTER_S = 1.0


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
    newer_version_wait_s: float = 0.0  # hold a partition at a newer payload version (holds.py)
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
        self._fetch_next: dict[TP, int] = {}  # offset after the last record read, per partition
        self._buffer: list[Message] = []
        self._decoded: list[Row | Rejection] = []  # decode results of a prefix of _buffer
        self._buffer_since = 0.0
        self._inflight: _Write | None = None
        self._inflight_batch: Batch | None = None
        self._inflight_started = 0.0
        self._paused = False
        self._holds: Holds[Message] = Holds(config.newer_version_wait_s)
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
            self._decoded.clear()
        finally:
            consumer.close()
            self._consumer = None
            self._metrics.assigned.set(0)

    def _step(self, consumer: Consumer) -> None:
        if self._holds.held:
            self._end_holds(consumer)
        if self._inflight is not None and self._inflight.done():
            self._complete()
        full = len(self._buffer) >= self.cfg.batch_max_events
        due = bool(self._buffer) and (
            time.monotonic() - self._buffer_since >= self.cfg.batch_max_ms / 1000
        )
        if (full or due) and self._inflight is None:
            self._dispatch()
            return
        if self._decode_ahead():
            return
        if full and time.monotonic() - self._inflight_started < _PAUSE_AFTER_S:
            self._wait_inflight(0.05)  # a normal write: keep the prefetch, do not pause
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
        if self._holds.held:  # parked records are read but not written
            return False
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
        offset = msg.offset() or 0
        expected = self._fetch_next.get(tp)
        if expected is not None and offset > expected:
            self._check_retention_gap(tp, expected, offset)
        self._fetch_next[tp] = offset + 1
        if self._holds.is_held(tp):
            self._holds.park(tp, msg)  # read before the pause took effect: kept, in order
            return
        if not self._buffer:
            self._buffer_since = time.monotonic()
        self._buffer.append(msg)

    # ---- batches ---------------------------------------------------------------------

    def _decode_ahead(self) -> bool:
        """Decode up to _DECODE_CHUNK buffered records not decoded yet; False if none."""
        done = len(self._decoded)
        pending = self._buffer[done : done + _DECODE_CHUNK]
        limits = self.cfg.limits
        self._decoded.extend([decode(msg.value(), limits) for msg in pending])
        return bool(pending)

    def _dispatch(self) -> None:
        """Decode the buffer, write its poison to the dead-letter topic, submit the batch.

        Order of effects: after_fetch point; decode (pure); dead-letter records produced
        and acknowledged; then the batch is handed to the writer. A crash before the
        hand-off loses nothing (the DB offset has not moved); a crash after the dead-letter
        acknowledgement repeats those dead-letter records on redelivery, never loses them.
        """
        msgs, self._buffer = self._buffer, []
        results, self._decoded = self._decoded, []
        self._faults.hit("after_fetch")
        limits = self.cfg.limits
        results.extend([decode(msg.value(), limits) for msg in msgs[len(results) :]])
        ranges: dict[TP, list[int]] = {}
        batch = Batch(ranges=())
        poison: list[Poison] = []
        for msg, decoded in zip(msgs, results, strict=True):
            tp = _tp(msg)
            offset = msg.offset() or 0
            if self._held_back(tp, offset, msg, decoded):
                continue
            span = ranges.setdefault(tp, [offset, offset])
            span[1] = offset
            coord = Coord(tp[0], tp[1], offset)
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
        if not ranges:
            return  # every record was held back: nothing to write
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
        self._inflight = _Write(self._loop, self._writer.write(batch))

    def _held_back(self, tp: TP, offset: int, msg: Message, decoded: Row | Rejection) -> bool:
        """Park ``msg`` if its partition is held, or if it starts a hold (ackline.streams.holds).

        A new hold pauses the partition; the records before it in this batch still commit.
        """
        if self._holds.is_held(tp):
            self._holds.park(tp, msg)
            return True
        newer = decoded.newer if isinstance(decoded, Rejection) else None
        if newer is None or not self._holds.decide(tp, offset, newer, time.monotonic()):
            return False
        self._holds.park(tp, msg)
        if self._consumer is not None:
            self._consumer.pause([TopicPartition(tp[0], tp[1])])
        log.warning(
            "holding %s[%d] at offset %d: %s v%d is newer than this worker knows; waiting up "
            "to %.0fs for a worker that knows it to take the partition",
            tp[0],
            tp[1],
            offset,
            newer[0],
            newer[1],
            self._holds.wait_s,
        )
        return True

    def _end_holds(self, consumer: Consumer) -> None:
        """Expired holds: the parked records go back, in order, to the front of the buffer;
        the held record is then rejected (ackline.streams.holds)."""
        for tp in self._holds.due(time.monotonic()):
            records = self._holds.release(tp)
            log.warning(
                "%s[%d]: no worker that knows the newer version took the partition; "
                "rejecting the held record",
                tp[0],
                tp[1],
            )
            if not self._buffer:
                self._buffer_since = time.monotonic()
            self._buffer = records + self._buffer
            self._decoded = []  # positions moved: decode again
            try:
                consumer.resume([TopicPartition(tp[0], tp[1])])
            except KafkaException as exc:
                log.info("resume %s: %s", tp, exc)

    def _wait_inflight(self, timeout: float) -> bool:
        return self._inflight is None or self._inflight.wait(timeout)

    def _settle(self, wait_s: float) -> None:
        """Let the in-flight batch end (commit, roll back, or be cancelled), then record it.

        A cancelled write is waited for until its task has really ended (the writer drops
        its connection on cancel, so that is quick): nothing may run on its partitions or
        its connection while it could still be committing.
        """
        if self._inflight is None:
            return
        if not self._wait_inflight(wait_s):
            log.warning(
                "batch %s still in flight after %.0fs: cancelling it",
                self._inflight_batch.describe() if self._inflight_batch else "?",
                wait_s,
            )
            self._inflight.cancel()
            while not self._wait_inflight(_CANCEL_WAIT_S):
                log.error("a cancelled batch write has not ended after %.0fs", _CANCEL_WAIT_S)
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
            result = future.outcome()
        except asyncio.CancelledError:
            log.warning(
                "batch %s cancelled; the DB offset decides where it resumes", batch.describe()
            )
            self._resync(batch, fenced=())
            return
        except FencedError as exc:
            self._metrics.fenced.inc()
            log.error("batch %s fenced and rolled back: %s", batch.describe(), exc)
            self._resync(batch, fenced=exc.partitions)
            return
        self._faults.hit("after_commit")
        self._store(batch)
        self.committed_batches += 1
        seconds = time.monotonic() - self._inflight_started
        record_committed(self._metrics, batch, result, seconds)

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

    def _resync(self, batch: Batch, fenced: Collection[TP]) -> None:
        """Re-position the partitions of a batch that did not commit (or may not have).

        Order of effects: forget the fenced partitions (another worker owns them); read
        the offset rows of the batch's other partitions, still owned under the batch's
        epoch, FOR SHARE (which waits for the batch's transaction to end, so a cancelled
        COMMIT is seen as it ended); forget those whose epoch moved meanwhile; drop the
        buffered records of the rest and seek them back to their DB next offsets.

        Without this, the next batch of a kept partition would start after the dropped
        one, and the fence (next_offset <= first_offset: offsets are not contiguous, so
        it cannot ask for equality) would let it commit past the dropped records: lost.
        A crash at any step loses nothing: the DB offsets have not moved past them.
        """
        self._forget(list(fenced))
        if self._stop.is_set():
            return  # shutting down: the next owner starts from the DB offsets anyway
        kept = [
            (r.topic, r.partition)
            for r in batch.ranges
            if self._epochs.get((r.topic, r.partition)) == r.epoch
        ]
        if not kept:
            return

        async def read() -> list[Any]:
            return await self._control_db.retrying(
                "resync", lambda conn: locked_offsets(conn, self.cfg.group_id, kept)
            )

        rows = asyncio.run_coroutine_threadsafe(read(), self._loop).result()
        again = [c for c in rows if self._epochs.get((c.topic, c.partition)) == c.epoch]
        self._forget([(c.topic, c.partition) for c in rows if c not in again])
        self._drop_buffered({(c.topic, c.partition) for c in again})
        default = OFFSET_BEGINNING if self.cfg.start_from == "earliest" else OFFSET_END
        for c in again:
            tp = (c.topic, c.partition)
            self._db_next.pop(tp, None)
            self._fetch_next.pop(tp, None)
            if c.next_offset is not None:
                self._db_next[tp] = self._fetch_next[tp] = c.next_offset
            where = c.next_offset if c.next_offset is not None else default
            if self._consumer is not None:  # raises if it cannot: a crash re-reads too
                self._consumer.seek(TopicPartition(c.topic, c.partition, where))
        log.warning(
            "re-reading %s from their DB offsets after batch %s was dropped",
            [(c.partition, c.next_offset) for c in again],
            batch.describe(),
        )

    def _check_retention_gap(self, tp: TP, expected: int, offset: int) -> None:
        """A jump in a partition's offsets is usual (transaction markers, aborted records);
        one that starts below the log start offset means retention deleted records this
        group never read: count and report them. The fence allows the jump, the DB offset
        moves past the gap with the next batch; nothing can bring those records back."""
        consumer = self._consumer
        if consumer is None:
            return
        part = TopicPartition(tp[0], tp[1])
        try:
            low, _ = consumer.get_watermark_offsets(part, cached=True)
            if low < 0:
                low, _ = consumer.get_watermark_offsets(part, timeout=5)
        except KafkaException as exc:
            log.info("cannot read the log start of %s[%d]: %s", tp[0], tp[1], exc)
            return
        if low <= expected:
            return
        skipped = min(low, offset) - expected
        self._metrics.retention_skipped.labels(tp[0], str(tp[1])).inc(skipped)
        log.error(
            "%s[%d]: offsets %d..%d were deleted by retention before this group ingested "
            "them (%d offsets skipped); continuing at %d",
            tp[0],
            tp[1],
            expected,
            min(low, offset) - 1,
            skipped,
            offset,
        )

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
                self._db_next[tp] = self._fetch_next[tp] = c.next_offset
            offset = c.next_offset if c.next_offset is not None else default
            assign.append(TopicPartition(c.topic, c.partition, offset))
        consumer.incremental_assign(assign)
        # New partitions are not paused here even when the kept ones are: a pause right
        # after the assign can make librdkafka drop the assign offset (its issue #2190) and
        # leave the partition unfetched. Until the next pause they only fill librdkafka's
        # prefetch queue, which queued.max.messages.kbytes bounds.
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
            log.info(
                "%s with batch %s in flight: letting it finish",
                "lost" if lost else "revoked",
                self._inflight_batch.describe() if self._inflight_batch else "?",
            )
            self._faults.hit("lost_in_flight" if lost else "revoke_in_flight")
            self._settle(self.cfg.revoke_wait_s)
        tps = [(tp.topic, tp.partition) for tp in partitions]
        self._forget(tps)
        # librdkafka keeps a partition's pause flag across unassign and a later assign
        # (librdkafka #1849): a partition given up while paused (backpressure or a hold)
        # would come back paused and never be fetched again. Resume whatever is given up.
        try:
            consumer.resume(partitions)
        except KafkaException as exc:
            log.info("resume before unassign: %s", exc)
        try:
            consumer.incremental_unassign(partitions)
        except KafkaException as exc:
            log.info("unassign: %s", exc)
        # The partitions kept stay paused if they were (pausing is per partition).
        log.info("%s %s", "lost" if lost else "revoked", [p for _, p in tps])

    def _forget(self, tps: list[TP]) -> None:
        gone = set(tps)
        for tp in gone:
            self._epochs.pop(tp, None)
            self._db_next.pop(tp, None)
            self._fetch_next.pop(tp, None)
            if tp in self._lag_labels:
                self._lag_labels.discard(tp)
                self._metrics.lag.remove(tp[0], str(tp[1]))
        self._drop_buffered(gone)
        self._metrics.assigned.set(len(self._epochs))

    def _drop_buffered(self, gone: set[TP]) -> None:
        """Drop the buffered, decoded and held records of ``gone`` (they are read again)."""
        resume = [TopicPartition(*tp) for tp in gone if self._holds.is_held(tp)]
        self._holds.forget(gone)
        if resume and self._consumer is not None and not self._paused:
            self._consumer.resume(resume)  # a hold had paused them
        keep = [i for i, m in enumerate(self._buffer) if _tp(m) not in gone]
        decoded = len(self._decoded)
        self._decoded = [self._decoded[i] for i in keep if i < decoded]
        self._buffer = [self._buffer[i] for i in keep]

    # ---- flow control and lag -----------------------------------------------------------

    def _pause(self, consumer: Consumer) -> None:
        if not self._paused:
            assignment = consumer.assignment()
            consumer.pause(assignment)
            self._paused = True
            log.info(
                "paused %s: the buffer is full and the write in flight has taken %.1fs",
                sorted(p.partition for p in assignment),
                time.monotonic() - self._inflight_started,
            )

    def _resume(self, consumer: Consumer) -> None:
        if self._paused:
            held = self._holds.held  # held partitions stay paused until their hold ends
            consumer.resume([p for p in consumer.assignment() if _tp_of(p) not in held])
            self._paused = False

    def _report_lag(self, consumer: Consumer) -> None:
        now = time.monotonic()
        if now - self._last_lag < 5:
            return
        self._last_lag = now
        # With nothing of a partition buffered or in flight, everything below the consumer's
        # position is committed or was skipped (transaction markers, aborted records), so
        # lag counts from the position; otherwise from the DB next offset.
        pending = {_tp(m) for m in self._buffer} | set(self._holds.held)
        if self._inflight_batch is not None:
            pending |= {(r.topic, r.partition) for r in self._inflight_batch.ranges}
        try:
            positions = {
                (p.topic, p.partition): p.offset
                for p in consumer.position([TopicPartition(*tp) for tp in self._epochs])
            }
        except KafkaException:
            positions = {}
        for tp in list(self._epochs):
            try:
                _, high = consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)
            except KafkaException:
                continue
            if high >= 0:
                done = self._db_next.get(tp, 0)
                if tp not in pending:
                    done = max(done, positions.get(tp, -1))
                lag = max(high - done, 0)
                self._metrics.lag.labels(tp[0], str(tp[1])).set(lag)
                self._lag_labels.add(tp)


class _Write:
    """A batch write running as a task on the event loop, watched from the consumer thread.

    Unlike the future of ``run_coroutine_threadsafe``, which is done the moment it is
    cancelled, this is done only when the task has really ended, cancelled or not: so a
    cancelled write can be waited for, and never overlaps what comes after it.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, WriteResult]
    ) -> None:
        self._loop = loop
        self._ended = threading.Event()
        self._task: asyncio.Task[WriteResult] | None = None
        loop.call_soon_threadsafe(self._start, coro)  # callbacks run in order: before cancel

    def _start(self, coro: Coroutine[Any, Any, WriteResult]) -> None:
        self._task = self._loop.create_task(coro)
        self._task.add_done_callback(lambda _: self._ended.set())

    def done(self) -> bool:
        return self._ended.is_set()

    def wait(self, timeout: float) -> bool:
        return self._ended.wait(timeout)

    def cancel(self) -> None:
        self._loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def outcome(self) -> WriteResult:
        """The result, or the exception (CancelledError included); only once done."""
        if self._task is None or not self._ended.is_set():
            raise RuntimeError("the batch write has not ended")
        return self._task.result()


def _tp_of(tp: TopicPartition) -> TP:
    return (tp.topic, tp.partition)


def _tp(msg: Message) -> TP:
    return (msg.topic() or "", msg.partition() or 0)


def _headers(msg: Message) -> list[tuple[str, str | bytes | None]]:
    raw = msg.headers()
    if raw is None:
        return []
    return list(raw.items()) if isinstance(raw, dict) else list(raw)
