"""The consumer runtime: a confluent-kafka consumer in its own thread feeding the writer.

Threads: the consumer thread owns the confluent-kafka Consumer and all consumer state
(the ownership :class:`~ackline.streams.ownership.Ledger`, the slots' buffers); rebalance
callbacks run on it, inside ``consume``. The asyncio loop (the caller's) owns
PostgreSQL. The thread hands each batch to the loop and keeps fetching the next batch
while one is in flight. Each partition belongs to one writer slot (streams/slots.py, one
PostgreSQL connection each, ``writer_connections`` of them): per slot at most one batch is
in flight and one is buffered, each bounded by ``batch_max_events`` and
``batch_max_bytes``. A batch closes when its slot's writer is free (group commit, after
``batch_linger_ms`` when set): at low load a record waits for no timer, at high load
batches grow while a write is in flight. When a slot's buffer is full the thread waits for
that slot's write; if that takes longer than a second the assignment is paused
(backpressure, not buffering). It is not paused at once because pausing purges
librdkafka's prefetched records, which the resume must fetch again: at every batch, that
made the consumer wait on the broker (measured: 4.8k -> 13k events/s). librdkafka's own
prefetch queue is bounded by ``queued.max.messages.kbytes``.

Buffered records are decoded ahead, a chunk per loop turn, while the previous batch is in
flight: decoding is the consumer thread's main cost, and doing it only at dispatch left
PostgreSQL idle while the thread decoded and the thread idle while PostgreSQL wrote.
Decoding is pure, so decoding early changes no order of effects (the dead-letter writes
and the hand-off still happen in :meth:`ConsumerRuntime._dispatch`).

Why the class is longer than the house's ~300 lines: it is the one owner of the consumer
thread's state, and every method here runs on that thread; the pure parts live apart
(ownership, assembly, holds, lag, in-flight writes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from ackline.core.faults import DISARMED, Faults
from ackline.core.logs import kafka_logger
from ackline.core.metrics import Metrics
from ackline.schemas.decode import Rejection, decode
from ackline.schemas.exact import exact_form
from ackline.sinks.connection import Database
from ackline.sinks.errors import FencedError, RepeatRejectedError
from ackline.sinks.ingest.batch import TP, Batch, not_passed
from ackline.sinks.ingest.offsets import Claim
from ackline.sinks.ingest.writer import BatchWriter, WriteResult
from ackline.streams.admin import admin, stable_ends, stable_ends_and_why
from ackline.streams.assemble import Record, assemble, new_record, record_size
from ackline.streams.claims import Claims
from ackline.streams.committed import record_committed
from ackline.streams.consumer_config import RuntimeConfig
from ackline.streams.deadletter import DeadLetterProducer, safe_headers
from ackline.streams.errors import (
    JOIN_REFUSED,
    DeadLettersStoppedError,
    FatalConsumerError,
    join_refused,
    join_refused_grace_s,
)
from ackline.streams.fetchsize import fetch_room, next_size_hint
from ackline.streams.group_errors import GroupErrorStreak
from ackline.streams.groupwatch import GroupWatch
from ackline.streams.holds import Holds
from ackline.streams.inflight import InFlight
from ackline.streams.lag import (
    PartitionWatch,
    count_retention_gap,
    log_start,
    partition_lag,
    stable_offsets,
    watermarks,
)
from ackline.streams.ownership import (
    NO_GENERATION,
    Admit,
    Ledger,
    Rewind,
    log_end_unknown,
    past_log_end,
)
from ackline.streams.release import ReleaseGate
from ackline.streams.slots import BUFFERED_BATCHES, Looked, Slot, SlotMap

log = logging.getLogger(__name__)
_CANCEL_WAIT_S = 30.0  # a cancelled write ends within this, or it is logged again
_DECODE_CHUNK = 250  # records decoded per loop turn: keeps the in-flight check frequent
# A full buffer waits this long for its slot's batch in flight before pausing the assignment:
# pausing purges librdkafka's prefetched records, which must then be fetched again.
_PAUSE_AFTER_S = 1.0
_WATERMARK_TIMEOUT_S = 5.0
_HELD_READ_BUDGET_S = 1.0
"""How long one lag report may spend asking the broker for held partitions' log ends."""
_REJOIN_WAIT_LOG_S = 60.0  # how often a rejoin waiting for the leave's revoke says so
_IDLE_POLL_S = 0.1  # an idle worker waits this long per turn for its first record
_COLLECT_S = 0.02  # a busy worker collects records this long per turn
# After handing a batch to the event loop, give up the GIL this long: the loop thread then
# starts the write at once instead of waiting for this thread's next switch interval
# (handed-to-BEGIN 1.0 -> 0.14 ms at the median, measured in a 300k-event drain).
_HAND_OFF_YIELD_S = 0.0002


async def _settled(stopping: Callable[[], bool]) -> bool:
    """No watch of the topic's incarnation: every batch may be written."""
    return True


class ConsumerRuntime:
    """Runs until :meth:`request_stop`; see the module docstring for the threads."""

    def __init__(
        self,
        config: RuntimeConfig,
        control_db: Database,
        writers: Sequence[BatchWriter],
        dead_letters: DeadLetterProducer,
        metrics: Metrics,
        loop: asyncio.AbstractEventLoop,
        faults: Faults = DISARMED,
    ) -> None:
        self.cfg = config
        # Records a writer sent back undecodable (RepeatRejectedError): decoded whenever
        # read again, even on a repeating slot, until a committed batch passes them or
        # their partition is given up (so a decode thrown away, by a hold's release or a
        # re-read, is made again).
        self._decode_at: set[tuple[str, int, int]] = set()
        self._control_db = control_db  # claims; each writer has its own connection
        if not writers:
            raise ValueError("a consumer runtime needs at least one writer")
        self._slots = [Slot(w) for w in writers]
        self._slot_map = SlotMap(len(self._slots))
        self._any_ended = threading.Event()  # set when any slot's write ends
        self._dlq = dead_letters
        self._metrics = metrics
        self._loop = loop
        self._faults = faults
        self._stop = threading.Event()
        self._consumer: Consumer | None = None
        self.ledger = Ledger()
        # Until records are seen, assume each may be as large as a valid record may be: the
        # first few hundred records come in small calls (once), never a whole queue at once.
        self._size_hint = float(config.limits.max_bytes)
        self._paused = False
        self._holds: Holds[Record] = Holds(config.newer_version_wait_s)
        self._watch = PartitionWatch(metrics)
        # each partition's last stable offset, from the latest statistics (_on_stats)
        self._stable: dict[TP, int] = {}
        # Below the group's session timeout, so a cut-off worker stops before the broker
        # hands its partitions to another (KIP-848 brokers default to 45 s).
        self._group = GroupWatch(grace_s=min(config.session_timeout_ms, 45_000) / 2000)
        self._away = False
        # joins Kafka refused (JOIN_REFUSED) since the last assignment; a member gone
        # without leaving keeps failing them for a while
        self._refused = GroupErrorStreak(join_refused_grace_s(config.session_timeout_ms))
        self._refused_line: str | None = None  # the line the last refusal would stop with
        # Out of the group because PostgreSQL does not answer this worker (_check_database),
        # with the probe whose answer brings it back; or to leave at the next turn.
        self._left = False
        self._leave_due = False
        # _rejoin: when it last said it waits for the leave's revoke, the probe answered
        self._rejoin_waits: float | None = None
        self._claim_away = 0.0  # how long the assign claim that gave up could not connect
        self._told_shared = False  # drain_and_stop: said once that others hold partitions
        self._probe: concurrent.futures.Future[None] | None = None
        # The partitions a rebalance callback is giving up, while it settles the writes in
        # flight (None outside one): :meth:`_not_committed` leaves them to the release.
        self._releasing: frozenset[TP] | None = None
        self._retaking: concurrent.futures.Future[list[Claim]] | None = None  # see _retake
        self._retaking_tps: set[TP] = set()  # its partitions (_forget abandons it whole)
        self._retaking_started = 0.0
        self._admin_client: AdminClient | None = None
        self._claims = Claims(
            loop, control_db, config.group_id, config.worker_id, self._stop.is_set
        )
        self.committed_batches = 0
        self.drain_and_stop = False
        # Whether the topic's incarnation was confirmed by a read begun at or after a
        # monotonic time (ackline.runtime.incarnation_watch): a held partition is
        # released, and a drained worker stops, only then. The runtime sets it.
        self.incarnation_fresh: Callable[[float], bool] = lambda since: True
        # Whether a batch taken now may be written (ackline.runtime.incarnation_watch
        # settled): awaited before each write, late-bound as incarnation_fresh
        self.incarnation_settled: Callable[[Callable[[], bool]], Awaitable[bool]] = _settled
        # late-bound: the runtime sets incarnation_fresh after this
        self._held_release = ReleaseGate(lambda since: self.incarnation_fresh(since))  # noqa: PLW0108
        self._drained_at: float | None = None
        self._topic_partitions = 0

    # ---- lifecycle -------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """The consumer thread's body. Returns after a clean shutdown; raises on fatal errors.

        Shutdown order: stop fetching; let the batches in flight commit (or cancel them
        after ``shutdown_wait_s``: the DB decides what committed); store their offsets; drop
        the buffered, unwritten records (they are re-read from the DB offset next time);
        close the consumer, which revokes (nothing in flight now), commits the stored
        offsets and leaves the group. A retake claim still running is cancelled first (one
        that lands anyway only raises epochs: the next owner's claim raises them again).
        """
        conf = self.cfg.consumer_conf()
        conf["stats_cb"] = self._on_stats
        consumer = Consumer(conf, logger=kafka_logger())  # de-duplicated, through logging
        self._consumer = consumer
        self._subscribe(consumer)
        try:
            while not self._stop.is_set():
                self._step(consumer)
            self._faults.hit("shutdown")
            self._settle(self.cfg.shutdown_wait_s)
            for slot in self._slots:
                slot.clear()
        finally:
            self._abandon_retake()
            if self._probe is not None:
                self._probe.cancel()
            consumer.close()
            self._consumer = None
            self._metrics.assigned.set(0)

    def _subscribe(self, consumer: Consumer) -> None:
        consumer.subscribe(
            [self.cfg.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _step(self, consumer: Consumer) -> None:
        if self._holds.held:
            self._end_holds(consumer)
        for slot in self._slots:
            if slot.inflight is not None and slot.inflight.done():
                self._complete(slot)
        self._check_database(consumer)
        if self._left:
            self._out_of_group(consumer)
            return
        self._check_group()
        self._check_refused()
        self._retake(consumer)
        now = time.monotonic()
        ready, full = self._ready(now)
        if ready is not None:
            self._dispatch(ready)
            return
        if self._decode_ahead():
            return
        if full is not None and now - full.started < _PAUSE_AFTER_S:
            self._wait_any(0.05)  # a normal write: keep the prefetch, do not pause
            return
        if full is not None:
            self._pause(consumer, full)
            self._wait_any(0.05)
            msg = consumer.poll(0)  # serves rebalance callbacks while paused
            if msg is not None:
                self._accept([msg])  # never drop a record of an owned partition
            return
        self._resume(consumer)
        msgs = self._fetch(consumer)
        self._accept(msgs)
        if self._watch.due():
            self._report(consumer)
        if self.drain_and_stop:
            self._stop_if_drained(consumer, not msgs and not self._buffered())

    def _member(self) -> bool:
        """Whether the consumer is in its group now (librdkafka's member id)."""
        return self._consumer is not None and bool(self._consumer.memberid())

    def _check_refused(self) -> None:
        """Stop when a join Kafka refused (:data:`JOIN_REFUSED`) was followed by no join
        for the grace, outside the group, whether refusals kept coming (every ~2 s) or
        not: librdkafka hands a refusal of its coordinator lookup (a group the worker may
        not describe, an id the broker refuses) once and then keeps still ("suppress
        repeated errors"), and the worker owned nothing for ever. Refusals are counted
        outside the group only (:meth:`_accept`); this is the one place that stops."""
        if self._refused_line is None or not self._refused.lasted(time.monotonic()):
            return
        if not self._member():  # not joined since (the assign would have ended it)
            raise FatalConsumerError(self._refused_line)

    def _stop_if_drained(self, consumer: Consumer, idle: bool) -> None:
        """``--until-drained``: stop once idle with every position at its last stable
        offset, and the topic's incarnation confirmed since (not drained into a topic
        made again, whose records below the old offsets were never read)."""
        if not (idle and not self._writing() and self._drained(consumer)):
            self._drained_at = None
            return
        if self._drained_at is None:
            self._drained_at = time.monotonic()
        if self.incarnation_fresh(self._drained_at):
            log.info("drained: every partition's position is at its last stable offset")
            self._stop.set()

    def _out_of_group(self, consumer: Consumer) -> None:
        """A turn out of the group (left, the revoke not served yet or the probe of
        :meth:`_rejoin` under way): no batch is dispatched and no retake claimed. The
        partitions are being given up, and the probe runs on the writers' connections,
        one statement at a time each: a batch dispatched beside it met asyncpg's "another
        operation is in progress", which is not transient, and the worker died. A poll
        serves the revoke; a record it still hands back is buffered, and the revoke
        drops the buffers (its partition is read again from the DB offset); the revoke
        also ends the writes in flight (:meth:`_release`)."""
        writing = self._writing()
        msg = consumer.poll(0 if writing else _IDLE_POLL_S)
        if msg is not None:
            self._accept([msg])
        if writing:
            self._wait_any(0.05)
        if self._watch.due():
            self._report(consumer)  # the gauges /readyz reads: nothing assigned, once out

    def _ready(self, now: float) -> tuple[Slot | None, Slot | None]:
        """The first slot whose batch leaves now; else, when the buffers are at their
        bound (:meth:`_room`), the slot of the oldest write in flight, which holds them up.

        Group commit: a batch closes when its writer is free (after the linger, if one is
        set), and grows only while a write is in flight. At the bound some slot holds a
        whole batch, so it is writing, or it would leave now.
        """
        cfg = self.cfg
        for slot in self._slots:
            if slot.buffer and slot.inflight is None:
                slot_full = slot.full(cfg.batch_max_events, cfg.batch_max_bytes)
                if slot_full or now - slot.buffer_since >= cfg.batch_linger_ms / 1000:
                    return slot, None
        events_left, bytes_left = self._room()
        if events_left > 0 and bytes_left > 0:
            return None, None
        writing = [slot for slot in self._slots if slot.inflight is not None]
        return None, min(writing, key=lambda slot: slot.started, default=None)

    def _room(self) -> tuple[int, int]:
        """Records and bytes the worker may still buffer: :data:`BUFFERED_BATCHES` batches'
        worth per slot, counted over all the slots (streams.slots says why)."""
        cfg, slots = self.cfg, self._slots
        batches = BUFFERED_BATCHES * len(slots)
        events = batches * cfg.batch_max_events - sum(len(slot.buffer) for slot in slots)
        size = batches * cfg.batch_max_bytes - sum(slot.buffer_bytes for slot in slots)
        return events, size

    def _fetch(self, consumer: Consumer) -> list[Message]:
        """The next records. With the writer free and nothing buffered, wake at the first
        record (``consume`` waits for its whole count or its timeout, which made a lone
        record wait the timeout) and take what else is queued already. While a write is in
        flight, take what is queued and, if nothing is, wait on the write rather than in
        ``consume``: the next batch must leave the moment the writer is free (group
        commit), and a ``consume`` that blocked for its timeout made every batch wait up
        to that long after its write had ended (a floor of ~20 ms per batch at half load).
        Otherwise (a lingering buffer) collect for a short while."""
        # Records of any slot may come next: take no more than the buffers have room for.
        room = fetch_room(*self._room(), self._size_hint)
        if self._writing():
            queued = consumer.consume(num_messages=room, timeout=0)
            if not queued:
                self._wait_any(_COLLECT_S)  # returns at once when a write ends
            return list(queued)
        if self._buffered():
            return list(consumer.consume(num_messages=room, timeout=_COLLECT_S))
        first = consumer.poll(_IDLE_POLL_S)
        if first is None:
            return []
        return [first, *consumer.consume(num_messages=room - 1, timeout=0)] if room > 1 else [first]

    def _drained(self, consumer: Consumer) -> bool:
        """True when this worker owns every partition and has read each to its end."""
        if not self._topic_partitions:
            meta = consumer.list_topics(self.cfg.topic, timeout=10)
            self._topic_partitions = len(meta.topics[self.cfg.topic].partitions)
        assignment = consumer.assignment()
        if self._holds.held or self.ledger.blocked():  # parked or refused records
            return False
        owned = self.ledger.owned()
        if len(owned) < self._topic_partitions or not assignment:
            if owned and not self._told_shared:  # else it waits in silence for good
                self._told_shared = True
                log.info(
                    "until drained: %d of the topic's %d partitions are this worker's; it "
                    "stops once it owns them all (another worker of the group holds the rest)",
                    len(owned),
                    self._topic_partitions,
                )
            return False
        # All the ends in one request on the admin client's connection: the consumer's own
        # get_watermark_offsets queues behind its long-poll fetch on the broker's
        # connection, up to fetch.wait.max.ms (500 ms) a partition, one after another, and
        # a SIGTERM (checked between turns) waited for them all: 4 s at 8 partitions.
        ends = stable_ends(self._admin(), [_tp_of(p) for p in assignment], _WATERMARK_TIMEOUT_S)
        for tp in consumer.position(assignment):
            key = _tp_of(tp)
            if key not in ends:  # no answer in time: not known to be read to its end
                return False
            db_next = self.ledger.db_next(key)  # 0 is an offset: not "unknown"
            pos = (
                tp.offset
                if tp.offset >= 0
                else db_next
                if db_next is not None
                else log_start(consumer, key)
            )
            if pos is None or pos < ends[key]:
                return False
        return True

    def _accept(self, msgs: Iterable[Message]) -> None:
        """Take ``msgs`` into their slots' buffers, in order: each one owned and not taken
        yet, else dropped (not owned, already committed, a repeat, or read before a seek
        back); a partition that is held parks it. One call per fetch, its lookups bound
        once: it runs for every record, and with a call (and a closure) per record it
        took ~11 % of a replay's worker samples (py-spy; docs/performance.md)."""
        ledger, holds, slots, slot_of = self.ledger, self._holds, self._slots, self._slot_map.of
        hint = self._size_hint
        try:
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.fatal():
                        raise FatalConsumerError(f"fatal consumer error: {err}")
                    # a join refused never passes while so: a WARNING every 2 s for ever
                    # (an operator's hunts: a faust worker in the group, a session timeout
                    # the broker refuses); a member killed stays in until its session
                    # times out, and a broker's settings may be rolled out: not at once
                    if err.code() in JOIN_REFUSED and not self._member():
                        # counted outside the group only (a member's stray refusal, a
                        # coordinator lookup refused as the coordinator moves, is logged);
                        # the next turn's _check_refused stops the worker past the grace
                        timeout_ms, group = self.cfg.session_timeout_ms, self.cfg.group_id
                        self._refused_line = join_refused(group, err.code(), str(err), timeout_ms)
                        self._refused.error(time.monotonic(), 0)
                    log.warning("consumer error: %s", err)
                    continue
                tp = (msg.topic() or "", msg.partition() or 0)
                offset = msg.offset() or 0
                expected = ledger.expected(tp)
                if ledger.admit(tp, offset) is not Admit.TAKE:
                    continue
                if expected is not None and offset > expected:
                    count_retention_gap(self._consumer, self._metrics, tp, expected, offset)
                key, value = msg.key(), msg.value()
                # The headers are read here although only poison keeps them: the byte
                # bound must count them (their conversion costs ~2-3.5 us per record:
                # docs/performance.md, "Headers counted"); the slot keeps this size
                headers = safe_headers(msg)
                size = record_size(key, value, headers)
                hint = next_size_hint(hint, size)  # parked records count too
                record = new_record((tp[0], tp[1], offset, key, value, headers, NO_GENERATION))
                if holds.is_held(tp):
                    holds.park(tp, record)  # read before the pause took effect: kept, in order
                    continue
                slots[slot_of(tp)].add(record, size)
        finally:
            self._size_hint = hint

    # ---- batches ---------------------------------------------------------------------

    def _decode_ahead(self) -> bool:
        """Decode up to _DECODE_CHUNK buffered records not decoded yet, of the first slot
        that has any; False if none."""
        for slot in self._slots:
            done = len(slot.decoded)
            pending = slot.buffer[done : done + _DECODE_CHUNK]
            if pending:
                slot.decoded.extend(self._first_look(pending, slot.repeating))
                return True
        return False

    def _buffered(self) -> bool:
        return any(slot.buffer for slot in self._slots)

    def _writing(self) -> bool:
        return any(slot.inflight is not None for slot in self._slots)

    def _wait_any(self, timeout: float) -> None:
        """Wait until a write in flight ends, at most ``timeout``."""
        self._any_ended.clear()  # before looking: an end after this sets it again
        if any(s.inflight is not None and s.inflight.done() for s in self._slots):
            return
        self._any_ended.wait(timeout)

    def _dispatch(self, slot: Slot) -> None:
        """Decode the buffer, write its poison to the dead-letter topic, submit the batch.

        Order of effects: after_fetch point; decode (pure); dead-letter records produced
        and acknowledged; then the batch is handed to the writer. A crash before the
        hand-off loses nothing (the DB offset has not moved); a crash after the dead-letter
        acknowledgement repeats those dead-letter records on redelivery, never loses them.
        A stop while dead letters wait for the broker drops the batch unwritten (the same:
        nothing of it moved the DB offset).
        The batch holds only ``slot``'s partitions, none of which is in flight.
        """
        records, results = slot.take(self.cfg.batch_max_events, self.cfg.batch_max_bytes)
        self._faults.hit("after_fetch")
        results.extend(self._first_look(records[len(results) :], slot.repeating))
        taken: list[Record] = records
        decoded: list[Looked] = results
        # Only a rejection can start a hold: with none held and none rejected, all is taken.
        if self._holds.held or any(isinstance(result, Rejection) for result in results):
            taken, decoded = [], []
            for rec, result in zip(records, results, strict=True):
                if not self._held_back(rec, result):
                    taken.append(rec)
                    decoded.append(result)
        if self._holds.held:  # records buffered behind a hold that began here: parked, in order
            for rec in slot.pull(set(self._holds.held)):
                self._holds.park(rec.tp, rec)
        if not taken:
            return  # every record was held back: nothing to write
        draft = assemble(taken, decoded, self.ledger.owned())
        if draft.poison:
            self._faults.hit("before_dlq")
            try:
                draft.batch.rejects = self._dlq.send_all(
                    draft.poison, should_stop=self._stop.is_set
                )
            except DeadLettersStoppedError as exc:
                # Stopping: the batch is dropped like a buffered record (read again from
                # the DB offset by the next owner), and the stop goes on cleanly.
                log.warning("%s: batch %s not written", exc, draft.batch.describe())
                return
            self._metrics.dead_letters.inc(len(draft.poison))
        slot.batch = draft.batch
        slot.started = time.monotonic()
        write = self._write_settled(slot.writer, draft.batch)
        slot.inflight = InFlight(self._loop, write, self._any_ended)
        time.sleep(_HAND_OFF_YIELD_S)

    async def _write_settled(self, writer: BatchWriter, batch: Batch) -> WriteResult:
        """``batch`` written once the topic's incarnation is settled; not written (the
        outcome a cancelled batch has: read again from the DB offset) when another
        incarnation was found, the worker stopping (its records may be the new topic's at
        the old offsets), or when a stop comes while the topic is gone (the stop does not
        wait for it to come back)."""
        if not await self.incarnation_settled(self._stop.is_set):
            raise asyncio.CancelledError("the topic was made again or is gone: not written")
        return await writer.write(batch)

    def _first_look(self, records: list[Record], repeating: bool) -> list[Looked]:
        """Each record decoded; or, on a repeating slot, its exact form where it has one
        (ackline.schemas.exact), written undecoded and confirmed by the writer. A record a
        writer sent back (:class:`RepeatRejectedError`) is decoded this time."""
        limits = self.cfg.limits
        if not repeating:
            return [decode(rec.value, limits) for rec in records]
        back = self._decode_at
        if back:
            return [self._look_back(rec, back) for rec in records]
        return [exact_form(rec.value, limits) or decode(rec.value, limits) for rec in records]

    def _look_back(self, rec: Record, back: set[tuple[str, int, int]]) -> Looked:
        if (rec.topic, rec.partition, rec.offset) in back:
            return decode(rec.value, self.cfg.limits)
        return exact_form(rec.value, self.cfg.limits) or decode(rec.value, self.cfg.limits)

    def _held_back(self, rec: Record, decoded: Looked) -> bool:
        """Park ``rec`` if its partition is held, or if it starts a hold (streams.holds).

        A new hold pauses the partition; the records before it in this batch still commit.
        """
        tp = rec.tp
        if self._holds.is_held(tp):
            self._holds.park(tp, rec)
            return True
        newer = decoded.newer if isinstance(decoded, Rejection) else None
        if newer is None or not self._holds.decide(tp, rec.offset, newer, time.monotonic()):
            return False
        self._holds.park(tp, rec)
        self._metrics.held.set(len(self._holds.held))
        if self._consumer is not None:
            self._consumer.pause([TopicPartition(tp[0], tp[1])])
        log.warning(
            "holding %s[%d] at offset %d: %s v%d is newer than this worker knows; waiting up "
            "to %.0fs for a worker that knows it to take the partition",
            tp[0],
            tp[1],
            rec.offset,
            newer[0],
            newer[1],
            self._holds.wait_s,
        )
        return True

    def _end_holds(self, consumer: Consumer) -> None:
        """Expired holds: the parked records go back, in order, to the front of the buffer;
        the held record is then rejected (streams.holds). The partition resumes unless the
        buffer is full (backpressure paused every partition; its end resumes this one)."""
        for tp in self._holds.due(time.monotonic()):
            hold = self._holds.held[tp]
            records = self._holds.release(tp)
            self._metrics.held.set(len(self._holds.held))
            log.warning(
                "%s[%d]: no worker that knows %s v%d took the partition; rejecting the held "
                "record at offset %d, and every later one of that type at v%d or above on "
                "this worker",
                tp[0],
                tp[1],
                hold.version[0],
                hold.version[1],
                hold.offset,
                hold.version[1],
            )
            self._slots[self._slot_map.of(tp)].put_back(records)
            if self._paused:
                continue
            try:
                consumer.resume([TopicPartition(tp[0], tp[1])])
            except KafkaException as exc:
                log.info("resume %s: %s", tp, exc)

    @staticmethod
    def _wait_slot(slot: Slot, timeout: float) -> bool:
        return slot.inflight is None or slot.inflight.wait(timeout)

    def _settle(self, wait_s: float) -> None:
        """Let the batches in flight end (commit, roll back, or be cancelled), then record
        them, slot by slot.

        Within ``wait_s`` in all; a write still running then is cancelled and waited for
        until its task has really ended (the writer drops its connection on cancel, so that
        is quick): nothing may run on its partitions or its connection while it could still
        be committing.
        """
        deadline = time.monotonic() + wait_s
        for slot in self._slots:
            if slot.inflight is None:
                continue
            if not self._wait_slot(slot, max(0.0, deadline - time.monotonic())):
                log.warning(
                    "batch %s still in flight after %.0fs: cancelling it",
                    slot.batch.describe() if slot.batch else "?",
                    wait_s,
                )
                slot.inflight.cancel()
                while not self._wait_slot(slot, _CANCEL_WAIT_S):
                    log.error("a cancelled batch write has not ended after %.0fs", _CANCEL_WAIT_S)
            self._complete(slot)

    def _complete(self, slot: Slot) -> None:
        """Record the outcome of ``slot``'s finished in-flight batch.

        Order of effects: read the outcome; if committed, the after_commit point, then the
        ledger's DB offsets advance and the offsets are stored in the Kafka consumer for
        the partitions still owned under the same epoch (committed to Kafka by
        auto-commit: advisory only), then metrics. A crash between the DB commit and the
        store leaves Kafka behind the DB, which is harmless: the DB offset decides where
        the partition resumes. A batch that did not commit (or may not have) goes to
        :meth:`_not_committed`; so does one that held poison written undecoded
        (:class:`RepeatRejectedError`), whose records are decoded when read again.
        """
        future, batch = slot.inflight, slot.batch
        slot.inflight, slot.batch = None, None
        if future is None or batch is None:
            return
        try:
            result = future.outcome()
        except asyncio.CancelledError:
            log.warning(
                "batch %s cancelled; the DB offset decides where it resumes", batch.describe()
            )
            self._not_committed(batch)
            return
        except FencedError as exc:
            self._metrics.fenced.inc()
            log.error("batch %s %s: %s", batch.describe(), exc.verdict, exc)
            self._not_committed(batch, fenced=set(exc.partitions))
            return
        except RepeatRejectedError as exc:
            # Rolled back: read again, those records decoded this time (their dead letters
            # first), the others looked at as before.
            log.warning("batch %s rolled back: %s; reading it again", batch.describe(), exc)
            self._decode_at.update(exc.coords)
            self._not_committed(batch)
            return
        self._faults.hit("after_commit")
        slot.repeating = 2 * result.duplicates.get("ledger", 0) > result.events
        if self._decode_at:
            self._decode_at = not_passed(self._decode_at, batch.ranges)
        seconds = time.monotonic() - slot.started
        record_committed(self.ledger, self._metrics, batch, result, seconds)
        self._store(batch)
        self.committed_batches += 1

    def _store(self, batch: Batch) -> None:
        consumer = self._consumer
        offsets = [
            TopicPartition(r.topic, r.partition, r.next_offset)
            for r in batch.ranges
            if self.ledger.owns((r.topic, r.partition), r.epoch)
        ]
        if consumer is not None and offsets:
            try:
                consumer.store_offsets(offsets=offsets)
            except KafkaException as exc:  # advisory; the DB offset is the truth
                log.info("could not store Kafka offsets (advisory): %s", exc)

    def _not_committed(self, batch: Batch, fenced: Collection[TP] = ()) -> None:
        """Re-position the partitions of a batch that did not commit (or may not have).

        Nothing here waits for PostgreSQL, which may be what failed the batch. Order of
        effects: the before_reread point; stopping, the batch's partitions are given up (no
        record of them is written any more by this worker; the next owner starts from the
        DB offsets); otherwise, inside a rebalance callback (:meth:`_release`), the
        partitions being given up are left to the release, and the ones kept (all of them
        outside a rebalance) are suspended, after a fence with the retake's backoff, and
        their buffered records dropped, so that :meth:`_retake` claims them again on the
        loop while this thread polls on, and seeks them to the DB next offset the claim
        reads. A claim waits for the batch's transaction to end (a cancelled COMMIT is seen
        as it ended), and its new epoch fences whatever of that transaction comes late.
        Only the ``fenced`` partitions (the batch's fence failed on them: another worker
        claimed them, or their offset row went back) wait for the retake's
        growing backoff, so two workers that both believe they own one cannot spin.

        Waiting here (a re-read of the offset rows) held the consumer thread for as long
        as PostgreSQL was away: inside a callback the whole rebalance, the other worker's
        share included; outside one (a fenced batch) the thread stopped polling, so the
        next rebalance stalled the same way.

        Without this, the next batch of a kept partition would start after the dropped
        one, and the fence (next_offset <= first_offset: offsets are not contiguous, so
        it cannot ask for equality; the writer forgot where it left a batch that did not
        commit) would let it commit past the dropped records: lost. That includes a stop:
        the turn of the loop that saw the stop still dispatched the buffer. A crash at any
        step loses nothing: the DB offsets have not moved past them.
        """
        self._faults.hit("before_reread")
        releasing = self._releasing or frozenset()
        tps = [tp for tp in map(_tp_of, batch.ranges) if self.ledger.owns(tp)]
        tps = [tp for tp in tps if tp not in releasing]
        if not tps:
            return
        if self._stop.is_set():  # where PostgreSQL has them is not known; the next owner
            self._forget(tps)  # starts from the DB offsets
            log.info("stopping: gave up %s after batch %s", [p for _, p in tps], batch.describe())
            return
        # one claimed again since reads from the DB offset already
        mine = {_tp_of(r) for r in batch.ranges if self.ledger.owns(_tp_of(r), r.epoch)}
        now = time.monotonic()
        kept = [
            *self.ledger.suspend([tp for tp in tps if tp in mine and tp not in fenced], now),
            *self.ledger.suspend([tp for tp in tps if tp in mine and tp in fenced], now, True),
        ]
        self._drop_buffered(set(kept))
        self._metrics.assigned.set(len(self.ledger.owned()))
        if kept:
            log.warning(
                "batch %s %s%s: partitions %s claimed again from their DB offsets",
                batch.describe(),
                f"fenced on {sorted(p for _, p in fenced)}" if fenced else "did not commit",
                "" if self._releasing is None else " during a rebalance",
                sorted(p for _, p in kept),
            )

    def _on_stats(self, raw: str) -> None:
        """librdkafka's statistics (served by poll, on the consumer thread): the group's
        state for :class:`GroupWatch`, and each partition's last stable offset, which lag
        is measured against (:mod:`ackline.streams.lag`). Replaced whole each time, so it
        holds the partitions librdkafka knows now and no more."""
        try:
            stats = json.loads(raw)
        except ValueError:
            return
        if not isinstance(stats, dict):
            return
        self._group.observe(stats, time.monotonic())
        self._stable = stable_offsets(stats)

    def _check_group(self) -> None:
        """A worker cut off from its group (no answer from the coordinator for longer than
        the grace) stops consuming what it owns: the partitions are suspended, their
        buffered records dropped; they are taken back once the group is up and Kafka still
        assigns them here (with the KIP-848 protocol librdkafka would otherwise keep them
        until the link returns, while the broker has given them to another worker)."""
        away = self._group.suspect()
        gone = self.ledger.suspend_all(time.monotonic()) if away else []
        if gone:
            self._drop_buffered(set(gone))
            self._metrics.assigned.set(len(self.ledger.owned()))
            log.error(
                "cut off from the consumer group (state %s for over %.0fs): not consuming %s "
                "until the group is up again",
                self._group.state,
                self._group.grace_s,
                [p for _, p in gone],
            )
        if self._away and not away:
            log.warning("the consumer group is up again")
        self._away = away

    def _check_database(self, consumer: Consumer) -> None:
        """Leave the consumer group when this worker has been unable to connect to
        PostgreSQL for its pending work (a batch in flight, a claim) for longer than
        ``db_leave_after_s``, or for its assign callback's claim that long; join again
        once every connection of the worker answers.

        A worker whose own link to PostgreSQL is down (a partition between its host and
        the database, a route, a firewall) otherwise kept its partitions for as long as
        the link was: Kafka saw a live member, and no worker that can write took them.
        Order of effects of a leave: the before_leave point; unsubscribe (the revoke
        callback, served at the next poll, lets the batches in flight run out
        ``revoke_wait_s``, cancels them and gives the partitions up without asking
        PostgreSQL: :meth:`_release`); once no write is in flight, a probe of each of its
        connections starts on the loop, retried through the outage; once they all answer
        and the revoke has left nothing assigned, the worker subscribes again and claims
        what Kafka assigns it (:meth:`_rejoin`). A crash at any step loses
        nothing: the DB offsets stand where the last committed batch left them, and a
        write that lands late is fenced by the next owner's claim.
        """
        if self._left:
            self._rejoin(consumer)
            return
        away = max(self._db_failing_for(), self._claim_away if self._leave_due else 0.0)
        if not self._leave_due and not 0 < self.cfg.db_leave_after_s < away:
            return
        self._leave_due, self._left = False, True
        self._metrics.out_of_group.set(1)
        log.error(
            "cannot connect to PostgreSQL for %.0fs (ACKLINE_DB_LEAVE_AFTER_S=%g): "
            "leaving the consumer group so that workers that can write take partitions %s; "
            "joining again once PostgreSQL answers",
            away,
            self.cfg.db_leave_after_s,
            sorted(p for _, p in self.ledger.tracked()),
        )
        self._faults.hit("before_leave")
        consumer.unsubscribe()

    def _rejoin(self, consumer: Consumer) -> None:
        """Out of the group: once the revoke has ended every write in flight (one
        connection serves one statement), probe every connection of the worker; once they
        all answer and nothing is assigned any more, subscribe again.

        Nothing assigned: librdkafka (classic protocol) postpones an unsubscribe made
        during a rebalance until the rebalance's assignment operations are done, and a
        subscribe clears a postponed unsubscribe (rd_kafka_cgrp_subscribe). A subscribe
        before the leave's revoke then cancelled the leave: what was assigned while out
        of the group (not claimed: :meth:`_on_assign`; confluent-kafka assigns it
        itself) stayed assigned, never claimed, its records dropped: a stall (the DB
        offsets stand) until a later rebalance moved them. The wait lasts as long as
        those operations (an offset fetch the broker answers "unstable" while a
        transaction holds the group's offsets); a probe that answered before it ended is
        asked again, as PostgreSQL may have gone again meanwhile."""
        if self._probe is None:
            if any(slot.inflight is not None for slot in self._slots):
                return
            writers = [slot.writer.probe for slot in self._slots]
            self._probe = self._claims.probe_later(writers)
            return
        if not self._probe.done():
            return
        now = time.monotonic()
        if consumer.assignment():  # the leave's revoke is still to come (_out_of_group)
            if self._rejoin_waits is None or now - self._rejoin_waits >= _REJOIN_WAIT_LOG_S:
                log.warning(
                    "PostgreSQL answers again: joining the consumer group once the leave "
                    "has revoked partitions %s%s",
                    sorted(p.partition for p in consumer.assignment()),
                    "" if self._rejoin_waits is None else " (still waiting)",
                )
                self._rejoin_waits = now
            return
        probe, self._probe = self._probe, None
        if not probe.cancelled():
            probe.result()  # retried through outages: what is left is fatal
        if self._rejoin_waits is not None:  # the answer may be old now: ask again
            self._rejoin_waits = None
            return
        log.warning("PostgreSQL answers again: joining the consumer group again")
        self._left = self._away = self._leave_due = False
        self._metrics.out_of_group.set(0)
        self._group = GroupWatch(grace_s=self._group.grace_s)
        self._subscribe(consumer)

    def _db_failing_for(self) -> float:
        """How long this worker has been unable to connect to PostgreSQL for the work it
        waits on: a batch in flight (its writer's connection) or a retake claim under way
        (the control connection), each counted from when that work started at the
        earliest. Only failures to connect count (a connect, or the new connection's first
        read, that gets no answer or is refused: :meth:`Database.get`): a server that
        answers (a lock wait, a statement timeout, a full disk) answers every worker
        alike, and leaving would only bring the worker back, to wait again."""
        now = time.monotonic()
        pending = [
            (s.writer.unreachable_since, s.started) for s in self._slots if s.inflight is not None
        ]
        if self._retaking is not None and not self._retaking.done():
            pending.append((self._control_db.unreachable_since, self._retaking_started))
        return max((_failing(since, start, now) for since, start in pending), default=0.0)

    def _claim_overdue(self, start: float) -> bool:
        """The assign callback's claim, started at ``start``, gives up: it has been unable
        to connect to PostgreSQL for longer than ``db_leave_after_s`` (librdkafka does not
        apply ``max.poll.interval.ms`` while a callback runs, so nothing else would end
        it)."""
        failing = _failing(self._control_db.unreachable_since, start, time.monotonic())
        return 0 < self.cfg.db_leave_after_s < failing

    def _retake(self, consumer: Consumer) -> None:
        """Take back the suspended partitions that Kafka still assigns to this worker
        (fenced, cut off from the group, or kept through a rebalance by a batch that did
        not commit: :meth:`_not_committed`).

        Kafka, not PostgreSQL, decides who owns a partition: an epoch that moved while
        Kafka still assigns the partition here means someone claimed it late (a worker that
        resumed inside its assign callback after this one claimed). Order of effects: a
        new claim (one autocommitted statement, bumping the epoch: the late claimer's next
        batch is fenced), started on the loop and not waited for: the thread goes on
        polling, so a rebalance that needs this worker is not held while PostgreSQL is
        away; once the claim has answered, the ledger renews ownership with the rewind
        mark kept, and the partitions are sought to the DB next offset. A partition
        released or claimed afresh meanwhile is left alone (:meth:`Ledger.retake`); the
        late claim only raised its epoch, which the next claim raises again. Retakes back
        off (doubling) when fenced again soon, so two workers that both believe they own
        a partition cannot spin; meanwhile the partition counts as not consumed (gauge,
        /readyz). Fenced partitions Kafka no longer assigns here are released.
        """
        if self._retaking is not None:
            if not self._retaking.done():
                return
            future, self._retaking, self._retaking_tps = self._retaking, None, set()
            if future.cancelled():
                return
            claims = future.result()  # retried through outages: what is left is fatal
            if self._away:  # cut off meanwhile: they stay suspended until the group is up
                return
            rewinds = [r for r in map(self.ledger.retake, claims) if r is not None]
            self._seek(rewinds)
            self._metrics.assigned.set(len(self.ledger.owned()))
            if rewinds:
                log.warning(
                    "claimed %s again", [(r.tp[1], self.ledger.epoch(r.tp)) for r in rewinds]
                )
            return
        due = self.ledger.retakes_due(time.monotonic())
        if not due or self._away:
            return
        assigned = {_tp_of(p) for p in consumer.assignment()}
        self.ledger.release([tp for tp in due if tp not in assigned])
        wanted = [tp for tp in due if tp in assigned]
        if wanted:
            self._retaking, self._retaking_tps = self._claims.claim_later(wanted), set(wanted)
            self._retaking_started = time.monotonic()

    def _seek(self, rewinds: list[Rewind]) -> None:
        consumer = self._consumer
        for r in rewinds:
            where = r.offset if r.offset is not None else OFFSET_BEGINNING
            if consumer is not None:  # raises if it cannot: a crash re-reads too
                consumer.seek(TopicPartition(r.tp[0], r.tp[1], where))

    # ---- rebalance -------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Claim the partitions in PostgreSQL, then assign them from the DB offsets.

        Order of effects: read where a partition that has no DB offset yet starts (the log
        start, or for start_from=latest the last stable offset: where a read_committed
        reader reaching the end stands) and the log ends; claim: one
        autocommitted statement bumps the epochs and stores that start where no offset is
        stored, so "latest" is resolved once, for good (retried while PostgreSQL is
        unreachable, until a stop request or, past ``db_leave_after_s`` without a
        connection, given up: the worker then leaves the group, :meth:`_check_database`;
        out of the group it claims nothing; a retake claim still running on the control
        connection is abandoned first, and started again after the callback:
        :meth:`_retake`); the after_claim point;
        incremental_assign at the DB next offsets. A partition whose DB offset is past
        the log end is assigned but paused and reported (it is not consumed: its records
        would be taken for committed ones). A crash after the claim and before the assign
        leaves only a higher epoch, which the next owner bumps again.
        """
        self._refused.joined()  # in the group: a streak from before it ends
        self._refused_line = None
        if not partitions:
            return
        if self._left:  # a rebalance under way when it left: the leave revokes them next
            log.info("out of the group: not claiming %s", [tp.partition for tp in partitions])
            return
        tps = [_tp_of(tp) for tp in partitions]
        marks = watermarks(consumer, tps, _WATERMARK_TIMEOUT_S)
        if self.cfg.start_from == "latest":
            starts, why = stable_ends_and_why(self._admin(), tps, _WATERMARK_TIMEOUT_S)
            if unknown := [p for tp in tps if tp not in starts for p in tp[1:]]:
                log.warning(
                    "no end offset for partitions %s (%s): where no offset is stored they "
                    "start at the log start, not at the latest",
                    unknown,
                    "; ".join(sorted(set(why.values()))) or "no answer",
                )
        else:
            starts = {tp: low for tp, (low, _) in marks.items()}
        if self._retaking is not None and not self._retaking.done():
            # One claim at a time on the control connection: this one waited for a retake
            # still retrying (behind a row lock it may not end, or an outage), and the
            # rebalance with it. The retake is claimed again after the callback.
            again = sorted(p for _, p in self._retaking_tps)
            log.info("a retake claim of %s waits: claiming them again after the assign", again)
            self._abandon_retake()
        start = time.monotonic()
        claims = self._claims.claim(tps, starts, give_up=lambda: self._claim_overdue(start))
        if claims is None:  # stopping, or PostgreSQL away: leave (the client assigns them
            self._leave_due = not self._stop.is_set()  # itself, unowned: records dropped)
            self._claim_away = _failing(self._control_db.unreachable_since, start, time.monotonic())
            return
        self._faults.hit("after_claim")
        self.ledger.claimed(claims)
        assign, blocked = [], []
        for c in sorted(claims, key=lambda c: (c.topic, c.partition)):
            tp = (c.topic, c.partition)
            self._slot_map.of(tp)  # spread over the slots in partition order
            offset = c.next_offset if c.next_offset is not None else OFFSET_BEGINNING
            assign.append(TopicPartition(c.topic, c.partition, offset))
            high = marks.get(tp, (0, -1))[1]
            if c.next_offset is None or c.next_offset == 0 or high >= c.next_offset:
                continue  # nothing stored, nothing to be past, or the end reached it
            # past the log end, or the end unknown (it may be past it: held until read)
            blocked.append(tp)
            reason = (
                past_log_end(tp, c.next_offset, high)
                if high >= 0
                else log_end_unknown(tp, c.next_offset)
            )
            if self.ledger.block(tp, reason):
                log.log(logging.ERROR if high >= 0 else logging.WARNING, "%s", reason)
        consumer.incremental_assign(assign)
        if blocked:
            consumer.pause([TopicPartition(t, p) for t, p in blocked])
        # New partitions are not paused here even when the kept ones are: a pause right
        # after the assign can make librdkafka drop the assign offset (its issue #2190) and
        # leave the partition unfetched. Until the next pause they only fill librdkafka's
        # prefetch queue, which queued.max.messages.kbytes bounds. A blocked partition is
        # paused anyway: it is sought again before it resumes (_report).
        self._metrics.assigned.set(len(self.ledger.owned()))
        log.info("assigned %s", [(c.partition, c.next_offset, c.epoch) for c in claims])

    def _admin(self) -> AdminClient:
        if self._admin_client is None:
            self._admin_client = admin(self.cfg.bootstrap, dict(self.cfg.kafka_extra))
        return self._admin_client

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Stop dispatching (we are inside consume), let every batch in flight finish or
        roll back (a batch of kept partitions too: simpler, and a revoke is rare), drop
        buffered records of the revoked partitions, then unassign them."""
        self._release(consumer, partitions, lost=False)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """As revoke; a batch in flight of the lost partitions is likely fenced by the new
        owner's claim."""
        self._release(consumer, partitions, lost=True)

    def _release(self, consumer: Consumer, partitions: list[TopicPartition], lost: bool) -> None:
        """Give up ``partitions`` inside a rebalance callback.

        Order of effects: let every batch in flight finish or, past ``revoke_wait_s``,
        cancel it (a batch that did not commit leaves its partitions to this release or,
        kept ones, to a claim after the callback: :meth:`_not_committed`; nothing here
        waits for PostgreSQL); forget the partitions (ledger, buffers, slots); resume and
        unassign them in Kafka. A crash at any step loses nothing: their DB offsets stand
        where the last committed batch left them, and their next owner starts there.
        """
        tps = [_tp_of(tp) for tp in partitions]
        if self._writing():
            for slot in self._slots:
                if slot.batch is not None:
                    log.info(
                        "%s with batch %s in flight: letting it finish",
                        "lost" if lost else "revoked",
                        slot.batch.describe(),
                    )
            self._faults.hit("lost_in_flight" if lost else "revoke_in_flight")
            self._releasing = frozenset(tps)
            try:
                self._settle(self.cfg.revoke_wait_s)
            finally:
                self._releasing = None
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
        except KafkaException as exc:  # what stays assigned also holds a leave's rejoin back
            log.warning("unassign of %s failed: %s", [p for _, p in tps], exc)
        # The partitions kept stay paused if they were (pausing is per partition).
        log.info("%s %s", "lost" if lost else "revoked", [p for _, p in tps])

    def _forget(self, tps: Collection[TP]) -> None:
        """Give up ``tps``; called with nothing of them in flight (:meth:`_release` settles
        first; :meth:`_not_committed` after their batch ended), so once their buffered
        records are dropped they may change slots."""
        gone = set(tps)
        if self._retaking_tps & gone:
            # A claim still retrying must not land on them after their next owner's: it
            # would fence that owner's batches.
            self._abandon_retake()
        if self._decode_at:
            self._decode_at = {c for c in self._decode_at if (c[0], c[1]) not in gone}
        self.ledger.release(gone)
        self._watch.forget(gone)
        self._drop_buffered(gone)
        self._slot_map.release(gone)
        self._metrics.assigned.set(len(self.ledger.owned()))

    def _abandon_retake(self) -> None:
        """Cancel the retake claim under way, whole: one that lands anyway only raises
        epochs, which the next claim raises again; the partitions still suspended here
        are due, and the next turn claims them again."""
        if self._retaking is not None:
            self._retaking.cancel()
        self._retaking, self._retaking_tps = None, set()

    def _drop_buffered(self, gone: set[TP]) -> None:
        """Drop the buffered, decoded and held records of ``gone`` (they are read again)."""
        resume = [TopicPartition(*tp) for tp in gone if self._holds.is_held(tp)]
        self._holds.forget(gone)
        self._metrics.held.set(len(self._holds.held))
        if resume and self._consumer is not None and not self._paused:
            self._consumer.resume(resume)  # a hold had paused them
        for slot in self._slots:
            slot.drop(gone)

    # ---- flow control, lag and partitions not consumed ---------------------------------

    def _pause(self, consumer: Consumer, full: Slot) -> None:
        if not self._paused:
            assignment = consumer.assignment()
            consumer.pause(assignment)
            self._paused = True
            log.info(
                "paused %s: a buffer is full and its write in flight has taken %.1fs",
                sorted(p.partition for p in assignment),
                time.monotonic() - full.started,
            )

    def _resume(self, consumer: Consumer) -> None:
        if self._paused:
            keep = set(self._holds.held) | set(self.ledger.blocked())  # paused until their end
            consumer.resume([p for p in consumer.assignment() if _tp_of(p) not in keep])
            self._paused = False

    def _report(self, consumer: Consumer) -> None:
        """Set the lag gauges and the not-consumed gauge; unblock what caught up; move a
        re-read whose range retention deleted to the log start."""
        self._past_retention(consumer)
        pending = {r.tp for s in self._slots for r in s.buffer} | set(self._holds.held)
        for slot in self._slots:
            if slot.batch is not None:
                pending |= {(r.topic, r.partition) for r in slot.batch.ranges}
        blocked = self.ledger.blocked()
        self._held_release.keep_only(blocked)
        owned = self.ledger.tracked()  # lag is reported for suspended and blocked ones too
        try:
            asked = [TopicPartition(*tp) for tp in owned]
            positions = {_tp_of(p): p.offset for p in consumer.position(asked)}
        except KafkaException:
            positions = {}
        held = self._held_ends(sorted(tp for tp in owned if tp in blocked))
        for tp in owned:
            if tp in blocked:
                if tp not in held:
                    continue
                end = held[tp]  # the last stable offset
            else:
                # the last stable offset, not the high watermark: a read_committed reader
                # is not behind on a transaction still open upstream (streams.lag)
                end = self._stable.get(tp, -1)
            db_next = self.ledger.db_next(tp)
            if tp in blocked and db_next is not None and end >= db_next:
                if self._held_release.may_release(tp):
                    self._unblock(consumer, tp)
            elif (
                tp in blocked
                and db_next is not None
                and end >= 0
                and blocked[tp] == log_end_unknown(tp, db_next)
            ):
                reason = past_log_end(tp, db_next, end)  # the end is known now: past it
                self.ledger.block(tp, reason)
                log.error("%s", reason)
            if end >= 0:
                position = positions.get(tp)
                self._watch.lag(tp, partition_lag(end, db_next, position, tp in pending))
        assigned = [_tp_of(p) for p in consumer.assignment()]
        self._watch.not_consumed(assigned, self.ledger.owned())
        self._metrics.note_behind(time.time())

    def _held_ends(self, held: list[TP]) -> dict[TP, int]:
        """The last stable offsets of the ``held`` partitions that answer within
        :data:`_HELD_READ_BUDGET_S`, all in one read_committed request on the admin
        client's connection. Asked of the consumer, each partition's watermarks waited
        behind its own long-poll fetch (``fetch.wait.max.ms``) one after another: about two
        held partitions a report, so the last of twelve whose log end reached its DB offset
        was released half a minute after the first."""
        return stable_ends(self._admin(), held, _HELD_READ_BUDGET_S) if held else {}

    def _past_retention(self, consumer: Consumer) -> None:
        """A partition re-read after a rewind whose mark retention deleted (its log start
        past the mark: Kafka reset the position there, and every record would be refused
        as fetched before the seek back) is re-read from the log start
        (:meth:`Ledger.past_retention`: librdkafka drops what was fetched before the
        seek); the first record's admission counts and logs the offsets retention took.
        Only once the read has passed the mark (its position beyond it): until then the
        re-read's records at or below it may still be queued in librdkafka, which the
        seek would drop. Marks last from a seek back to its first record: this looks at
        none almost always."""
        for tp, mark in self.ledger.marks().items():
            low = log_start(consumer, tp)
            if low is None or low <= mark:
                continue
            try:  # the read passed the mark: a record above it was delivered (and refused)
                (at,) = consumer.position([TopicPartition(*tp)])
            except KafkaException:
                continue
            if at.offset <= mark:  # INVALID (negative) until one is: N..M may be queued
                continue
            rewind = self.ledger.past_retention(tp, low)
            if rewind is None:
                continue
            self._drop_buffered({tp})
            self._seek([rewind])
            log.error(
                "%s[%d]: retention deleted the re-read (the log starts at %d, past %d, the "
                "highest offset fetched before it): re-reading from the log start",
                tp[0],
                tp[1],
                low,
                mark,
            )

    def _unblock(self, consumer: Consumer, tp: TP) -> None:
        db_next = self.ledger.unblock(tp).offset
        if db_next is not None:
            consumer.seek(TopicPartition(tp[0], tp[1], db_next))
        if not self._paused:
            consumer.resume([TopicPartition(*tp)])
        log.warning("%s[%d]: the log end reached the DB offset %d again: consuming", *tp, db_next)


def _failing(since: float | None, start: float, now: float) -> float:
    """Seconds a piece of work started at ``start`` has been failing, given its
    connection's run of failures began at ``since`` (None: not failing)."""
    return 0.0 if since is None else now - max(since, start)


def _tp_of(tp: Any) -> TP:
    return (tp.topic, tp.partition)
