"""The agent body: take a batch from the stream, write it, then ack it — in that order.

One agent instance (concurrency 1) consumes every partition of the topic, so at most one
batch is in flight and each partition's records are written and acked in offset order.
The stream is ``noack()`` and batches come from ``noack_take()``, the one faust batching
call that does not ack in a ``finally`` (``take()`` does, even when the body raised).

Failure policy, crash-only: a batch that fails for any reason but fencing is never
acked; the process logs the error and exits at once with ``os._exit`` (no graceful
stop, no commit, no ack), and the next start resumes from the PostgreSQL offsets.
A fenced batch (another worker owns the partition now) was rolled back; its records are
released (:meth:`~.transport.AcklineConsumer.ack` moves no offset) and re-read by the
owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from ackline.core.faults import DISARMED, Faults
from ackline.core.metrics import Metrics
from ackline.schemas.decode import Limits
from ackline.sinks.connection import Database
from ackline.sinks.errors import FencedError
from ackline.sinks.ingest.batch import Batch
from ackline.sinks.ingest.offsets import claim
from ackline.sinks.ingest.writer import BatchWriter, WriteResult
from ackline.streams.committed import record_committed
from ackline.streams.deadletter import DeadLetterProducer
from ackline.streams.faust_runtime.batching import Draft, Record, draft_batch, headers_of
from ackline.streams.faust_runtime.ledger import Ledger

log = logging.getLogger(__name__)

FATAL_EXIT = 70  # EX_SOFTWARE: a batch failed; crash-only exit, nothing acked


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
        faults: Faults = DISARMED,
        claim_deadline_s: float = 60.0,
    ) -> None:
        self.ledger = Ledger()
        self.claim_deadline_s = claim_deadline_s
        self._group = group_id
        self._worker = worker_id
        self._control_db = control_db
        self._writer = writer
        self._dlq = dead_letters
        self._metrics = metrics
        self._limits = limits
        self.batch_max_events = batch_max_events
        self.batch_max_s = batch_max_ms / 1000
        self._faults = faults
        self.committed_batches = 0
        self.records_taken = 0  # records handed to handle(), for the drain check
        self.idle = True  # no batch between take and ack

    # ---- assignment ------------------------------------------------------------------

    async def claim(self, partitions: list[tuple[str, int]], generation: int) -> None:
        """Take ``partitions`` in PostgreSQL for consumer ``generation``.

        Order of effects: one autocommitted claim statement bumps every epoch (retried
        while PostgreSQL is unreachable, for at most ``claim_deadline_s``, then the
        process exits: faust would otherwise abandon the seek and stop recovering); the
        after_claim point; the ledger replaces its ownership. The caller then seeks to
        the DB offsets. A crash after the claim leaves higher epochs that nobody holds:
        the next claim bumps them again.
        """
        try:
            claims = await asyncio.wait_for(
                self._control_db.retrying(
                    "claim", lambda conn: claim(conn, self._group, self._worker, partitions)
                ),
                timeout=self.claim_deadline_s,
            )
            await self._faults.ahit("after_claim")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            die("claiming partitions failed", exc)
        self.ledger.claimed(generation, claims)
        self._metrics.assigned.set(len(claims))
        log.info(
            "assigned (generation %d) %s",
            generation,
            [(c.partition, c.next_offset, c.epoch) for c in claims],
        )

    async def revoking(self) -> None:
        """A revoke starts: the revoke_in_flight point when a batch is in flight."""
        if not self.idle:
            await self._faults.ahit("revoke_in_flight")

    async def stopping(self) -> None:
        """A graceful stop starts: the shutdown point (the batch in flight not finished)."""
        await self._faults.ahit("shutdown")

    # ---- the agent -------------------------------------------------------------------

    async def consume(self, stream: Any) -> None:
        """The agent body. ``stream`` is the faust stream of the topic (raw values).

        Order of effects per batch: ``noack_take`` yields the events (nothing acked);
        :meth:`handle` writes them (dead letters, then the PostgreSQL transaction); only
        then each event is acked, in delivery order (an ack marks it done for faust's
        in-flight tracking and moves no offset). A crash before the COMMIT: nothing moved,
        the events are re-read from the DB offset. A crash after it and before the acks:
        the DB offset is already past them, so they are not written again. Any failure
        but fencing exits the process here without acking (:func:`die`).
        """
        events_stream = stream.noack()
        try:
            async for events in events_stream.noack_take(
                self.batch_max_events, within=self.batch_max_s
            ):
                self.idle = False
                await self.handle(events)
                for event in events:  # after the DB commit, in delivery (offset) order
                    await events_stream.ack(event)
                self.idle = True
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            die("the batch failed", exc)

    async def handle(self, events: Sequence[Any]) -> WriteResult | None:
        """Draft, dead-letter and write one batch; return its result (None: nothing taken,
        or fenced).

        Order of effects: after_fetch point; draft (pure: the ledger picks the records,
        ackline decodes them); the dead-letter records produced and acknowledged by
        Kafka; the PostgreSQL transaction (fence CAS first); after_commit point; the
        ledger's DB offsets advance; metrics. The caller acks only after this returns.
        A crash anywhere before the COMMIT changes no offset; after it, the restart
        resumes past the batch (the DB offset), and a repeat of the dead-letter records
        is possible, never a loss.
        """
        self.records_taken += len(events)
        await self._faults.ahit("after_fetch")
        draft = draft_batch([_record(e) for e in events], self.ledger, self._limits)
        if draft.dropped:
            log.info("dropped %s records not owned by this claim", dict(draft.dropped))
        if draft.empty:
            return None
        if draft.poison:
            await self._dead_letter(draft)
        started = time.monotonic()
        try:
            result = await self._writer.write(draft.batch)
        except FencedError as exc:
            self._metrics.fenced.inc()
            gone = self.ledger.forget_fenced(draft.batch.ranges, exc.partitions)
            self._metrics.assigned.set(len(self.ledger.owned()))
            log.error(
                "batch %s fenced and rolled back: %s (no longer owned: %s)",
                draft.batch.describe(),
                exc,
                gone,
            )
            return None
        await self._faults.ahit("after_commit")
        self.ledger.committed(draft.batch.ranges)
        self._count(draft.batch, result, time.monotonic() - started)
        return result

    async def _dead_letter(self, draft: Draft) -> None:
        await self._faults.ahit("before_dlq")
        loop = asyncio.get_running_loop()
        draft.batch.rejects = await loop.run_in_executor(None, self._dlq.send_all, draft.poison)
        self._metrics.dead_letters.inc(len(draft.poison))

    def _count(self, batch: Batch, result: WriteResult, seconds: float) -> None:
        self.committed_batches += 1
        record_committed(self._metrics, batch, result, seconds)


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


def die(what: str, exc: BaseException) -> NoReturn:
    """Crash-only exit: log, flush the log handlers, ``os._exit`` (no ack, no commit)."""
    log.critical("%s: %r; exiting without acking (crash-only)", what, exc, exc_info=exc)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # exiting anyway
            handler.flush()
    sys.stderr.flush()
    os._exit(FATAL_EXIT)
