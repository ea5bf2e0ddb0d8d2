"""Run processors on the changefeed: effects and cursor in one transaction, per batch.

Each processor is a named changefeed reader (:class:`ackline.sinks.feed.changefeed.Reader`,
cursor row ``feed_cursors.reader = name``) followed by
:func:`ackline.sinks.feed.follow.follow` on a connection of its own. At start (once per
runner, on its first connection), it registers, names its filter on the connection (on
every connection), makes its cursor row if there is none, and takes over: records its
filter as the one in effect (:func:`ackline.sinks.feed.processors.control.take_over`,
its own transaction). Per batch, in one transaction (order of effects): read the
``paused`` flag (autocommitted, before BEGIN); BEGIN; read the cursor; read the feed (one
statement, before the transaction holds an xid); compare-and-set the cursor to the
batch's end (this takes the cursor row lock; the database refuses it if another filter
is in effect: roll back and stop); ``apply`` (the processor's effects, on the same
connection); clear a recorded failure if any; fault point ``processor_before_commit``;
COMMIT.

What a crash leaves, at each step: before COMMIT, nothing (effects and cursor roll back
together; the next instance gets the same batch); during COMMIT, whatever the database
decided (the next read of the cursor tells); after COMMIT, both. Two instances of one
processor: the second blocks on the cursor row, finds its version moved when the first
commits, rolls back before any effect, and reads on from the first one's cursor.

Two instances with different filters (a rolling deploy that changes it): the events a
filter drops are passed over, so only the filter in effect may move the shared cursor.
The newest instance to start took over; a takeover that changes the filter locks the
cursor row, so it waits for a batch in flight, and every cursor update after it is
checked against the new filter by migration 0012's trigger. An older instance whose
filter is no longer in effect rolls its batch back before any effect and stops that
processor (outcome ``superseded``; nothing recorded in
``processors``, which belongs to the instance in effect); the one in effect reads on
from the cursor of the last batch committed before the switch, so nothing after the
switch is passed over by another filter.

A batch whose ``apply`` raises (anything but a transient database error, which
reconnects and retries) rolls back; the runner then re-reads the same events in smaller
batches (halving down to one event) and commits every batch that goes through, so it
stops exactly at the first event that raises: the cursor stays just before it, the
failure is recorded in ``processors`` (``ackline processors status``) and that processor
stops; the others in the process go on. The next start retries from that event.

Processors never touch ingest: they only read ``activity`` and ``ingest_batches``, on
their own connections, and their transactions hold no lock an ingest writer takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg

from ackline.core.faults import DISARMED, Faults
from ackline.core.signals import Stopping
from ackline.sinks.connection import is_transient, went_away
from ackline.sinks.feed.changefeed import Changefeed, Reader, saved_cursor
from ackline.sinks.feed.follow import Committed, GapWatch, follow
from ackline.sinks.feed.processors import control
from ackline.sinks.feed.processors.contract import (
    AbortedByApplyError,
    IdleTooLongError,
    Processor,
    ProcessorBatch,
    ProcessorError,
    TransactionEndedError,
    filter_of,
    fingerprint,
)
from ackline.sinks.feed.processors.control import Superseded
from ackline.sinks.feed.processors.metrics import ProcessorMetrics
from ackline.sinks.feed.types import MAX_BYTES, START, Cursor, FeedBatch, erasure_notices

log = logging.getLogger(__name__)

_PROBE_ANSWER_S = 5.0
"""How long the idle bound's probe waits for SELECT 1 on its new connection (whose
connect has its own bound, ACKLINE_DB_CONNECT_TIMEOUT_S). One 5 s bound over both ran
out over a slow link (a connect of 6 s over 3 s of latency), and the processor's doing
was taken for the database going away: the batch retried whole for ever."""

Connect = Callable[[], Awaitable[asyncpg.Connection]]

FAULT_POINT = "processor_before_commit"


class Outcome(enum.StrEnum):
    CAUGHT_UP = "caught_up"  # --until-caught-up: nothing left to read
    STOPPED = "stopped"  # stop requested (SIGTERM), the batch in hand committed
    CANCELLED = "cancelled"  # stop requested and the shutdown wait ran out: rolled back
    PAUSED = "paused"  # --until-caught-up on a paused processor
    FAILED = "failed"  # stopped at an event that raises (or could not start)
    SUPERSEDED = "superseded"  # a newer instance with another filter took over: stopped


@dataclass(frozen=True, slots=True)
class Failure:
    """Where a processor stopped: the event it raised on (None: it failed outside any
    event, e.g. a missing grant) and the cursor just before it."""

    error: str
    event_id: uuid.UUID | None
    cursor: Cursor | None


@dataclass(frozen=True, slots=True)
class Report:
    """One processor's run, counted from confirmed commits only."""

    name: str
    outcome: Outcome
    applied: int
    batches: int
    lost_races: int
    cursor: str
    failure: Failure | None = None
    erased: int = 0
    """Erasure notices handed to the processor (keys of events erased): not events."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "processor": self.name,
            "outcome": self.outcome.value,
            "applied": self.applied,
            "erased": self.erased,
            "batches": self.batches,
            "lost_races": self.lost_races,
            "cursor": self.cursor,
        }
        if self.failure is not None:
            out["error"] = self.failure.error
            out["error_event_id"] = (
                None if self.failure.event_id is None else str(self.failure.event_id)
            )
            out["error_cursor"] = (
                None if self.failure.cursor is None else self.failure.cursor.encode()
            )
        return out


class ProcessorRunner:
    """Runs one processor (see the module docstring); also the reader :func:`follow` drives."""

    stored = True  # its cursor is its row of feed_cursors

    def __init__(
        self,
        processor: Processor,
        *,
        instance: str,
        metrics: ProcessorMetrics | None = None,
        faults: Faults = DISARMED,
        max_transactions: int = 16,
        batch_events: int = 5_000,
        batch_bytes: int = MAX_BYTES,
        poll_interval: float = 2.0,
        start: Cursor = START,
        idle_in_transaction_timeout_ms: int | None = None,
    ) -> None:
        self.processor = processor
        # the bound the connections are made with (connector()): a batch whose apply held
        # its transaction longer may have been ended by the server for being idle
        self._idle_bound_s = (
            None
            if idle_in_transaction_timeout_ms is None
            else idle_in_transaction_timeout_ms / 1000
        )
        self._connect: Connect | None = None
        self.name = processor.name
        self.instance = instance
        self.metrics = metrics or ProcessorMetrics()
        self.batch_events = batch_events
        self.poll_interval = poll_interval
        self._faults = faults
        feed_filter = filter_of(processor)
        self.filter = fingerprint(feed_filter)
        self._took_over = False
        feed = Changefeed(feed_filter, max_transactions=max_transactions, max_bytes=batch_bytes)
        # feed_before_commit fires too (at the same place), for `ackline dispatch`'s arms.
        self.reader = Reader(self.name, feed, start=start, faults=faults)
        self.feed = feed  # what follow() reads, through self.reader
        self.applied = 0
        self.erased = 0  # notices handed, counted apart: an operator compares applied with rows
        self.batches = 0
        self.paused = False
        self.cursor: Cursor = start
        self._in_hand: ProcessorBatch | None = None
        self._races_counted = 0
        # the retention drops told, across the follow() calls of run(): said once each
        self._gaps = GapWatch(self.name, stored=self.stored)
        self.metrics.failed.labels(self.name).set(0)
        self.metrics.paused.labels(self.name).set(0)

    # --- the reader follow() drives ---------------------------------------------------

    async def position(self, conn: asyncpg.Connection) -> Cursor:
        """Register the processor (if new), read, or create, its cursor and, the first
        time only, take over with this instance's filter (a reconnect does not take over
        again: a newer instance may have meanwhile). Each step commits on its own
        (autocommitted, then :func:`control.take_over`'s transaction); a crash between
        them leaves a registered processor with a cursor and the old filter in effect,
        and the next start does the rest."""
        await control.register(conn, self.name)
        await control.name_filter(conn, self.filter)
        self.cursor = await self.reader.position(conn)
        if not self._took_over:
            before = await control.take_over(conn, self.name, self.filter, self.instance)
            self._took_over = True
            if before.filter is not None and before.filter != self.filter:
                log.warning(
                    "processor %s: instance %s takes over with filter %s (was %s, recorded "
                    "by instance %s): from now on only this filter moves its cursor",
                    self.name,
                    self.instance,
                    self.filter,
                    before.filter,
                    before.instance or "-",
                )
        return self.cursor

    @asynccontextmanager
    async def next_batch(
        self, conn: asyncpg.Connection, limit: int | None = None
    ) -> AsyncIterator[FeedBatch]:
        """The next batch inside its transaction, or, while paused, an empty batch read
        without opening one (follow() then waits as if caught up)."""
        if await control.is_paused(conn, self.name):
            if not self.paused:
                # not "waiting": a one-shot run (--until-caught-up) ends here, outcome paused
                log.info(
                    "processor %s is paused: it reads nothing until `ackline processors resume`",
                    self.name,
                )
            self.paused = True
            self.metrics.paused.labels(self.name).set(1)
            here = await saved_cursor(conn, self.name) or self.cursor
            yield FeedBatch(start=here, end=here)
            return
        if self.paused:
            log.info("processor %s resumed", self.name)
            self.paused = False
            self.metrics.paused.labels(self.name).set(0)
        async with self._guarded_batch(conn, limit) as batch:
            yield batch

    @asynccontextmanager
    async def _guarded_batch(
        self, conn: asyncpg.Connection, limit: int | None
    ) -> AsyncIterator[FeedBatch]:
        """The reader's next batch, its transaction and compare-and-set, with the
        database guard's refusal (another filter in effect) raised as :class:`Superseded`:
        every path that moves the cursor goes through here (follow's and _isolate's)."""
        committing = False
        try:
            async with self.reader.next_batch(conn, limit) as batch:
                yield batch
                committing = True  # the body returned: the reader checks, then COMMITs
        except asyncpg.PostgresError as exc:
            if control.refused_by_guard(exc):
                raise await self._superseded_by(conn, exc) from exc
            applied = self._in_hand is not None and bool(self._in_hand.events)
            if committing and applied and not is_transient(exc, conn):
                # the batch's own effects refused at COMMIT (a deferred constraint or
                # constraint trigger of the processor's tables): its failure, narrowed
                # down to the event like one raised inside apply
                raise ProcessorError(self.name, exc) from exc
            raise

    async def _handle(self, conn: asyncpg.Connection, batch: FeedBatch) -> Any:
        """Inside the batch's transaction, after the compare-and-set on the cursor row
        (which the database refused if another filter is in effect): apply, clear a
        recorded failure, fault point. A failure of ``apply``, or of the runner's first
        statement after it, that is the processor's doing (:meth:`_processors_doing`) is
        raised as :class:`ProcessorError`, which the runner narrows down to an event; any
        other is raised as it came (a transient one retries the batch whole)."""
        self._in_hand = None  # not an earlier batch's, on a read that finds nothing
        if batch.caught_up:
            return None
        work = ProcessorBatch(self.name, self.instance, batch.start, batch.end, tuple(batch.events))
        self._in_hand = work
        result = None
        began = time.monotonic()
        if work.events:
            try:
                result = await self.processor.apply(conn, work)
            except Exception as exc:
                await self._same_transaction(conn, work, raised=True)
                failure = await self._processors_doing(exc, conn, began, in_apply=True)
                if failure is None:
                    raise
                raise failure from exc
            await self._same_transaction(conn, work, raised=False)
        try:
            written_here = await control.clear_failure(conn, self.name)
        except Exception as exc:
            failure = None
            if work.events:  # what apply left shows at the next statement
                failure = await self._processors_doing(exc, conn, began, in_apply=False)
            if failure is None:
                raise
            raise failure from exc
        if work.events and not written_here:
            raise _transaction_ended(self.name, work)
        await self._faults.ahit(FAULT_POINT)
        return result

    async def _processors_doing(
        self, exc: Exception, conn: asyncpg.Connection, began: float, *, in_apply: bool
    ) -> ProcessorError | None:
        """``exc`` as the processor's failure, or None when it is not the processor's.

        Raised inside ``apply``, anything but the database going away is. Raised by the
        runner's first statement after ``apply`` returned, the transaction aborted is
        (``apply`` caught a failing statement without a savepoint: the next statement
        fails, whoever makes it). Either way, a session the server ended while the
        processor held the transaction idle past its bound is
        (:meth:`_held_idle_too_long`), which shows at the next statement, inside ``apply``
        or after it. Before the second case was looked at, both were retried whole for
        ever or stopped before any event."""
        if in_apply and not went_away(exc, conn):
            return ProcessorError(self.name, exc)
        if isinstance(exc, asyncpg.InFailedSQLTransactionError):
            return ProcessorError(
                self.name,
                AbortedByApplyError(
                    "a statement of apply failed and apply went on, so the batch's "
                    "transaction was aborted: let the error out of apply, or catch it "
                    "inside a savepoint (async with conn.transaction())"
                ),
            )
        held = time.monotonic() - began
        if went_away(exc, conn) and await self._held_idle_too_long(held, conn):
            bound = f"idle_in_transaction_session_timeout {self._idle_bound_s:g} s"
            return ProcessorError(
                self.name,
                IdleTooLongError(
                    f"the batch's transaction was held {held:.1f} s by the processor's own "
                    f"code and the server ended the session ({bound}: "
                    "ACKLINE_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS), while the database answers: "
                    f"{_text(exc)}"
                ),
            )
        return None

    async def _same_transaction(
        self, conn: asyncpg.Connection, work: ProcessorBatch, *, raised: bool
    ) -> None:
        """Raise :class:`TransactionEndedError` if ``apply`` ended the batch's transaction:
        none open on the connection (a COMMIT or ROLLBACK of its own), or one open that did
        not write the cursor (then a BEGIN too: the cursor row's xmin is not this
        transaction's). Unchecked, a ROLLBACK left the runner's COMMIT committing nothing
        (PostgreSQL only warns), the batch counted and read again for ever; a COMMIT moved
        the cursor with part of a batch, and narrowing the failure down passed the rest
        over. After ``apply`` returned, :func:`control.clear_failure` asks in its own round
        trip; after it raised, in a transaction the error aborted, nothing can be asked
        (what that leaves is said in docs/processors.md)."""
        if conn.is_closed():
            return  # gone: the database's going away, or the idle bound, decide
        if not conn.is_in_transaction():
            raise _transaction_ended(self.name, work)
        if not raised:
            return
        try:
            here = await control.cursor_written_here(conn, self.name)
        except (asyncpg.InFailedSQLTransactionError, asyncpg.InterfaceError):
            return  # aborted by the error (or busy): cannot tell
        if not here:
            raise _transaction_ended(self.name, work)

    async def _held_idle_too_long(self, held_s: float, conn: asyncpg.Connection) -> bool:
        """Whether a closed connection under ``apply`` is the processor's doing: it held the
        batch's transaction past the server's idle bound, and a new connection (within the
        connect's own bound) answers SELECT 1 within :data:`_PROBE_ANSWER_S` (the database
        is there). Then the batch is halved like any failing one
        instead of retried whole for ever, the server ending it each time. A batch whose
        statements kept it busy that long and lost the database meanwhile is misread only
        when the database answers again at once: then it is halved, not stopped."""
        bound, connect = self._idle_bound_s, self._connect
        if bound is None or connect is None or held_s < bound or not conn.is_closed():
            return False
        try:
            probe = await connect()  # bounded by the connect's own bound
        except Exception:
            return False
        try:
            await probe.execute("SELECT 1", timeout=_PROBE_ANSWER_S)  # one round trip
        except Exception:
            probe.terminate()
            return False
        try:  # the answer came: a slow goodbye does not unsay it
            await probe.close(timeout=_PROBE_ANSWER_S)
        except Exception:
            probe.terminate()
        return True

    async def _superseded_by(self, conn: asyncpg.Connection, exc: BaseException) -> Superseded:
        """The guard's refusal (0012's trigger on the cursor row: another filter is in
        effect, recorded by a takeover that locked that row first; the batch rolled back)
        as :class:`Superseded`, naming who took over: read after the rollback, on the same
        connection (the guard's own text if that read fails)."""
        try:
            in_effect = await control.filter_in_effect(conn, self.name)
        except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError):
            return Superseded(_text(exc))
        return Superseded(
            f"instance {self.instance} (filter {self.filter}) is superseded: "
            f"{in_effect.took_over()}, and only the filter in effect moves the shared "
            "cursor. This instance's batch rolled back (nothing of it applied) and it stops "
            "this processor; finish the rollout (`ackline processors status` shows the "
            "filter in effect)"
        )

    def _committed(self, done: Committed[Any]) -> None:
        """After COMMIT (or after an empty read): count, and tell the processor."""
        races = self.reader.stats.lost_races
        if races > self._races_counted:
            self.metrics.lost_races.labels(self.name).inc(races - self._races_counted)
            self._races_counted = races
        work, self._in_hand = self._in_hand, None
        self.cursor = done.batch.end
        if done.batch.caught_up or work is None:
            return
        notices = erasure_notices(work.events)
        self.applied += len(work.events) - notices
        self.erased += notices
        self.batches += 1
        self.metrics.applied.labels(self.name).inc(len(work.events) - notices)
        self.metrics.erased.labels(self.name).inc(notices)
        self.metrics.batches.labels(self.name).inc()
        self.metrics.last_commit.labels(self.name).set(time.time())
        self.metrics.failed.labels(self.name).set(0)
        hook = getattr(self.processor, "committed", None)
        if hook is not None and work.events:
            try:
                hook(work, done.result)
            except Exception:  # the batch stands: not a failure at any of its events
                self.metrics.errors.labels(self.name, "committed").inc()
                log.error(
                    "processor %s: committed() raised after its batch committed (cursor %s): "
                    "the batch's effects and cursor stand, only what the hook keeps in "
                    "memory is off; going on",
                    self.name,
                    done.batch.end,
                    exc_info=True,
                )

    def _transient(self, exc: BaseException) -> None:
        self.metrics.errors.labels(self.name, "transient").inc()

    # --- running ----------------------------------------------------------------------

    async def run(self, connect: Connect, stop: asyncio.Event, *, wait: bool = True) -> Report:
        """Apply batches until ``stop`` (or, ``wait`` False, until caught up or paused);
        stop at the first event that raises. Never raises for a processor's failure."""
        self._connect = connect
        ended: list[bool] = []  # follow() ended by itself: caught up (or paused)
        while True:
            self._in_hand = None
            ended.clear()
            try:
                await follow(
                    self,
                    connect,
                    self._handle,
                    stop,
                    wait=wait,
                    poll_interval=self.poll_interval,
                    batch_events=self.batch_events,
                    on_commit=self._committed,
                    on_transient=self._transient,
                    on_end=lambda: ended.append(True),
                    gaps=self._gaps,
                )
            except ProcessorError as exc:
                failed, self._in_hand = self._in_hand, None
                self.metrics.errors.labels(self.name, "apply").inc()
                if failed is None or not failed.events:
                    return await self._stop(connect, Failure(exc.text, None, self.cursor))
                log.warning(
                    "processor %s: a batch of %d events raised (%s); retrying it in smaller "
                    "batches to stop at the first event that raises",
                    self.name,
                    len(failed.events),
                    exc.text,
                )
                try:
                    located = await self._isolate(connect, failed, stop)
                except Superseded as inner:
                    return self._superseded(inner)
                except Exception as inner:
                    if is_transient(inner):
                        self._transient(inner)
                        continue
                    return await self._stop(connect, Failure(_text(inner), None, self.cursor))
                if located is None:
                    continue  # every event went through on its own: carry on
                return await self._stop(connect, located)
            except Superseded as exc:
                return self._superseded(exc)
            except Exception as exc:
                # outside any event: registration, privileges, the feed itself
                return await self._stop(connect, Failure(_text(exc), None, self.cursor))
            if stop.is_set() and not ended:  # a stop as the run caught up did not cut it
                outcome = Outcome.STOPPED
            elif self.paused:
                outcome = Outcome.PAUSED
            else:
                outcome = Outcome.CAUGHT_UP
            return self.report(outcome)

    async def _isolate(
        self, connect: Connect, failed: ProcessorBatch, stop: asyncio.Event
    ) -> Failure | None:
        """Re-read from the cursor in batches of half the failed one's size, halving on
        every failure and committing every batch that goes through, until one event
        alone raises (returned) or the failed batch's end is passed (None). Each re-read
        checks the paused flag, as every batch does (:meth:`next_batch`): paused, it
        returns None, and the run waits or reports the pause."""
        size = max(1, len(failed.events) // 2)
        end = failed.end.sort_key()
        conn = await connect()
        try:
            await self.position(conn)
            while not stop.is_set():
                try:
                    async with self.next_batch(conn, size) as batch:
                        result = await self._handle(conn, batch)
                except ProcessorError as exc:
                    work = self._in_hand
                    self._in_hand = None
                    if work is not None and len(work.events) == 1:
                        return Failure(exc.text, work.events[0].event_id, work.start)
                    size = max(1, size // 2)
                    if conn.is_closed():  # the server ended it (IdleTooLongError)
                        conn = await connect()
                        await self.position(conn)
                    continue
                self._committed(Committed(batch, result))
                if batch.caught_up or batch.end.sort_key() >= end:
                    return None
            return None
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await conn.close()

    def _superseded(self, exc: Superseded) -> Report:
        """Stop this processor: another filter is in effect. Nothing is recorded in
        ``processors``: its row belongs to the instance in effect, which is not failing."""
        self._in_hand = None
        self.metrics.errors.labels(self.name, "superseded").inc()
        self.metrics.failed.labels(self.name).set(1)  # not ready: /readyz says so
        text = str(exc)
        log.error("processor %s stopped: %s", self.name, text)
        return self.report(Outcome.SUPERSEDED, Failure(text, None, self.cursor))

    async def _stop(self, connect: Connect, failure: Failure) -> Report:
        """Record where the processor stopped (best effort: the log line is the fallback)."""
        self.metrics.errors.labels(self.name, "stopped").inc()
        self.metrics.failed.labels(self.name).set(1)
        where = (
            f"at event {failure.event_id} (the first after cursor "
            f"{failure.cursor.encode() if failure.cursor else '-'})"
            if failure.event_id is not None
            else "before any event"
        )
        log.error("processor %s stopped %s: %s", self.name, where, failure.error)
        for attempt in range(3):
            try:
                conn = await connect()
                try:
                    await control.record_failure(
                        conn,
                        self.name,
                        failure.error,
                        failure.event_id,
                        failure.cursor,
                        self.instance,
                    )
                finally:
                    await conn.close()
                break
            except Exception as exc:
                if attempt == 2 or not is_transient(exc):
                    log.warning("processor %s: could not record the failure: %s", self.name, exc)
                    break
                await asyncio.sleep(0.5 * (attempt + 1))
        return self.report(Outcome.FAILED, failure)

    def report(self, outcome: Outcome, failure: Failure | None = None) -> Report:
        return Report(
            self.name,
            outcome,
            self.applied,
            self.batches,
            self.reader.stats.lost_races,
            self.cursor.encode(),
            failure,
            self.erased,
        )


def _transaction_ended(processor: str, work: ProcessorBatch) -> TransactionEndedError:
    """The error of an ``apply`` that ended its batch's transaction (:class:`ProcessorRunner`
    ``._same_transaction``). Pure."""
    start = work.start.encode()
    return TransactionEndedError(
        f"processor {processor!r}: apply ended the batch's transaction itself (a COMMIT or "
        "ROLLBACK of its own): never do (catch errors inside a savepoint, async with "
        f"conn.transaction()). The batch from cursor {start} to {work.end.encode()} may be "
        "partly applied and its cursor moved past it (a COMMIT): check the processor's "
        f"state, then `ackline processors reset {processor} --cursor-only --to-cursor "
        f"{start}` applies it again"
    )


def _text(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


async def watch(
    connect: Connect,
    names: Sequence[str],
    metrics: ProcessorMetrics,
    instance: str,
    stop: asyncio.Event,
    interval: float = 5.0,
) -> None:
    """Every ``interval`` s, on a connection of its own: sample each processor's lag
    (events and seconds) into the metrics, and heartbeat ``processors.last_seen_at``.
    Runs until ``stop`` or cancelled; a lost database is retried at the next tick."""
    conn: asyncpg.Connection | None = None
    was_up: bool | None = None
    try:
        while not stop.is_set():
            up = True
            try:
                if conn is None or conn.is_closed():
                    conn = await connect()
                lags = await control.lags(conn, list(names))
                # up before the lags show: a scrape (the server's own thread) that sees
                # this sample's lag must not read /readyz as "not reached"
                metrics.db_up.set(1)
                for lag in lags:
                    metrics.lag_events.labels(lag.name).set(lag.events)
                    metrics.lag_seconds.labels(lag.name).set(lag.seconds)
                    metrics.paused.labels(lag.name).set(1 if lag.paused else 0)
                await control.heartbeat(conn, list(names), instance)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
                up = False
                if was_up is not False:
                    log.warning("processors: lag sample failed: %s", exc)
                if conn is not None:
                    conn.terminate()
                    conn = None
            was_up = up
            metrics.db_up.set(1 if up else 0)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await stop.wait()
    finally:
        if conn is not None and not conn.is_closed():
            conn.terminate()


def _drop_if_superseded(name: str, live: list[str]) -> Callable[[asyncio.Task[Report]], None]:
    def done(task: asyncio.Task[Report]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        if task.result().outcome is Outcome.SUPERSEDED and name in live:
            live.remove(name)

    return done


async def run_all(
    runners: Sequence[ProcessorRunner],
    connect: Connect,
    stopping: Stopping,
    *,
    wait: bool = True,
    watch_interval: float = 5.0,
    watch_connect: Connect | None = None,
    each: Callable[[Connect], Connect] | None = None,
) -> list[Report]:
    """Run every runner on its own connection until all return; once ``stopping.stop`` is
    set, they have its grace period to commit the batch in hand, then are cancelled (a
    cancelled batch rolls back: nothing of it is applied), or at once on a second Ctrl-C
    (:class:`~ackline.core.signals.Stopping`). ``watch_connect`` (default ``connect``)
    opens the lag watcher's connection, which retries every failure itself. ``each``
    wraps ``connect`` once for each runner: a bound on its retries that is its own."""
    if not runners:
        return []
    stop = stopping.stop
    metrics = runners[0].metrics
    tasks = [
        stopping.watch(
            asyncio.create_task(r.run(connect if each is None else each(connect), stop, wait=wait))
        )
        for r in runners
    ]
    # A superseded processor's heartbeat stops with it: `processors status` must not show
    # it running here while another instance's filter is in effect.
    live = [r.name for r in runners]
    for runner, task in zip(runners, tasks, strict=True):
        task.add_done_callback(_drop_if_superseded(runner.name, live))
    watcher_stop = asyncio.Event()
    watcher = asyncio.create_task(
        watch(
            connect if watch_connect is None else watch_connect,
            live,
            metrics,
            runners[0].instance,
            watcher_stop,
            watch_interval,
        )
    )
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([*tasks, stopped], return_when=asyncio.FIRST_COMPLETED)
        while not all(t.done() for t in tasks) and not stop.is_set():
            await asyncio.wait([*tasks, stopped], return_when=asyncio.FIRST_COMPLETED)
        if not all(t.done() for t in tasks):
            stopping.arm()  # begun already when a signal set ``stop``
            await asyncio.wait(tasks)  # each returns, or is cancelled by ``stopping``
    finally:
        stopped.cancel()
        watcher_stop.set()
        watcher.cancel()
        await asyncio.gather(stopped, watcher, return_exceptions=True)
    reports = []
    for runner, task in zip(runners, tasks, strict=True):
        if task.cancelled():
            reports.append(runner.report(Outcome.CANCELLED))
        else:
            reports.append(task.result())
    return reports
