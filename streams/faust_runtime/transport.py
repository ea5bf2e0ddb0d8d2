"""The faust/aiokafka classes this runtime replaces, and why each one.

faust-streaming 0.15 decides offsets from its own ack bookkeeping. Every override below
removes one path by which faust could commit, skip or re-read an offset on its own
(docs/faust.md lists the upstream issues and code paths):

- :meth:`AcklineConsumer.ack` marks a message done for faust's in-flight tracking
  (``wait_empty`` at revoke and shutdown) but never records its offset: no ack — not
  take()'s ``finally`` ack, not the ack of a skipped stale-generation message, not an ack
  in a finally after an exception — can make an offset committable;
- :meth:`AcklineConsumer._filter_tps_with_pending_acks` and
  :meth:`AcklineConsumer._filter_committable_offsets` make faust's commit timer (and its
  commits at revoke, on task errors and at shutdown) commit the PostgreSQL next offsets of
  the :class:`~.ledger.Ledger`, never an offset derived from acks (``_new_offset``, the
  head-gap arithmetic of faust #606 and #312);
- :meth:`AcklineConsumer._add_gap` is a no-op and ``_read_offset`` never answers, so
  faust neither fills "gaps" as acked nor drops a record as "already read"
  ("DROPPED MESSAGE ROFF"): the ledger alone refuses repeats;
- :meth:`AcklineConsumer.seek_to_committed`, which faust calls (``perform_seek``) after
  each assignment before it resumes the flow, claims the partitions in PostgreSQL and
  seeks them to the DB next offsets instead of Kafka's committed offsets;
- :class:`AcklineRebalanceListener` numbers every assignment anew: faust's
  ``consumer_generation_id`` is Kafka's generation, which the broker repeats when a
  follower rejoins a stable group alone, and an assignment that repeats it was never
  claimed (the claim is once per number) though its revoke had released everything;
- :class:`AcklineConsumerThread` fetches with ``isolation_level=read_committed`` (faust
  reads uncommitted records unless processing_guarantee is exactly_once, whose
  transactional commit path this runtime does not use) and checks it after start; and it
  takes, once a second, the error aiokafka's group coordinator holds for ``getmany``
  (which faust never calls), without which the coordinator never joined again after a
  refused join.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, cast

import faust
import faust.tables
from aiokafka.consumer.fetcher import READ_COMMITTED
from aiokafka.errors import IllegalStateError, InconsistentGroupProtocolError, KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition
from faust.transport.consumer import ensure_TPset
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, Message
from faust.types.transports import TPorTopicSet, TransportT
from faust.types.tuples import ack_lock
from mode import Service
from mode.utils.futures import notify

from ackline.core.faults import DISARMED, Faults
from ackline.core.logs import die
from ackline.streams.errors import StreamError, join_refused, join_refused_grace_s
from ackline.streams.faust_runtime.bytebound import ByteBoundQueue
from ackline.streams.group_errors import GroupErrorStreak
from ackline.streams.ownership import Ledger

log = logging.getLogger(__name__)

_GROUP_ERRORS_EVERY_S = 1.0
"""How often the consumer thread takes the errors aiokafka's group coordinator holds."""
_MARKS_S = 10.0
"""The longest wait for a claim's watermarks (log start and end) before it goes on
without them."""
_POSITION_S = 1.0
"""The longest wait for a partition's position (one being reset has none yet) in a lag
report: the report goes on without it."""


class IsolationError(StreamError):
    """The aiokafka consumer would read uncommitted (possibly aborted) records."""


class UnboundedFetchError(StreamError):
    """The aiokafka consumer would fetch more per request than the app's byte bound."""


@dataclass
class Ownership:
    """What the consumer needs from the runtime: the ledger and how to claim.

    ``claim(partitions, generation, marks, start_from)`` bumps the epochs in PostgreSQL
    and records the claims in ``ledger`` (see
    :meth:`ackline.streams.faust_runtime.sink.FaustSink.claim`); ``revoking()`` is the
    context faust's revoke runs in (the revoke_in_flight fault point, and the bound on
    its wait for the batch in flight: :meth:`~.sink.FaustSink.revoking`); ``faults`` holds
    the ``after_assign`` point (:meth:`AcklineConsumer.seek_to_committed`).
    """

    topic: str
    start_from: str
    ledger: Ledger
    claim: Callable[
        [list[tuple[str, int]], int, Mapping[tuple[str, int], tuple[int, int]], str],
        Awaitable[None],
    ]
    revoking: Callable[[], AbstractAsyncContextManager[None]]
    faults: Faults = DISARMED
    seek_deadline_s: float = 80.0
    """The bound on one :meth:`AcklineConsumer.seek_to_committed` as a whole, inside
    faust's recovery wait for it (``broker_request_timeout``)."""


class _NoReadOffsets(dict[TP, int | None]):
    """faust's ``_read_offset`` map, made mute: every lookup answers None.

    faust drops a fetched record whose offset is below the partition's read offset and
    fills offset gaps above it as acked; with no read offset it does neither. Repeats
    are refused by the ledger instead (:meth:`~.ledger.Ledger.admit`).
    """

    def __getitem__(self, key: TP) -> None:
        return None

    def __setitem__(self, key: TP, value: int | None) -> None:
        return None

    def update(self, *args: Any, **kwargs: Any) -> None:
        return None


def handed_ends(records: Mapping[Any, Sequence[Any]]) -> dict[tuple[str, int], int]:
    """Per partition, the offset after the last record of one fetch's ``records``
    (aiokafka's ``fetched_records``: each partition's records in offset order). Pure."""
    return {(tp.topic, tp.partition): recs[-1].offset + 1 for tp, recs in records.items() if recs}


class AcklineConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """The aiokafka consumer thread, fetching only committed records, and noting how far
    it handed records to faust (:meth:`_fetch_records`, for the lag: :meth:`lag_marks`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handed: dict[tuple[str, int], int] = {}
        """Per partition, the offset after the highest record aiokafka handed to faust:
        every record below it is in faust's buffers, in a batch, or written (or refused
        and read again after a seek back). Written only on this thread's loop."""
        self._session_ms = int(self.app.conf.broker_session_timeout * 1000)
        self._streak = GroupErrorStreak(join_refused_grace_s(self._session_ms))

    def _create_worker_consumer(self, transport: faust_aiokafka.Transport) -> Any:
        """faust's aiokafka consumer, reading committed records only and fetching at most
        the app's ``buffer_max_bytes`` per request (faust passes no ``fetch_max_bytes``:
        aiokafka's default is 50 MiB). Both attributes are read by
        ``AIOKafkaConsumer.start()`` when it builds its fetcher."""
        consumer = super()._create_worker_consumer(transport)
        consumer._isolation_level = "read_committed"
        consumer._fetch_max_bytes = cast(AcklineApp, self.app).buffer_max_bytes
        return consumer

    async def _fetch_records(
        self,
        consumer: Any,
        active_partitions: set[TP],
        timeout: float | None = None,
        max_records: int | None = None,
    ) -> Any:
        """faust's fetch of the records aiokafka has buffered, noting how far each
        partition's records go (:attr:`handed`).

        Order of effects, on this thread's loop with no await between them: aiokafka
        hands the records out and moves its positions past them (and past the
        transaction markers and aborted records after them); :attr:`handed` moves. So a
        position read on this loop never counts a record that :attr:`handed` does not
        (:meth:`lag_marks`). A crash loses nothing: both are this process's memory.
        """
        records = await super()._fetch_records(
            consumer, active_partitions, timeout=timeout, max_records=max_records
        )
        for tp, end in handed_ends(records).items():
            self.handed[tp] = max(self.handed.get(tp, 0), end)
        return records

    @Service.timer(_GROUP_ERRORS_EVERY_S)
    async def _group_errors(self) -> None:
        """:meth:`_take_group_errors` on this thread's loop, once a second: faust does
        not fetch before a first assignment, so a fetch could not take them."""
        consumer = self._consumer
        if consumer is not None:
            self._take_group_errors(consumer)

    def _take_group_errors(self, consumer: Any) -> None:
        """Take the error aiokafka's group coordinator holds for the user.

        aiokafka hands a join's fatal error (INCONSISTENT_GROUP_PROTOCOL: a member of the
        other runtime is in the group; an authorization refused) to ``getmany``, and its
        coordinator waits until it is taken before it tries to join again. faust fetches
        without ``getmany``: the error was never taken, and the worker waited for ever,
        owning nothing, logging nothing. Taken here, on this thread's loop: the
        coordinator then joins again, with a WARNING at the first error. Errors that
        keep coming for :func:`~ackline.streams.errors.join_refused_grace_s`
        (:class:`~ackline.streams.group_errors.GroupErrorStreak`), or a coordination routine that
        ended with an error (it never runs again: no heartbeat, the partitions handed to
        others while faust fetches on), stop the worker as SIGTERM does, the line
        recorded for its exit (status 2, :attr:`AcklineApp.refusal`)."""
        coordinator = getattr(consumer, "_coordinator", None)
        routine = getattr(coordinator, "_coordination_task", None)
        if coordinator is None or (routine is not None and routine.cancelled()):
            return  # closing: the routine's cancellation is not an error to take
        group = str(self.app.conf.id)
        if routine is not None and routine.done() and routine.exception() is not None:
            self._refuse(
                f"the coordination of consumer group {group} ended "
                f"({routine.exception()!r}): stopping rather than fetching outside the group"
            )
            return
        generation = int(getattr(coordinator, "generation", -1))
        try:
            coordinator.check_errors()
        except KafkaError as exc:
            code = getattr(exc, "errno", None)
            line = join_refused(group, code, repr(exc), self._session_ms)
            began = self._streak.since
            if self._streak.error(time.monotonic(), generation):
                self._refuse(line)
            elif self._streak.since != began:  # a streak begins (again, after a silence)
                log.warning(
                    "%s; joining again for up to %.0f s%s",
                    line,
                    self._streak.grace_s,
                    " (a member of the other runtime killed a moment ago stays until its "
                    "session times out)"
                    if isinstance(exc, InconsistentGroupProtocolError)
                    else "",
                )
        else:
            self._streak.clean(generation)

    def _refuse(self, line: str) -> None:
        """Stop as SIGTERM does, ``line`` the run's exit (status 2); once."""
        app = cast(AcklineApp, self.app)
        if app.refusal is None:
            app.refusal = line
            log.error("%s", line)
            os.kill(os.getpid(), signal.SIGTERM)

    async def lag_marks(
        self, tps: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[int | None, int | None]]:
        """(position, handed) of each of ``tps``, read together on this thread's loop."""
        return cast(
            dict[tuple[str, int], tuple[int | None, int | None]],
            await self.call_thread(self._lag_marks, tps),
        )

    async def _lag_marks(
        self, tps: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[int | None, int | None]]:
        """Each partition's position and then, with no await between, its :attr:`handed`
        (None: not assigned, or no valid position within :data:`_POSITION_S`)."""
        consumer = self._ensure_consumer()
        found: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        for tp in tps:
            try:
                async with asyncio.timeout(_POSITION_S):
                    position = await consumer.position(TopicPartition(*tp))
            except (IllegalStateError, TimeoutError):
                position = None
            found[tp] = (position, self.handed.get(tp))
        return found

    async def _commit(self, offsets: Mapping[TP, int]) -> bool:
        """Commit ``offsets`` (the DB next offsets) to Kafka; advisory, so never fatal.

        Order of effects: keep the partitions still assigned; one OffsetCommit request;
        on success note the time (faust's livelock check). A crash or a failure at any
        step leaves Kafka at or behind the DB offsets, which decide where work resumes.

        faust crashes the consumer — and with it the worker — when a commit raises
        anything but a rebalance (a broker restart, a timeout). Here a failed commit is
        logged and retried at the next commit interval; the DB offsets decide where a
        partition resumes either way.
        """
        consumer = self._ensure_consumer()
        assigned = self.assignment()
        wanted = {
            faust_aiokafka.ensure_aiokafka_TP(tp): OffsetAndMetadata(offset, "")
            for tp, offset in offsets.items()
            if tp in assigned
        }
        if not wanted:
            return False
        try:
            await consumer.commit(wanted)
        except Exception as exc:
            log.warning("advisory Kafka commit of %s failed: %r", dict(offsets), exc)
            return False
        now = time.monotonic()
        self.tp_last_committed_at.update({TP(tp.topic, tp.partition): now for tp in wanted})
        return True

    async def request_rejoin(self) -> None:
        """Make aiokafka rejoin the group (the ``after_assign=rejoin`` fault), as its own
        OffsetCommit answered REBALANCE_IN_PROGRESS or a metadata change does. On this
        thread's loop, where the group coordinator runs."""
        self._ensure_consumer()._coordinator.request_rejoin()

    async def on_start(self) -> None:
        await super().on_start()
        fetcher = getattr(self._consumer, "_fetcher", None)
        if getattr(fetcher, "_isolation_level", None) != READ_COMMITTED:
            raise IsolationError("the aiokafka fetcher is not read_committed; refusing to run")
        bound = cast(AcklineApp, self.app).buffer_max_bytes
        if getattr(fetcher, "_fetch_max_bytes", None) != bound:
            raise UnboundedFetchError("aiokafka's fetch_max_bytes is not the app's byte bound")


class AcklineRebalanceListener(faust_aiokafka.ConsumerRebalanceListener):
    """faust's rebalance listener, with a number of ackline's own for each assignment.

    faust sets ``app.consumer_generation_id`` to Kafka's generation at every assignment,
    and everything that tells one assignment from the next compares it: message stamps,
    getmany's check, the streams' stale skip, the recovery, the claim (once per number,
    :meth:`AcklineConsumer.seek_to_committed`). But the broker gives a follower that
    rejoins a stable group with unchanged metadata the generation it has (classic
    protocol), and aiokafka, which rejoins a follower alone when its rejoin flag is set
    after its SyncGroup was sent (an OffsetCommit answered REBALANCE_IN_PROGRESS, a
    partition count change), still revokes and assigns: the revoke released every
    partition, the assignment in the same generation claimed none, and the worker
    dropped its partitions' records as unowned until the next real rebalance (in a
    stable group, for good). Here every assignment gets the previous number + 1, so all
    of the above changes at each one: it is claimed, and records fetched before it are
    stale. aiokafka's own requests (commits, heartbeats) use its coordinator's
    generation, which this does not touch.
    """

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        """Order of effects, on the consumer thread's loop, where faust sets Kafka's
        generation: the new assignment number is set on the app (records converted from
        here on are stamped with it; the flow stays stopped until the seek); logged with
        Kafka's generation; then faust's assignment callbacks get it. Nothing durable: a
        crash leaves nothing of it."""
        app = self._thread.app
        number = app.consumer_generation_id + 1
        app.consumer_generation_id = number
        kafka = self._thread._ensure_consumer()._coordinator.generation
        log.info("assignment %d (Kafka generation %d)", number, kafka)
        await self._thread.on_partitions_assigned(ensure_TPset(assigned), number)


class AcklineConsumer(faust_aiokafka.Consumer):
    """faust's aiokafka consumer with ackline's offsets; see the module docstring."""

    RebalanceListener = AcklineRebalanceListener

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_offset = _NoReadOffsets()
        self._seek_lock = asyncio.Lock()  # one claim per assignment, one seek at a time
        self._revokes = 0  # revokes begun: a claim or seek that one overtook is void
        self._claimed_at = 0  # _revokes when the last claim was sought: the flow may resume
        # (assignment number, _revokes) when the main loop took the last assignment: a
        # claim is of that assignment, and void if a revoke began since
        self._assigned_at = (0, 0)

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return AcklineConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def _ownership(self) -> Ownership:
        return cast(AcklineApp, self.app).ownership

    async def lag_marks(
        self, tps: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[int | None, int | None]]:
        """(position, how far records were handed to faust) of each of ``tps``
        (:meth:`AcklineConsumerThread.lag_marks`)."""
        return await cast(AcklineConsumerThread, self._thread).lag_marks(tps)

    async def rejoin(self) -> None:
        """Make aiokafka rejoin the group (:meth:`AcklineConsumerThread.request_rejoin`):
        the revoke releases every partition and the next assignment claims them afresh."""
        thread = cast(AcklineConsumerThread, self._thread)
        await thread.call_thread(thread.request_rejoin)

    # ---- acks: in-flight tracking only ----------------------------------------------

    def ack(self, message: Message) -> bool:
        """Mark ``message`` done for faust's in-flight tracking; never touch offsets.

        Order of effects: the message leaves faust's unacked set and a ``wait_empty``
        waiter is woken. No offset is recorded, so nothing here can make an offset
        committable: only a PostgreSQL commit does (:meth:`_filter_committable_offsets`).
        """
        with ack_lock:
            if message.acked:
                return False
            message.acked = True
            self._unacked_messages.discard(message)
            notify(self._waiting_for_ack)
            return True

    async def _add_gap(self, tp: TP, offset_from: int, offset_to: int) -> None:
        return None

    # ---- commits: the PostgreSQL offsets only ----------------------------------------

    def _filter_tps_with_pending_acks(self, topics: TPorTopicSet | None = None) -> Iterator[TP]:
        for topic, partition in self._ownership().ledger.commit_targets():
            tp = TP(topic, partition)
            if topics is None or tp in topics or topic in topics:
                yield tp

    def _filter_committable_offsets(self, tps: Iterable[TP]) -> dict[TP, int]:
        """The offsets faust may commit: the DB next offsets the ledger holds for ``tps``
        (only those still owned and moved since the last Kafka commit)."""
        targets = self._ownership().ledger.commit_targets(tps)
        return {TP(t, p): offset for (t, p), offset in targets.items()}

    async def _commit_offsets(
        self, offsets: Mapping[TP, int], start_new_transaction: bool = True
    ) -> bool:
        """faust's commit of ``offsets`` (DB next offsets), then noted in the ledger.

        Order of effects: Kafka commit (advisory: the DB offset decides where a
        partition resumes); on success the ledger records it so it is not re-sent. A
        crash between leaves Kafka at or behind the DB, never ahead.
        """
        done = await super()._commit_offsets(offsets, start_new_transaction)
        if done:
            self._ownership().ledger.kafka_committed(
                {(tp.topic, tp.partition): o for tp, o in offsets.items()}
            )
        return done

    # ---- assignment: the PostgreSQL offsets are the truth ------------------------------

    async def seek_to_committed(self) -> Mapping[TP, int]:
        """Claim the assigned partitions in PostgreSQL and seek them to the DB offsets.

        faust calls this through ``perform_seek`` after every assignment, before it
        resumes the flow, and again when a fetch returns while the flow is stopped.
        Order of effects, under a lock: read the partitions' (log start, log end); claim
        (epochs bumped, the start_from end stored where no offset is) once per assignment
        (its number: :class:`AcklineRebalanceListener`) — never again within one, so a
        seek during a revoke cannot take back partitions being handed over; seek each
        owned partition to its DB next offset (a partition whose claim stored nothing, to
        the log start); the ``after_assign`` fault point, after a claim (``rejoin`` there
        makes aiokafka rejoin the group); return the DB offsets. A crash after the claim
        leaves only a higher epoch (the next claim bumps it again); records fetched before
        the seek carry an older assignment number or offset and the ledger refuses them.
        faust resumes the flow only after this returns (``Recovery._resume_streams``),
        and it gives up on a seek after ``broker_request_timeout``, so the claim has a
        shorter deadline of its own and exits the process when it passes
        (:meth:`ackline.streams.faust_runtime.sink.FaustSink.claim`).

        A revoke that began since the main loop took the assignment (before the seek
        started, or while the claim waits on PostgreSQL and the marks on the broker)
        makes it void: faust's recovery checks nothing after the seek and would
        resume the flow while the next generation joins, with the revoked partitions owned
        again by this late claim. So the ledger releases what it holds and this raises
        IllegalStateError, which the recovery takes for "rebalance again": the flow stays
        stopped until the next assignment is claimed and sought. Its epochs stay bumped
        (the next owner bumps them again).

        The whole (the lock, the watermarks, the claim, the seek) has a deadline inside
        faust's wait (``Ownership.seek_deadline_s``), past which the process exits
        (crash-only): at the end of its wait faust cancels this and its recovery stops
        for good (``Recovery._wait`` raises ServiceStopped), so the flow stayed stopped
        with the partitions held, a stall until a restart. The claim's own deadline
        bounds its statement only.
        """
        own = self._ownership()
        bound = asyncio.timeout(own.seek_deadline_s)
        try:
            async with bound:
                return await self._claim_and_seek(own)
        except TimeoutError as exc:
            if not bound.expired():
                raise
            die(f"claiming and seeking took over {own.seek_deadline_s:g} s", exc)

    async def _claim_and_seek(self, own: Ownership) -> Mapping[TP, int]:
        """:meth:`seek_to_committed`'s work, under the seek lock."""
        async with self._seek_lock:
            generation, revokes = self._assigned_at
            if generation != self.app.consumer_generation_id:
                # numbered on the consumer thread, not yet taken here: its own recovery claims
                raise IllegalStateError("an assignment not yet taken: no claim before it")
            claimed = own.ledger.generation != generation
            if claimed:
                assigned = sorted(
                    (tp.topic, tp.partition) for tp in self.assignment() if tp.topic == own.topic
                )
                await own.claim(assigned, generation, await self._marks(assigned), own.start_from)
            positions = own.ledger.resume_offsets()
            await self.seek_positions(positions)
            if self._revokes != revokes:
                own.ledger.release(own.ledger.tracked())
                log.warning(
                    "a revoke came while partitions %s were claimed and sought: released; "
                    "the next assignment claims again",
                    sorted(p for _, p in positions),
                )
                raise IllegalStateError("a revoke overtook the claim and seek")
            if claimed:
                self._claimed_at = revokes
                if await own.faults.ahit("after_assign"):
                    await self.rejoin()
            return {TP(t, p): off for (t, p), off in positions.items() if off is not None}

    def resume_flow(self) -> None:
        """faust's resume of the flow, unless a revoke began after the last claim was
        sought. The recovery resumes the flow a loop turn or two after the seek returns; a
        revoke that began in between (its first step stops the flow) would otherwise see
        the flow running through the next join, and the next generation's records reach
        the agent before its claim. Then the flow stays stopped until the next
        assignment's claim and seek (faust resumes it after them)."""
        if self._revokes != self._claimed_at:
            log.info("a revoke began after the last claim: the flow resumes after the next one")
            return
        super().resume_flow()

    async def seek_positions(self, offsets: Mapping[tuple[str, int], int | None]) -> None:
        """Seek each partition to its offset; None: to the log start."""
        known = {TP(t, p): off for (t, p), off in offsets.items() if off is not None}
        fresh = [TP(t, p) for (t, p), off in offsets.items() if off is None]
        if known:
            await self.seek_wait(known)
        if fresh:
            await self._seek_fresh(fresh)

    async def _marks(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """(log start, log end) of ``tps``; empty when the broker does not answer (the
        claim then stores no start and the partitions start at the log start)."""
        parts = [TP(t, p) for t, p in tps]
        try:
            # Bounded well inside faust's recovery wait (broker_request_timeout): a seek
            # that outlasts it is abandoned and the flow, stopped at the revoke, is never
            # resumed. Each lookup alone may take request_timeout_ms (90 s).
            async with asyncio.timeout(_MARKS_S):
                starts = await self.earliest_offsets(*parts)
                ends = await self.highwaters(*parts)
        except Exception as exc:  # the broker decides; the claim goes on without marks
            log.warning("cannot read the watermarks of %s: %r", tps, exc)
            return {}
        return {
            (tp.topic, tp.partition): (starts[tp], ends[tp])
            for tp in parts
            if tp in starts and tp in ends
        }

    async def _seek_fresh(self, tps: list[TP]) -> None:
        """Partitions with no DB offset at all: the log start (never the end: "latest"
        is stored at the claim when the watermarks are known, and guessing it here could
        skip records produced since another worker's claim)."""
        thread = cast(AcklineConsumerThread, self._thread)
        consumer = thread._ensure_consumer()
        parts = [faust_aiokafka.ensure_aiokafka_TP(tp) for tp in tps]
        await thread.call_thread(consumer.seek_to_beginning, *parts)

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        """faust's assignment, on the main loop, after noting its number and the revokes
        begun so far: its claim is void if another revoke begins before it is sought,
        however early (:meth:`seek_to_committed`)."""
        self._assigned_at = (generation_id, self._revokes)
        await super().on_partitions_assigned(assigned, generation_id)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        """faust's revoke (stop the flow, wait for the in-flight batch to be acked, commit
        the DB offsets), then the ledger stops owning ``revoked``. faust's wait has no
        bound; past ``ACKLINE_REVOKE_WAIT_S`` the sink cancels the write it waits for.

        faust stops the flow only when something was assigned. A worker that held nothing
        (a standby: more workers than partitions) kept it running, so the records it
        fetched for its next assignment reached the agent while the claim waited, before
        the seek to the DB offsets, stamped with the new generation: the first batch
        started past the DB offset and committed, and the seek back found everything in
        between "already taken" (thousands of events lost). The flow is stopped here in
        every case; the recovery resumes it after :meth:`seek_to_committed`, as it does
        for a worker that held partitions.
        """
        self._revokes += 1  # first: a claim or seek under way is void (seek_to_committed)
        if not self.assignment():
            self.stop_flow()
            self.app.flow_control.suspend()
        async with self._ownership().revoking():  # bounded: see FaustSink.revoking
            await super().on_partitions_revoked(revoked)
        self._ownership().ledger.release((tp.topic, tp.partition) for tp in revoked)


class AcklineTransport(faust_aiokafka.Transport):
    Consumer = AcklineConsumer


class NoTablesManager(faust.tables.TableManager):
    """faust's table manager without its start-up wait.

    faust's ``TableManager.on_start`` sleeps one second, for tables declared late, before
    it finalizes the tables and starts recovery; the conductor subscribes only after that,
    so every faust worker joined its group a second late. This runtime declares no tables
    (:func:`ackline.runtime.faust_app.faust_settings`): the wait waited for nothing.
    """

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


class AcklineApp(faust.App):
    """A faust App whose consumer is :class:`AcklineConsumer`.

    Built only by :func:`ackline.runtime.faust_app.make_app`, which sets ``ownership``.
    """

    ownership: Ownership
    buffer_max_bytes: int = 8 * 1_048_576  # set by make_app: ACKLINE_BATCH_MAX_BYTES
    refusal: str | None = None
    """Why the worker stopped itself (a group it cannot join): the run exits 2 with it."""

    def _new_transport(self) -> TransportT:
        return AcklineTransport(self.conf.broker_consumer, self)

    def FlowControlQueue(
        self, maxsize: int | None = None, *, clear_on_resume: bool = False
    ) -> ByteBoundQueue:
        """Every channel's queue, full at ``buffer_max_bytes`` of records as well as at
        ``maxsize`` of them (faust counts records only)."""
        return ByteBoundQueue(
            maxsize or 0,
            max_bytes=self.buffer_max_bytes,
            flow_control=self.flow_control,
            clear_on_resume=clear_on_resume,
        )
