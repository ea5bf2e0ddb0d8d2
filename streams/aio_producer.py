"""The asyncio producer SDK: :class:`ActivityProducer`'s twin for asyncio services.

Built on confluent-kafka's own asyncio producer (``confluent_kafka.aio.AIOProducer``):
every blocking librdkafka call runs in a small thread pool this class owns, so a web
handler or an agent loop never waits on the broker with the event loop held. Records are
made by the same :func:`ackline.streams.producer.prepare` (one validation, one set of
bytes for every attempt) and commit errors are judged by the same
:func:`ackline.streams.producer.txn_action`.

What AIOProducer (confluent-kafka 2.16) does not do, and how this class copes:

* **No headers** (``produce(headers=...)`` raises NotImplementedError: it batches through
  ``produce_batch``). Records go out with their key and value only; ackline reads no
  header (the envelope carries ``type`` and ``schema_version``), so nothing is lost.
* **Unbounded flushes**: its ``commit_transaction``/``abort_transaction``/``close`` flush
  without a timeout. This class flushes first with the time left, so a frozen broker
  costs at most ``timeout``, then an :class:`OutcomeUnknownError`.
* **Fatal errors as SystemError** (a fenced instance): unwrapped with
  :func:`ackline.streams.errors.kafka_error`.
* **Cancellation**: a transactional call keeps running in its thread when the awaiting
  task is cancelled. This class then refuses further transactional calls
  (:class:`OutcomeUnknownError`): close it and resend from a new instance. So it does
  after a cancellation in a commit's pause between two calls (the transaction open, a
  commit maybe asked).
* Delivery futures are completed from a worker thread: do not run the loop in asyncio
  debug mode with this producer (it raises "Non-thread-safe operation").

Usage::

    records = [prepare(envelope)]
    async with AsyncActivityProducer(bootstrap, "agent-activity", "svc-1") as producer:
        deliveries = await producer.send_transaction(records)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Self, TypeVar

from confluent_kafka import KafkaError, KafkaException, Message
from confluent_kafka.aio import AIOProducer

from ackline.core.logs import kafka_logger
from ackline.schemas.envelope import Envelope
from ackline.streams.errors import (
    OutcomeUnknownError,
    ProduceError,
    TransientProduceError,
    kafka_error,
)
from ackline.streams.producer import (
    RETRY_PAUSE_S,
    TOPIC_LOOK_S,
    Delivery,
    KeyBy,
    Outgoing,
    abort_failed,
    batch_bytes,
    call_failed,
    check_callbacks,
    check_fit,
    check_fits,
    client_limits,
    failure_causes,
    not_committed,
    not_open,
    prepare,
    record_size,
    refusal_batch,
    send_failed,
    send_refused,
    settle,
    start_failed,
    started_twice,
    too_large,
    topic_absent,
    topic_missing,
    transactional_config,
    txn_action,
    unexplained,
    unheld,
    warn_dropped,
    within_topic_limit,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

AFTER_CANCEL_S = 5.0
"""How long a cancelled ``close()`` may still take to say what it drops, purge it and close
AIOProducer before the cancel is raised again."""
_CALL_SLICE_S = 10.0
"""The longest single flush/commit call; the loop around it honours the overall timeout."""


class AsyncActivityProducer:
    """A transactional producer of activity envelopes for asyncio code.

    Nothing connects until :meth:`start` (or ``async with``), which must run inside the
    event loop that will use it. One transaction at a time per instance.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        transactional_id: str,
        *,
        key_by: KeyBy = "agent",
        extra: dict[str, Any] | None = None,
        threads: int = 2,
    ) -> None:
        self.topic = topic
        self.key_by: KeyBy = key_by
        self.transactional_id = transactional_id
        check_callbacks(extra, coroutines=True)
        # librdkafka's lines through Python logging, de-duplicated, as the synchronous
        # producer's (``extra`` may replace it); without it librdkafka prints each raw line
        # on stderr (one per failed connection attempt while the broker is away).
        # AIOProducer hands each line to the event loop (its AsyncLogger); lines of a
        # client never closed that come after the loop closed are served by nothing and
        # go with the client, unlogged.
        self._conf = {
            "logger": kafka_logger(),
            **transactional_config(bootstrap, transactional_id, extra),
        }
        if "on_delivery" in self._conf:
            # AIOProducer gives every record its own callback (its future): a default
            # one would never fire, so say so now rather than stay silent
            raise ProduceError(
                "on_delivery in extra is not supported by the asyncio producer (it would "
                "never be called): await or add a callback to each send()'s delivery future"
            )
        self._limits = client_limits(self._conf)
        # Half of librdkafka's local queue: past it, send() waits for a flush first.
        # AIOProducer fails a record that meets a full queue on its own (its future only),
        # and a transaction committed around it would lack it.
        self._room = max(1, self._limits.queue_max_messages // 2)
        self._room_bytes = self._limits.queue_max_bytes // 2
        self._sent: list[asyncio.Future[Message]] = []
        """The delivery futures of the open transaction's records."""
        self._failed: BaseException | None = None
        """The first error :meth:`send` raised since the open transaction began (reset at
        begin): :meth:`transaction` aborts instead of committing without its record."""
        self._in_block = False
        """Whether a :meth:`transaction` block is running: a send after a failed one in it
        is refused at once."""
        self._drain_s = 60.0
        """How long a send waits for the local queue to drain: the transaction's timeout."""
        self._unflushed = self._unflushed_bytes = 0
        self._batch_bytes = batch_bytes(self._conf)
        """The most bytes librdkafka puts in one batch of this instance's client."""
        self._threads = threads
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._aio: AIOProducer | None = None
        self._closed = False
        self._broken: ProduceError | None = None
        """Why this instance can do no more; raised (as a new error) by every later call."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self, timeout: float = 30.0) -> None:
        """Connect and fence older instances with the same transactional.id.

        Order of effects, as the synchronous ``start()``: the topic's
        ``max.message.bytes`` is read (the producer batches within it:
        :func:`ackline.streams.producer.within_topic_limit`), then the client is made and
        ``init_transactions`` fences; both within ``timeout``. A crash or a cancel between
        them leaves nothing (a read changes nothing; nothing is made before it). A
        transaction an older instance left open is finished by the broker first
        (committed if its commit had begun, aborted otherwise), so after start() the
        earlier attempt's outcome is settled and a resend of the same records is safe.
        A second start() on an open instance, or a start() after close() (a failed
        start() closes it), raises :class:`ProduceError` and changes nothing: an instance
        starts once.
        """
        if self._closed:
            raise not_open("AsyncActivityProducer", closed=True)
        if self._aio is not None:
            raise started_twice("AsyncActivityProducer")
        loop = asyncio.get_running_loop()
        began = loop.time()
        conf = await asyncio.to_thread(
            within_topic_limit, self._conf, self.topic, min(5.0, timeout / 2)
        )
        if self._closed:  # close() came while the limit was read: no client to make
            raise not_open("AsyncActivityProducer", closed=True)
        if self._aio is not None:  # another start() got in while the limit was read
            raise started_twice("AsyncActivityProducer")
        executor = concurrent.futures.ThreadPoolExecutor(
            self._threads, thread_name_prefix=f"ackline-producer-{self.transactional_id}"
        )
        self._batch_bytes = batch_bytes(conf)
        aio = AIOProducer(conf, executor=executor)
        self._executor, self._aio = executor, aio
        try:
            await self._guard(aio.init_transactions(max(timeout - (loop.time() - began), 0.1)))
        except (KafkaException, SystemError) as exc:
            unheld(exc)
            await self.close()
            err = kafka_error(exc)
            bootstrap = self._conf["bootstrap.servers"]
            if err is None:
                raise ProduceError(
                    f"cannot initialise transactions with {bootstrap}: {exc!r}"
                ) from exc
            raise start_failed(err, bootstrap) from exc

    def _client(self) -> AIOProducer:
        if self._aio is None:
            raise not_open("AsyncActivityProducer", self._closed)
        if self._broken is not None:
            raise type(self._broken)(
                f"this producer instance is unusable ({self._broken}); close it and resend "
                "the same records from a new instance"
            )
        return self._aio

    async def _guard(self, call: Awaitable[T]) -> T:
        """Await a transactional call, or a pause between two; if the awaiting task is
        cancelled, the call goes on in its thread (or the transaction stays open, a commit
        maybe asked), so this instance's transaction state is unknown from then on."""
        try:
            return await call
        except asyncio.CancelledError:
            self._broken = OutcomeUnknownError("a task was cancelled inside a transactional call")
            raise

    async def send_transaction(
        self, records: Sequence[Outgoing], *, timeout: float = 60.0, rounds: int = 3
    ) -> list[Delivery]:
        """Send ``records`` in one transaction and commit it; the deliveries, in order.

        Order of effects: begin; produce every record; flush; commit. ``timeout`` also
        bounds each wait for room in the local queue (:class:`TransientProduceError`
        past it). A commit that fails retriably is called again until ``timeout`` (never
        a resend). One that requires an
        abort is aborted and the same records go out in a new transaction, up to
        ``rounds`` times. Raises :class:`OutcomeUnknownError` when the commit could not be
        confirmed (close this instance, start a new one with the same transactional.id,
        resend the same records: ackline drops the copies), :class:`ProducerFencedError`
        when a newer instance took over, :class:`ProduceError` when nothing was committed
        (a record refused: over ``message.max.bytes``, or by the broker for good), and its
        subclass :class:`TransientProduceError` when nothing was committed because the
        broker was away (send the same records again, later), the topic does not exist
        (the error names it), or the broker refused a batch over a ``max.message.bytes``
        lowered after :meth:`start` (from a new instance). Before the commit every
        record's delivery is checked: one that failed aborts the whole transaction, and
        the records' delivery errors then say which error it is (not the ``_STATE``
        refusals and purges that follow a failed transaction). A crash before the commit
        marker leaves nothing visible to ackline.
        """
        check_fits(records, self._limits)
        try:
            return await self._send_rounds(records, timeout, rounds)
        finally:
            _errors_seen(self._sent)

    async def _send_rounds(
        self, records: Sequence[Outgoing], timeout: float, rounds: int
    ) -> list[Delivery]:
        """:meth:`send_transaction`'s attempts. Order of effects, each attempt: begin;
        produce every record; :meth:`_commit` (flush, check every delivery, commit), or
        :meth:`abort` after a failed send, an undelivered record or an abortable commit
        error, and the next attempt. A crash before an attempt's commit marker leaves
        nothing of it visible (the broker aborts it: its timeout, or the next instance's
        ``init_transactions``); after it, the attempt is committed."""
        loop = asyncio.get_running_loop()
        for attempt in range(1, rounds + 1):
            await self._begin(timeout)
            try:
                futures = [await self._produce(record) for record in records]
            except BaseException:
                if self._broken is None:
                    await self.abort(timeout)
                raise
            try:
                await self._commit(loop.time() + timeout)
            except (_Undelivered, _AbortRequired) as exc:
                await self.abort(timeout)
                causes = failure_causes(_errors(futures))
                if causes:
                    raise await self._not_committed(causes) from None
                if attempt == rounds:
                    raise ProduceError(f"transaction aborted, nothing committed: {exc}") from None
                log.warning("transaction aborted (%s); sending the same records again", exc)
                continue
            return await _deliveries(futures)
        raise AssertionError("unreachable")

    @asynccontextmanager
    async def transaction(self, timeout: float = 60.0) -> AsyncIterator[None]:
        """Begin; run the block (its :meth:`send` calls); flush and commit only if every
        send in it succeeded, else abort.

        The transaction is whole or absent: an exception out of the block aborts it, and
        so does a :meth:`send` that raised even when the block caught the error and went
        on (a commit would lack that record; Kafka's Java producer refuses it too). Every
        later :meth:`send` in the block then raises at once, its record not queued.

        Order of effects: begin; the block's sends; then :meth:`_commit` (flush, check
        every delivery, commit), or, after an exception or a failed send,
        :meth:`abort` (flush, abort marker) and an error. A crash before the commit
        marker leaves nothing visible to read_committed consumers (the broker aborts the
        transaction: its timeout, or the next instance's ``init_transactions``); a crash
        in the abort leaves the same.

        Commit errors raise as in :meth:`send_transaction`: a record whose delivery
        failed, or an abortable commit error, aborts the whole transaction and raises
        :class:`ProduceError` (or :class:`TransientProduceError`; the block is not run
        again). A send the block caught raises here, after the abort, as
        :func:`ackline.streams.producer.send_failed` (:class:`TransientProduceError` for
        one that was no verdict on its record: its local queue did not drain within
        ``timeout``, or it was cancelled); on an instance that send left unusable
        (fenced, cancelled), or when the abort is not confirmed (the broker away: likely
        after a queue that did not drain), the abort raises the instance's error instead
        and the instance is done. After a confirmed abort the next transaction starts
        clean. Whatever it raises says what became of the records: their futures' errors
        are retrieved here, so asyncio logs none of them as never retrieved (a future the
        caller holds can still be awaited).
        """
        await self._begin(timeout)
        self._in_block = True
        try:
            try:
                yield
            except BaseException:
                if self._broken is None:
                    await self.abort(timeout)
                raise
            finally:
                self._in_block = False
            first = self._failed
            if first is not None:
                await self.abort(timeout)
                raise send_failed(first) from first
            try:
                await self._commit(asyncio.get_running_loop().time() + timeout)
            except (_Undelivered, _AbortRequired) as exc:
                await self.abort(timeout)
                causes = failure_causes(_errors(self._sent))
                if causes:
                    raise await self._not_committed(causes) from None
                raise ProduceError(f"transaction aborted, nothing committed: {exc}") from None
        finally:
            _errors_seen(self._sent)

    async def send(self, item: Envelope | Outgoing) -> asyncio.Future[Message]:
        """Queue one envelope (prepared here) or prepared record in the open transaction.

        Returns its delivery future, resolved once the record is flushed (the commit
        flushes). Prepare records yourself when a retry may need them again. Raises
        :class:`ProduceError` for a record over ``message.max.bytes``, before queueing it.
        Whatever it raises, the open transaction can no longer commit: :meth:`transaction`
        aborts it whole, whether the block lets the error out or not, and every later send
        in its block raises at once, its record not queued
        (:func:`ackline.streams.producer.send_refused`, naming the first error).

        Outside a :meth:`transaction` block it raises :class:`ProduceError` and queues
        nothing, as the synchronous producer's send with no transaction open does: queued,
        the record would only fail later (librdkafka refuses it, ``_STATE``) with nobody
        told, and a :meth:`send_transaction` after it would begin without it.
        """
        if not self._in_block:
            self._client()  # an instance not started, closed or unusable says so first
            raise _outside_block()
        try:
            if (first := self._failed) is not None:
                self._client()  # an instance that send left unusable says so first
                raise send_refused(first) from first
            record = item if isinstance(item, Outgoing) else prepare(item, self.key_by)
            return await self._produce(record)
        except BaseException as exc:
            if self._failed is None:
                self._failed = exc
            raise

    async def flush(self, timeout: float) -> int:
        """Hand buffered records to librdkafka and wait up to ``timeout`` for their delivery
        reports; librdkafka's out-queue length after it (records not yet reported, and
        reports or log lines not yet served), 0 when nothing is left.

        Not a count of failures: a record whose delivery failed has been reported, so it
        counts 0; its future (from :meth:`send`) holds the error, and the commit checks
        every future before it asks for the commit."""
        try:
            left: int = await self._client().flush(timeout)
        except (KafkaException, SystemError) as exc:
            unheld(exc)
            raise self._settled(exc, "flush") from exc
        return left

    async def abort(self, timeout: float = 60.0) -> None:
        """Abort the open transaction, whose commit was not requested: none of its records
        become visible.

        Order of effects: flush what is queued (bounded), then the abort marker, both
        within ``timeout``. Not confirmed in time (the broker away) or fenced: this
        instance is unusable (:class:`TransientProduceError`, nothing committed, or
        :class:`ProducerFencedError`), and the broker aborts the transaction itself (its
        timeout, or the next instance's ``init_transactions``): a crash anywhere here
        leaves nothing visible.
        """
        aio = self._client()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            await self._guard(self._bounded_flush(aio, deadline))
            await self._guard(aio.abort_transaction(max(deadline - loop.time(), 0.1)))
        except OutcomeUnknownError as exc:  # the flush ran out of time
            self._broken = TransientProduceError(
                f"abort not confirmed ({exc}); nothing of the transaction was committed: "
                "close this instance, then send the same records again from a new one"
            )
            raise self._broken from None
        except (KafkaException, SystemError) as exc:
            unheld(exc)
            self._broken = abort_failed(exc)
            raise self._broken from exc

    async def close(self, timeout: float = 30.0) -> None:
        """Deliver what is buffered (up to ``timeout``), drop the rest, release the threads.

        Order of effects, as the synchronous ``close()``: the instance lets go of its
        client (later calls raise :class:`ProduceError`); flush; what is still queued, or
        all of it when the flush raises (fenced, librdkafka's fatal state), is logged at
        WARNING with its count (the records not delivered when it began that it did not
        deliver, not librdkafka's out-queue length, which also counts each report waiting
        to be served) and purged; AIOProducer closes; the threads are released.
        Never raises for a fenced or broken instance: there is nothing left to save, and
        a ``finally: await close()`` must not replace the error the caller acts on. A
        cancel (Ctrl-C under ``asyncio.run``) during the flush is not lost either: the
        same steps run, within :data:`AFTER_CANCEL_S` (the cancelled flush may still hold
        a thread), then the cancel is raised again. No commit is asked for: a transaction
        left open stays invisible and the broker aborts it (its timeout, or the next
        instance's ``init_transactions``), so a crash at any step leaves nothing of it
        visible.
        """
        aio, executor = self._aio, self._executor
        self._aio = self._executor = None
        self._closed = True
        try:
            if aio is None:
                return
            pending = [future for future in self._sent if not future.done()]
            failed: BaseException | None = None
            interrupted: BaseException | None = None
            try:
                queued: int | None = await aio.flush(timeout)
            except (KafkaException, SystemError) as exc:
                unheld(exc)
                queued, failed = None, exc
            except (asyncio.CancelledError, KeyboardInterrupt, SystemExit) as exc:
                queued, interrupted = None, exc
                task = asyncio.current_task()
                if isinstance(exc, asyncio.CancelledError) and task is not None:
                    task.uncancel()  # taken: so that the bound below can time out (3.11.0-2
                    # turn a timeout into TimeoutError only with no cancel pending)
            if interrupted is None:
                await self._drop_rest(aio, pending, queued, failed, timeout, None)
                return
            try:
                async with asyncio.timeout(AFTER_CANCEL_S):
                    await self._drop_rest(aio, pending, queued, failed, timeout, interrupted)
            except TimeoutError:
                log.warning(
                    "closing the producer was interrupted (%s) and its threads did not "
                    "answer in %g s: %d record(s) not confirmed delivered, dropped",
                    type(interrupted).__name__,
                    AFTER_CANCEL_S,
                    _undelivered(pending),
                )
            raise interrupted
        finally:
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)

    async def _drop_rest(
        self,
        aio: AIOProducer,
        pending: list[asyncio.Future[Message]],
        queued: int | None,
        failed: BaseException | None,
        timeout: float,
        interrupted: BaseException | None,
    ) -> None:
        """:meth:`close` after its flush: serve the reports, say what is dropped, purge it,
        close AIOProducer."""
        await _serve(aio)  # reports that came as the flush gave up, or behind its error
        if queued is None:
            queued = len(aio)  # librdkafka's out-queue and AIOProducer's buffer
        dropped = _undelivered(pending)
        unreported = sum(not future.done() for future in pending)
        warn_dropped(log, failed, dropped, timeout, queued, unreported, interrupted)
        if queued or dropped:
            _errors_seen(self._sent)  # counted above: no ERROR line for each
            try:
                await aio.purge()
            except (KafkaException, SystemError) as exc:
                unheld(exc)
                log.warning("closing the producer: purge failed: %s", str(exc))
        try:
            await aio.close()  # stops its timer task; flushes again, now empty
        except (KafkaException, SystemError) as exc:
            unheld(exc)
            log.info("closing a producer that cannot deliver: %s", str(exc))

    # --- internals ----------------------------------------------------------------------

    async def _begin(self, timeout: float) -> None:
        aio = self._client()
        try:
            await self._guard(aio.begin_transaction())
        except (KafkaException, SystemError) as exc:
            unheld(exc)
            raise self._settled(exc, "begin_transaction") from exc
        self._sent = []
        self._failed = None
        self._drain_s = timeout
        self._unflushed = self._unflushed_bytes = 0

    async def _produce(self, record: Outgoing) -> asyncio.Future[Message]:
        """Queue ``record`` in the open transaction, after a flush when the local queue
        is half full (so that it never refuses a record for want of room)."""
        size = record_size(record)
        check_fit(record, size, self._limits)
        aio = self._client()
        if self._unflushed >= self._room or self._unflushed_bytes + size > self._room_bytes:
            loop = asyncio.get_running_loop()
            try:
                await self._guard(self._bounded_flush(aio, loop.time() + self._drain_s))
            except OutcomeUnknownError:
                raise TransientProduceError(
                    f"the local queue did not drain in {self._drain_s:g} s (the transaction's "
                    "timeout); nothing of the "
                    "transaction is committed: send the same records again"
                ) from None
            except (KafkaException, SystemError) as exc:
                unheld(exc)
                raise self._settled(exc, "flush") from exc
            self._unflushed = self._unflushed_bytes = 0
        try:
            future: asyncio.Future[Message] = await aio.produce(
                self.topic, value=record.value, key=record.key
            )
        except (KafkaException, SystemError) as exc:
            unheld(exc)
            raise self._settled(exc, "produce") from exc
        self._sent.append(future)
        self._unflushed += 1
        self._unflushed_bytes += size
        return future

    async def _bounded_flush(self, aio: AIOProducer, deadline: float) -> None:
        """Flush until nothing is left; OutcomeUnknownError when ``deadline`` passes."""
        loop = asyncio.get_running_loop()
        while True:
            left_s = deadline - loop.time()
            if left_s <= 0:
                raise OutcomeUnknownError("records not delivered in time, outcome unknown")
            if await aio.flush(min(left_s, _CALL_SLICE_S)) == 0:
                return

    async def _commit(self, deadline: float) -> None:
        """Flush (bounded); check every record's delivery; commit_transaction, again while
        it fails retriably.

        Order of effects: the flush delivers every record into the open transaction; a
        record that failed (its future holds the error) raises :class:`_Undelivered`
        before any commit is asked for, so the caller aborts and nothing is visible (the
        broker's transaction never held a record the client refused, and would commit
        the others without it); then the commit. A crash before the commit request
        leaves the transaction to be aborted by the broker (its timeout, or the next
        instance's ``init_transactions``). A cancellation anywhere here, in the pauses
        between calls too, leaves this instance unusable (:class:`OutcomeUnknownError`):
        a commit may have been asked. AIOProducer.commit_transaction flushes without a
        timeout first; flushing here with the time left keeps a frozen broker from
        holding the caller past ``deadline``.
        """
        aio = self._client()
        loop = asyncio.get_running_loop()
        asked = False  # a commit request went out: from then on, its outcome is unknown
        while True:
            try:
                await self._guard(self._bounded_flush(aio, deadline))
                if not all(f.done() for f in self._sent):
                    # AIOProducer's timer had taken records from its buffer but not yet
                    # handed them to librdkafka when the flush looked: flush again.
                    await self._guard(asyncio.sleep(0.01))
                    continue
                errors = _errors(self._sent)
                if errors:
                    raise _Undelivered(f"{len(errors)} record(s) not delivered")
                left_s = deadline - loop.time()
                if left_s <= 0:
                    raise OutcomeUnknownError("commit not confirmed in time, outcome unknown")
                asked = True
                await self._guard(aio.commit_transaction(min(left_s, _CALL_SLICE_S)))
                return
            except (KafkaException, SystemError) as exc:
                unheld(exc)
                err = kafka_error(exc)
                if err is None:  # a SystemError with no error behind it
                    self._broken = unexplained(exc, "commit_transaction", asked)
                    raise self._broken from exc
                action = txn_action(err)
                if action == "retry":
                    log.warning("commit_transaction retriable error, retrying: %s", err)
                    await self._guard(asyncio.sleep(RETRY_PAUSE_S))
                    continue
                if action == "abort":
                    raise _AbortRequired(err.str()) from exc
                self._broken = settle(err, "commit_transaction")
                raise self._broken from exc
            except OutcomeUnknownError as exc:
                if await self._topic_missing(aio):
                    self._broken = topic_missing(self.topic)
                    raise self._broken from None
                if asked:
                    self._broken = exc
                    raise
                self._broken = TransientProduceError(
                    f"records not delivered in time ({exc}), no commit asked for: nothing of "
                    "the transaction was committed; close this instance, then send the same "
                    "records again from a new one"
                )
                raise self._broken from None

    async def _not_committed(self, causes: list[KafkaError]) -> ProduceError:
        """As the synchronous ``_not_committed``: records the broker refused as too large
        weighed against the topic's limit read now; a verdict that a new instance must
        resend leaves this one unusable."""
        batch = None
        if too_large(causes):
            batch = await asyncio.to_thread(
                refusal_batch, self._conf, self.topic, self._batch_bytes
            )
        error = not_committed(causes, self.topic, batch)
        if batch is not None and isinstance(error, TransientProduceError):
            self._broken = error
        return error

    async def _topic_missing(self, aio: AIOProducer) -> bool:
        """Whether a transaction not confirmed in time failed for want of its topic (see
        the synchronous ``_not_confirmed``): then none of its records was written, and
        nothing can be committed. Order of effects: the metadata read; when the topic is
        missing, the records still queued are purged (none can reach it and be committed
        later, and close() need not wait for them). A crash at any step leaves nothing
        committed."""
        try:
            meta = await self._guard(aio.list_topics(self.topic, timeout=TOPIC_LOOK_S))
        except (KafkaException, SystemError) as exc:  # no answer: it cannot say
            unheld(exc)
            return False
        if not topic_absent(meta, self.topic):
            return False
        try:
            await self._guard(aio.purge(in_queue=True, in_flight=False))
        except (KafkaException, SystemError) as exc:
            unheld(exc)
            log.warning("purging the records of the missing topic %s failed: %s", self.topic, exc)
        return True

    def _settled(self, exc: BaseException, what: str) -> ProduceError:
        settled, broken = call_failed(exc, what)
        if broken:
            self._broken = settled
        return settled


def _outside_block() -> ProduceError:
    """The error of a :meth:`AsyncActivityProducer.send` with no :meth:`transaction` block
    open (the record not queued). Pure."""
    return ProduceError(
        "send() refused: no open transaction (send() queues a record only inside "
        "`async with producer.transaction():`; or use send_transaction()); nothing was queued"
    )


class _AbortRequired(Exception):
    """A commit failed with an error that requires abort_transaction."""


class _Undelivered(Exception):
    """Records of the open transaction failed delivery: it must be aborted, not committed."""


def _errors(futures: Sequence[asyncio.Future[Message]]) -> list[KafkaError]:
    """The delivery errors among ``futures`` that are done (each one retrieved, so asyncio
    logs no "exception was never retrieved")."""
    out = []
    for f in futures:
        if f.done() and not f.cancelled() and (exc := f.exception()) is not None:
            err = kafka_error(exc)
            out.append(err if err is not None else KafkaError(KafkaError._FAIL, repr(exc)))
    return out


def _undelivered(futures: Sequence[asyncio.Future[Message]]) -> int:
    """How many of ``futures`` were not delivered (yet): no report, or a failed one."""
    return sum(
        not future.done() or future.cancelled() or future.exception() is not None
        for future in futures
    )


async def _serve(aio: AIOProducer) -> None:
    """Serve the delivery reports queued now; a client in librdkafka's fatal state may
    raise its error again: it is known already."""
    try:
        await aio.poll(0)
    except (KafkaException, SystemError) as exc:
        unheld(exc)


def _errors_seen(futures: Sequence[asyncio.Future[Message]]) -> None:
    """Retrieve each failed record's error now, or when it comes, so that asyncio does not
    log it as "Future exception was never retrieved": the error of the transactional call
    (or close()'s count of dropped records) already says what became of them. A caller
    holding a future can still await it."""
    for future in futures:
        if future.done():
            _seen(future)
        else:
            future.add_done_callback(_seen)


def _seen(future: asyncio.Future[Message]) -> None:
    if not future.cancelled():
        future.exception()


async def _deliveries(futures: Sequence[asyncio.Future[Message]]) -> list[Delivery]:
    """The committed records' coordinates (the commit flushed: every future is done)."""
    if not all(f.done() for f in futures):
        await asyncio.wait(futures, timeout=_CALL_SLICE_S)
    out = []
    for f in futures:
        if not f.done() or f.cancelled() or f.exception() is not None:
            raise OutcomeUnknownError("committed, but a delivery report is missing")
        msg = f.result()
        out.append(Delivery(msg.partition() or 0, msg.offset() or 0))
    return out
