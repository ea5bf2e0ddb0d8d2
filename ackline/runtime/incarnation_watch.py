"""The topic's incarnation, watched while the worker runs (docs/guarantees.md, "A
recreated topic").

The start checks that the group's DB offsets belong to the topic's incarnation in Kafka
(its topic ID). A topic deleted and made again *while* workers ran was not seen: with no
rebalance the fetch went on at the old positions (or, where the new log was shorter, was
reset to its start and the records below the DB offset dropped as read), and a held
partition (DB offset past the new log end) was released once the new log grew past it;
either way the new topic's records below the old offsets were never ingested, the worker
still running. The watch reads the topic ID every :data:`CHECK_S` seconds (and at once
when asked) and, when it changes or is not the recorded one, says the start's refusal
line and stops the worker, which then exits as a refused start does (status 2). Once the
ID was read, a held partition is released only after a read of it that began once the
partition was ready (:meth:`IncarnationWatch.fresh_since`). A batch is written only while
the last read found the topic (:meth:`IncarnationWatch.settled`): records taken after a
read found it gone may be those of the topic made again, at the old offsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import asyncpg
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from ackline.core.tasks import in_daemon_thread
from ackline.sinks.connection import describe
from ackline.sinks.ingest import incarnation
from ackline.streams.admin import admin, drain
from ackline.streams.errors import KafkaUnavailableError
from ackline.streams.kafkainfo import Described, described

log = logging.getLogger(__name__)

CHECK_S = 0.5
"""Between the end of one read of the topic ID and the next (one DescribeTopics on a
client kept open). A read that finds the topic gone holds every batch until one finds it
again (:meth:`IncarnationWatch.settled`), so a deletion that lasts longer than this and
a read is seen, and nothing of the topic made after it is written. A topic deleted and
made again between two reads can go unseen until the next one, which stops the worker:
what it ingests of the new topic meanwhile is kept and nothing is lost (`offsets
adopt-topic` rewinds the group to the new log start, where those records are
duplicates), but it is taken out of order (docs/guarantees.md). It was 2 s, and an
operator's delete-then-create a second apart was missed in 2 tries of 3."""
SETTLE_POLL_S = 0.05
"""How often a batch held by :meth:`IncarnationWatch.settled` looks again."""
READ_S = 5.0
"""The bound of one DescribeTopics."""
MIN_GAP_S = 0.5
"""The least time between two reads, however often the worker asks for one."""

_DB_DOWN: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    OSError,
    TimeoutError,
)


class IncarnationWatch:
    """One worker's watch of ``topic``'s incarnation for ``group``.

    ``confirmed`` is the topic ID this worker has read throughout (checked once against
    the one recorded in ``topic_incarnations``), ``confirmed_at`` the monotonic time the
    last read of it began. ``refusal`` is the refusal line once another incarnation was
    found (the worker is stopping). Until a first read (the ID unreadable) the watch
    holds nothing back: the worker runs unchecked, as the start said.
    """

    def __init__(
        self,
        bootstrap: str,
        conf: Mapping[str, Any],
        topic: str,
        group: str,
        dsn: str,
        connect_timeout_s: float,
        name: str,
        on_missing: Callable[[bool], None] = lambda missing: None,
    ) -> None:
        self._bootstrap, self._conf = bootstrap, dict(conf)
        self.topic, self.group = topic, group
        self._dsn, self._connect_timeout_s, self._name = dsn, connect_timeout_s, name
        self.confirmed: str | None = None
        self.confirmed_at = float("-inf")
        self.refusal: str | None = None
        self.missing = False  # the last read found no such topic: batches are held
        self._client: AdminClient | None = None  # made in the reading thread, kept
        self._recorded = False  # the ID read is known to be the recorded one (or none can be)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poked: asyncio.Event | None = None
        self._unreadable_said = False
        self._db_said = False  # read by a first check that already fails
        self._on_missing = on_missing  # whether Kafka has the topic, at each read

    def start_from(self, confirmed: incarnation.Confirmed | None) -> None:
        """Take the ID the start confirmed (read, and found to be the recorded one) as
        this worker's: the first read is then compared with it, without asking
        PostgreSQL again, so a recreation between the start's check and that read is a
        change under the worker like any other. None (the start could not read or
        check it): the first read is checked against PostgreSQL."""
        if confirmed is not None:
            self.confirmed, self.confirmed_at = confirmed.topic_id, confirmed.read_at
            self._recorded = True

    def fresh_since(self, since: float) -> bool:
        """Whether a partition ready at monotonic time ``since`` may be released: the
        incarnation was confirmed by a read that began at or after it, or the watch
        checks nothing. Thread-safe; False asks the watch to read at once."""
        if self.refusal is not None:
            return False
        if self.confirmed is None or self.confirmed_at >= since:
            return True
        self.poke()
        return False

    async def settled(self, stopping: Callable[[], bool] = lambda: False) -> bool:
        """Whether a batch taken now may be written: at once unless the last read found
        the topic gone; then once a read finds it again and (where the start could not
        confirm an ID) PostgreSQL says it is the recorded one. False when another
        incarnation was found (the worker is stopping: its records may be the new
        topic's at the old offsets), or the topic is still gone once ``stopping()``
        (a stop must not wait on it). A worker whose topic stays deleted writes nothing
        more: the records it had taken of the old one went with it, as the ones it had
        not fetched did."""
        while self.refusal is None and self.missing and not stopping():
            self.poke()
            await asyncio.sleep(SETTLE_POLL_S)
        return self.refusal is None and not self.missing

    def poke(self) -> None:
        """Read the ID at once rather than at the next tick (from any thread)."""
        loop, poked = self._loop, self._poked
        if loop is not None and poked is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: it is stopping
                loop.call_soon_threadsafe(poked.set)

    async def run(self, on_other: Callable[[], None]) -> None:
        """Check until cancelled; on another incarnation set :attr:`refusal`, log it at
        ERROR and call ``on_other`` (which stops the worker), then return. A check that
        fails unexpectedly does the same with its own line: the watch fails closed (a
        worker without it would run on through a recreation).

        Order of effects at each check: read the topic ID (DescribeTopics, in a thread);
        until the ID this worker reads is known to be the recorded one, one autocommitted
        call of ackline_record_topic_id (:func:`ackline.sinks.ingest.incarnation.record`)
        on a connection of its own, which records it where none is and says what is. It
        never replaces a recorded ID, so a crash anywhere leaves what a start finds."""
        self._loop = asyncio.get_running_loop()
        self._poked = asyncio.Event()
        while True:
            began = time.monotonic()
            try:
                line = await self._check(began)
            except Exception as exc:
                log.error("the topic incarnation check failed: stopping", exc_info=True)
                line = f"the watch of topic {self.topic}'s incarnation failed: {exc!r}"
            if line is not None:
                self.refusal = line
                log.error("%s", line)
                on_other()
                return
            self._poked.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CHECK_S):
                    await self._poked.wait()
            # pokes come from every poll of a worker waiting on a release: one read a
            # while at most
            await asyncio.sleep(max(0.0, began + MIN_GAP_S - time.monotonic()))

    async def _check(self, began: float) -> str | None:
        """One check begun at ``began``: the refusal line, or None.

        The ID changing under a running worker is a recreation whatever PostgreSQL
        says: that needs no connection (new ones may be refused while the writers'
        still commit). PostgreSQL is asked once, whether the first ID this worker reads
        is the one its DB offsets belong to, and only where the start did not confirm
        one (:meth:`start_from`): this records the ID where the start could not read it."""
        try:
            found = await in_daemon_thread(self._read, "ackline-incarnation")[0]
        except KafkaUnavailableError as exc:
            self._unreadable(str(exc))
            return None
        self._on_missing(found is None)
        if found is None:  # deleted (maybe being made again): hold the batches
            self.missing = True
            self._unreadable("Kafka has no such topic now: deleted?")
            return None
        current = found.topic_id
        if current is None:
            self.missing = False  # no IDs to tell incarnations apart: unchecked, as ever
            self._unreadable("the broker keeps no topic IDs")
            return None
        self._unreadable_said = False
        if self.confirmed is not None and current != self.confirmed:
            return incarnation.other_incarnation_line(
                self.topic, self.group, self.confirmed, current
            )
        self.confirmed, self.confirmed_at = current, began
        if self._recorded:
            self.missing = False  # the same ID found again: the held batches may go
            return None
        # the first ID this worker reads, the start having confirmed none: held batches
        # stay held until PostgreSQL says it is the recorded one (they were let through
        # while the record was asked for, and the refusal came after them)
        recorded = await self._record(current)
        if recorded is None:
            return None
        self._recorded = True
        judged = incarnation.judge(self.topic, self.group, current, recorded)
        if judged.note is not None:
            log.info("%s", judged.note)
        if judged.refusal is None:
            self.missing = False
        return judged.refusal

    def _read(self) -> Described | None:
        """The topic as Kafka describes it (in a thread), on the watch's one admin client."""
        if self._client is None:
            try:
                self._client = admin(self._bootstrap, self._conf)
            except KafkaException as exc:  # a bad client setting: the start said so
                raise KafkaUnavailableError(str(exc)) from exc
        try:
            return described(self._client, self._bootstrap, self.topic, READ_S)
        finally:
            drain(self._client)

    async def _record(self, current: str) -> incarnation.Recorded | None:
        try:
            conn = await asyncpg.connect(
                self._dsn,
                timeout=self._connect_timeout_s,
                server_settings={"application_name": f"ackline-incarnation:{self._name}"[:63]},
            )
        except _DB_DOWN as exc:
            self._db_down(exc)
            return None
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                found = await incarnation.record(conn, self.group, self.topic, current)
        except asyncpg.UndefinedFunctionError:  # no migration 0015 (the start said so):
            self._recorded = True  # nothing recorded to compare with
            return None
        except _DB_DOWN as exc:
            self._db_down(exc)
            return None
        finally:
            conn.terminate()
        self._db_said = False
        return found

    def _db_down(self, exc: BaseException) -> None:
        """Once per outage: the worker's own connections say the rest."""
        if not self._db_said:
            log.warning(
                "topic incarnation check: PostgreSQL did not answer (%s): whether the "
                "topic ID %s is the one recorded for the group is asked again at the next "
                "check (a change of it under this worker stops it all the same)",
                describe(exc),
                self.confirmed,
            )
            self._db_said = True

    def _unreadable(self, why: str) -> None:
        if not self._unreadable_said:
            log.warning(
                "cannot read the topic ID of %s (%s): %s",
                self.topic,
                why,
                "the worker runs unchecked until it is read"
                if self.confirmed is None
                else "partitions held past their log end stay held, and --until-drained "
                "waits, until it is read",
            )
            self._unreadable_said = True
