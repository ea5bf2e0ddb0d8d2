"""The agent body: take a batch from the stream, write it, then ack it — in that order.

One agent instance (concurrency 1) consumes every partition of the topic, so at most one
batch is in flight and each partition's records are written and acked in offset order.
The stream is ``noack()`` and batches come from
:func:`~ackline.streams.faust_runtime.bytebound.take_batches` (faust's ``noack_take``,
which does not ack in a ``finally`` as ``take()`` does even when the body raised, with
a byte bound).

Failure policy, crash-only: a batch that fails for any reason but fencing is never
acked; the process logs the error and exits at once with ``os._exit`` (no graceful
stop, no commit, no ack), and the next start resumes from the PostgreSQL offsets.
A batch fenced on some of its partitions rolled back on all of them: the fenced ones are
suspended (and taken back while Kafka still assigns them here), the others are re-read
from their DB offsets (the ledger refuses what was fetched before that seek), so nothing
after the dropped batch can commit past it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ackline.core.faults import DISARMED, Faults
from ackline.core.logs import die, refuse
from ackline.core.metrics import Metrics
from ackline.schemas.decode import Limits
from ackline.sinks.connection import Database
from ackline.sinks.errors import FencedError, MigrationError
from ackline.sinks.ingest.batch import TP, Batch
from ackline.sinks.ingest.offsets import Claim, claim_over, locked_offsets
from ackline.sinks.ingest.writer import BatchWriter, WriteResult
from ackline.streams.assemble import Draft, Record, draft_batch, headers_of
from ackline.streams.committed import record_committed
from ackline.streams.deadletter import DeadLetterProducer
from ackline.streams.faust_runtime.bytebound import take_batches
from ackline.streams.lag import retention_gap
from ackline.streams.ownership import Ledger, past_log_end

log = logging.getLogger(__name__)


@dataclass
class KafkaSide:
    """What the sink needs of the faust consumer: its assignment, and seeking."""

    assigned: Callable[[], set[TP]]
    seek: Callable[[Mapping[TP, int | None]], Awaitable[None]]


async def _no_seek(offsets: Mapping[TP, int | None]) -> None:
    raise RuntimeError("the sink is not connected to a consumer")


NO_KAFKA = KafkaSide(assigned=set, seek=_no_seek)


class FaustSink:
    """Owns the ledger, claims partitions and writes batches for one faust worker."""

    def __init__(
        self,
        *,
        group_id: str,
        worker_id: str,
        control_db: Database,
        writer: BatchWriter,
        dead_letters: DeadLetterProducer,
        metrics: Metrics,
        limits: Limits,
        batch_max_events: int,
        batch_max_ms: int,
        batch_max_bytes: int = 8 * 1_048_576,
        faults: Faults = DISARMED,
        claim_deadline_s: float = 60.0,
        revoke_wait_s: float = 20.0,
    ) -> None:
        self.ledger = Ledger()
        self.kafka = NO_KAFKA  # set by make_app once the app exists
        self.claim_deadline_s = claim_deadline_s
        self._group = group_id
        self._worker = worker_id
        self._control_db = control_db
        # one connection: an assignment's claim, a timer's retake and the agent's re-read
        # after a dropped batch must not overlap on it (asyncpg: "another operation is in
        # progress", which is not transient, so the claim would end the worker)
        self._control_lock = asyncio.Lock()
        self._writer = writer
        # whether a batch taken now may be written (the topic's incarnation settled:
        # ackline.runtime.incarnation_watch); None, always. Set by make_app, which has
        # the app whose stop ends the wait.
        self.settled: Callable[[], Awaitable[bool]] | None = None
        self._dlq = dead_letters
        self._metrics = metrics
        self._limits = limits
        self.batch_max_events = batch_max_events
        self.batch_max_s = batch_max_ms / 1000
        self.batch_max_bytes = batch_max_bytes
        self._faults = faults
        self.committed_batches = 0
        self._gaps: dict[TP, int] = {}  # partition -> DB offset whose retention gap was counted
        self.records_taken = 0  # records handed to handle(), for the drain check
        self.idle = True  # no batch between take and ack
        self.revoke_wait_s = revoke_wait_s
        self._writing: asyncio.Future[list[WriteResult]] | None = None  # handle() in flight
        self._revoke_overdue = False  # a revoke outlasted revoke_wait_s and goes on
        self._cut = False  # _cut_off cancelled the write in flight
        # Set to make the take yield what it has gathered (take_batches' flush): a revoke
        # waits for those events too. Made lazily: an asyncio.Event binds to its loop.
        self._flush: asyncio.Event | None = None
        # Set when a graceful stop starts; read by the dead-letter retries, which run in an
        # executor thread that cancelling the agent cannot end.
        self._stop = threading.Event()

    # ---- assignment ------------------------------------------------------------------

    async def claim(
        self,
        partitions: list[TP],
        generation: int,
        marks: Mapping[TP, tuple[int, int]],
        start_from: str,
    ) -> None:
        """Take ``partitions`` in PostgreSQL for consumer ``generation``.

        Order of effects: one autocommitted claim statement bumps every epoch and stores,
        where no offset is stored yet, where the partition starts (its log start, or its
        end for start_from=latest, from ``marks``: (start, end) per partition), so
        "latest" is resolved once, for good (retried while PostgreSQL is unreachable, for
        at most ``claim_deadline_s``, then the process exits: faust would otherwise
        abandon the seek and stop recovering); the after_claim point; the ledger replaces
        its ownership, blocking a partition whose DB offset is past the log end. The
        caller then seeks to the DB offsets. A DB offset below the log start is counted
        and logged as offsets retention deleted before this group read them, once per
        process and DB offset (a claim again before a batch commits there, at the next
        rebalance, counts nothing; another worker, or this one restarted, counts again,
        as the default runtime does at its first record). A crash after the claim leaves
        higher epochs that nobody holds: the next claim bumps them again.
        """
        pick = 1 if start_from == "latest" else 0
        starts = {tp: m[pick] for tp, m in marks.items()}
        try:
            async with asyncio.timeout(self.claim_deadline_s):  # not wait_for: see _open
                claims = await self._claim(partitions, starts)
            await self._faults.ahit("after_claim")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            die("claiming partitions failed", exc)
        self.ledger.claimed(claims, generation, replace=True)
        for c in claims:
            tp = (c.topic, c.partition)
            start, end = marks.get(tp, (0, -1))
            if c.next_offset is not None and 0 <= end < c.next_offset:
                reason = past_log_end(tp, c.next_offset, end)
                if self.ledger.block(tp, reason):
                    log.error("%s", reason)
            elif c.next_offset is not None:
                self._count_gap(tp, c.next_offset, start)
        self._metrics.assigned.set(len(self.ledger.owned()))
        log.info(
            "assigned (generation %d) %s",
            generation,
            [(c.partition, c.next_offset, c.epoch) for c in claims],
        )

    def _count_gap(self, tp: TP, next_offset: int, start: int) -> None:
        """Count the offsets retention deleted below ``start``, the log start, past the DB
        offset ``next_offset`` (aiokafka resets such a position to the log start), once
        per process and DB offset."""
        if self._gaps.get(tp) != next_offset and retention_gap(
            self._metrics, tp, next_offset, start, start
        ):
            self._gaps[tp] = next_offset

    async def _claim(self, partitions: list[TP], starts: Mapping[TP, int] | None) -> list[Claim]:
        async with self._control_lock:
            return await self._claim_unlocked(partitions, starts)

    async def _claim_unlocked(
        self, partitions: list[TP], starts: Mapping[TP, int] | None
    ) -> list[Claim]:
        return await claim_over(self._control_db, self._group, self._worker, partitions, starts)

    async def retake(self) -> None:
        """Take back the fenced partitions that Kafka still assigns to this worker.

        Kafka, not PostgreSQL, decides who owns a partition: an epoch that moved while
        Kafka still assigns the partition here means someone claimed it late. Order of
        effects: a new claim (the late claimer's next batch is fenced); the ledger owns
        the partition again with its rewind mark kept (records fetched before the seek
        back are refused); seek to the DB next offset. Retakes back off when fenced again
        soon (the ledger's doubling wait); fenced partitions Kafka no longer assigns here
        are released.
        """
        async with self._control_lock:  # what is due, its claim and the ledger: one step
            due = self.ledger.retakes_due(time.monotonic())
            if not due:
                return
            assigned = self.kafka.assigned()
            self.ledger.release([tp for tp in due if tp not in assigned])
            wanted = [tp for tp in due if tp in assigned]
            if not wanted:
                return
            claims = await self._claim_unlocked(wanted, None)
            rewinds = [r for r in map(self.ledger.retake, claims) if r is not None]
        await self.kafka.seek({r.tp: r.offset for r in rewinds})
        self._metrics.assigned.set(len(self.ledger.owned()))
        if rewinds:
            log.warning("took back %s after a fence", [(r.tp[1], r.offset) for r in rewinds])

    @contextlib.asynccontextmanager
    async def revoking(self) -> AsyncIterator[None]:
        """Around faust's revoke, which waits for every taken event to be acked: bound
        that wait by ``revoke_wait_s``, as the default runtime bounds its revoke.

        Order of effects: the revoke_in_flight point when a batch is in flight; faust's
        revoke runs (the body); if it has not ended after ``revoke_wait_s``, the write in
        flight is cancelled and any batch taken until the revoke ends is not written
        (:meth:`_cut_off`); each such batch's events are acked for faust's in-flight
        tracking only (no offset moves), so faust's wait ends and the partitions are
        handed over. The cancelled writer drops its connection: the server rolls back
        what had not committed, and a COMMIT it had already received commits or not on its
        own, holding the offset rows' locks until then, so the next claim (here or in
        another worker) reads the offsets that outcome left and bumps the epochs, and a
        write of the old claim fails the epoch CAS. A crash at any step leaves the DB
        offsets where the last COMMIT put them; the next owner reads on from there.
        """
        if not self.idle:
            await self._faults.ahit("revoke_in_flight")
        if self._flush is not None:
            self._flush.set()  # what the take has gathered is written now, not at batch_max_ms
        timer = asyncio.get_running_loop().call_later(self.revoke_wait_s, self._cut_off)
        try:
            yield
        finally:
            timer.cancel()
            self._revoke_overdue = False

    def _cut_off(self) -> None:
        """The revoke outlasted ``revoke_wait_s``: cancel the write in flight, if any, and
        write no batch until the revoke ends."""
        self._revoke_overdue = True
        if self._flush is not None:
            self._flush.set()  # gathered since: taken now, and not written
        if self._writing is not None and not self._writing.done():
            self._cut = True
            log.warning(
                "a revoke waited %g s for the batch in flight: cancelling it; the DB "
                "offsets decide where its partitions resume",
                self.revoke_wait_s,
            )
            self._writing.cancel()

    async def stopping(self) -> None:
        """A graceful stop starts: dead-lettering gives up its retries (the batch waiting
        on it fails, nothing of it committed or acked: crash-only), then the shutdown
        point (the batch in flight not finished)."""
        self._stop.set()
        await self._faults.ahit("shutdown")

    # ---- the agent -------------------------------------------------------------------

    async def consume(self, stream: Any) -> None:
        """The agent body. ``stream`` is the faust stream of the topic (raw values).

        Order of effects per batch: the take yields the events (nothing acked);
        :meth:`handle` writes them (dead letters, then the PostgreSQL transaction); only
        then each event is acked, in delivery order (an ack marks it done for faust's
        in-flight tracking and moves no offset). A crash before the COMMIT: nothing moved,
        the events are re-read from the DB offset. A crash after it and before the acks:
        the DB offset is already past them, so they are not written again. Any failure
        but fencing exits the process here without acking (:func:`die`). A batch that a
        revoke past ``revoke_wait_s`` cancelled, or took while overdue, is acked without
        being written (:meth:`revoking`): acks move no offset, and its partitions are
        claimed again from their DB offsets before any record of them is taken.
        """
        events_stream = stream.noack()
        self._flush = asyncio.Event()
        try:
            async for events in take_batches(
                events_stream,
                self.batch_max_events,
                self.batch_max_bytes,
                self.batch_max_s,
                flush=self._flush,
            ):
                self.idle = False
                await self._write_unless_cut_off(events)
                for event in events:  # after the DB commit, in delivery (offset) order
                    await events_stream.ack(event)
                self.idle = True
        except asyncio.CancelledError:
            raise
        except MigrationError as exc:  # the default runtime's one line and status
            refuse(str(exc))
        except BaseException as exc:
            die("the batch failed", exc)

    async def _write_unless_cut_off(self, events: Sequence[Any]) -> None:
        """:meth:`handle` in a task of its own, which an overdue revoke may cancel (an
        exception from it, or a cancellation of the agent itself, propagates).

        Order of effects for a batch cancelled or not written: the ledger stops owning
        its partitions (the revoke releases them all anyway: faust revokes everything),
        so nothing after the unwritten records can be admitted until a claim has read the
        DB offsets again and sought there; then the caller acks. A crash at any step: the
        DB offsets decide where the partitions resume."""
        if self._revoke_overdue:
            self._unwritten(events, "taken while a revoke was overdue")
            return
        self._writing = asyncio.ensure_future(self.handle(events))
        try:
            await self._writing
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the agent itself is cancelled (a stop)
            if not self._cut:  # nobody here cancelled it: the batch's outcome is unknown
                die("the batch's write was cancelled", exc)
            self._unwritten(events, "cancelled by the revoke")
        finally:
            self._writing, self._cut = None, False

    def _unwritten(self, events: Sequence[Any], why: str) -> None:
        tps = sorted({(e.message.topic, e.message.partition) for e in events})
        self.ledger.release(tps)
        log.warning("a batch of %d records %s, not written; released %s", len(events), why, tps)

    def _unwritten_batch(self, batch: Batch, why: str) -> None:
        tps = sorted({(r.topic, r.partition) for r in batch.ranges})
        self.ledger.release(tps)
        log.warning("batch %s %s, not written; released %s", batch.describe(), why, tps)

    async def handle(self, events: Sequence[Any]) -> list[WriteResult]:
        """Draft, dead-letter and write the records of ``events``, in chunks of at most
        ``batch_max_bytes`` (one transaction each); return what committed.

        Order of effects per chunk: after_fetch point; draft (pure: the ledger picks the
        records, ackline decodes them); the dead-letter records produced and acknowledged
        by Kafka; the PostgreSQL transaction (fence CAS first); after_commit point; the
        ledger's DB offsets advance; metrics. The caller acks only after this returns.
        A crash anywhere before a COMMIT changes no offset; after it, the restart resumes
        past that chunk (the DB offset), and a repeat of the dead-letter records is
        possible, never a loss. A fenced chunk re-positions its partitions
        (:meth:`_not_committed`); the records after it that the ledger refuses are read
        again from the DB offsets.
        """
        self.records_taken += len(events)
        results = []
        for chunk in chunks([_record(e) for e in events], self.batch_max_bytes):
            result = await self._write(chunk)
            if result is not None:
                results.append(result)
        return results

    async def _write(self, records: list[Record]) -> WriteResult | None:
        await self._faults.ahit("after_fetch")
        draft = draft_batch(records, self.ledger, self._limits)
        if draft.dropped:
            log.info("dropped %s records not owned by this claim", dict(draft.dropped))
        if draft.empty:
            return None
        if draft.poison:
            await self._dead_letter(draft)
        if self.settled is not None and not await self.settled():
            # another incarnation (the worker is stopping: these records may be the new
            # topic's at the old offsets), or a stop while the topic is gone: not written,
            # the partitions given up (the ledger refuses their later records); the
            # events are acked unwritten, so faust's stop, which waits for them, goes on
            self._unwritten_batch(draft.batch, "taken while the topic was gone or made again")
            return None
        started = time.monotonic()
        try:
            result = await self._writer.write(draft.batch)
        except FencedError as exc:
            self._metrics.fenced.inc()
            log.error("batch %s %s: %s", draft.batch.describe(), exc.verdict, exc)
            await self._not_committed(draft.batch)
            return None
        await self._faults.ahit("after_commit")
        record_committed(
            self.ledger, self._metrics, draft.batch, result, time.monotonic() - started
        )
        self.committed_batches += 1
        return result

    async def _not_committed(self, batch: Batch) -> None:
        """Re-position the partitions of a batch that did not commit.

        Order of effects: the before_reread point; read its offset rows FOR SHARE (the
        rolled-back transaction has ended); the ledger suspends the partitions whose epoch
        moved and rewinds the others to their DB next offsets (records fetched before the
        seek back are refused from now on); seek those; take back the fenced ones Kafka
        still assigns here.
        """
        await self._faults.ahit("before_reread")
        tps = [(r.topic, r.partition) for r in batch.ranges]
        async with self._control_lock:
            rows = await self._control_db.retrying(
                "re-read", lambda conn: locked_offsets(conn, self._group, tps)
            )
        fenced, rewinds = self.ledger.not_committed(
            batch.ranges, {(c.topic, c.partition): c for c in rows}, time.monotonic()
        )
        if rewinds:
            await self.kafka.seek({r.tp: r.offset for r in rewinds})
            log.warning(
                "re-reading %s from their DB offsets after batch %s was dropped",
                [(r.tp[1], r.offset) for r in rewinds],
                batch.describe(),
            )
        self._metrics.assigned.set(len(self.ledger.owned()))
        if fenced:
            await self.retake()

    async def _dead_letter(self, draft: Draft) -> None:
        """Produce the draft's poison and wait for every acknowledgement (in a thread:
        the producer blocks). A dead-letter topic that cannot be written is retried until
        a stop; then ProduceError, and :meth:`consume` exits without acking. Without the
        stop signal the thread retried forever and Python, which waits for it at exit,
        never ended."""
        await self._faults.ahit("before_dlq")
        loop = asyncio.get_running_loop()
        # The thread ends at a stop, or when the write that waits for it is cancelled (a
        # revoke's cut-off): left running, it retried on beside the next owner's sends,
        # on the same producer, and each revoke of an outage added one to the executor.
        abandoned = threading.Event()
        send = functools.partial(
            self._dlq.send_all,
            draft.poison,
            should_stop=lambda: self._stop.is_set() or abandoned.is_set(),
        )
        try:
            draft.batch.rejects = await loop.run_in_executor(None, send)
        except asyncio.CancelledError:
            abandoned.set()
            raise
        self._metrics.dead_letters.inc(len(draft.poison))


def chunks(records: list[Record], max_bytes: int) -> Iterator[list[Record]]:
    """``records`` in order, cut so each chunk's keys, values and headers stay under
    ``max_bytes`` (a record larger than that is a chunk of its own). Pure."""
    chunk: list[Record] = []
    size = 0
    for rec in records:
        n = rec.size()
        if chunk and size + n > max_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append(rec)
        size += n
    if chunk:
        yield chunk


def _record(event: Any) -> Record:
    msg = event.message
    return Record(
        topic=msg.topic,
        partition=msg.partition,
        offset=msg.offset,
        key=msg.key,
        value=msg.value,
        headers=headers_of(msg.headers),
        generation=msg.generation_id,
    )
