"""The topic's incarnation, watched while the worker runs (docs/guarantees.md, "A
recreated topic").

The start checks that the group's DB offsets belong to the topic's incarnation in Kafka
(its topic ID). A topic deleted and made again *while* workers ran was not seen: with no
rebalance the fetch went on at the old positions, and a held partition (DB offset past
the new log end) was released once the new log grew past it; either way the new topic's
records below the old offsets were never ingested, the worker still running. The watch
reads the topic ID every :data:`CHECK_S` seconds (and at once when asked) and, on another
incarnation than the recorded one, says the start's refusal line and stops the worker,
which then exits as a refused start does (status 2). A held partition is released only
after a read of the ID that began once it was ready (:meth:`IncarnationWatch.fresh_since`).
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
from ackline.streams.kafkainfo import described_topic_id

log = logging.getLogger(__name__)

CHECK_S = 2.0
"""Between two reads of the topic ID (one DescribeTopics on a client kept open): about
how long a worker may run on a recreated topic before it stops. What it ingests of the
new topic meanwhile is kept and nothing is lost (`offsets adopt-topic` rewinds the group
to the new log start, where those records are duplicates), but it is taken out of order:
records past the old offsets came before those below them (docs/guarantees.md)."""
READ_S = 5.0
"""The bound of one DescribeTopics."""

_DB_DOWN: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    OSError,
    TimeoutError,
)


class IncarnationWatch:
    """One worker's watch of ``topic``'s incarnation for ``group``.

    ``confirmed`` is the topic ID the group's DB offsets were last confirmed to belong to
    (recorded in ``topic_incarnations``), ``confirmed_at`` the monotonic time the read
    that confirmed it began. ``refusal`` is the refusal line once another incarnation
    was found (the worker is stopping). Until a first confirmation (the ID unreadable,
    a schema before migration 0015) the watch holds nothing back: the worker runs
    unchecked, as the start said.
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
    ) -> None:
        self._bootstrap, self._conf = bootstrap, dict(conf)
        self.topic, self.group = topic, group
        self._dsn, self._connect_timeout_s, self._name = dsn, connect_timeout_s, name
        self.confirmed: str | None = None
        self.confirmed_at = float("-inf")
        self.refusal: str | None = None
        self._client: AdminClient | None = None  # made in the reading thread, kept
        self._disabled = False  # no migration 0015: nothing recorded to compare with
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poked: asyncio.Event | None = None
        self._unreadable_said = False
        self._db_said = False  # read by a first check that already fails

    def fresh_since(self, since: float) -> bool:
        """Whether a partition ready at monotonic time ``since`` may be released: the
        incarnation was confirmed by a read that began at or after it, or the watch
        checks nothing. Thread-safe; False asks the watch to read at once."""
        if self.refusal is not None:
            return False
        if self._disabled or self.confirmed is None or self.confirmed_at >= since:
            return True
        self.poke()
        return False

    def poke(self) -> None:
        """Read the ID at once rather than at the next tick (from any thread)."""
        loop, poked = self._loop, self._poked
        if loop is not None and poked is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: it is stopping
                loop.call_soon_threadsafe(poked.set)

    async def run(self, on_other: Callable[[], None]) -> None:
        """Check until cancelled; on another incarnation set :attr:`refusal`, log it at
        ERROR and call ``on_other`` (which stops the worker), then return.

        Order of effects at each check: read the topic ID (DescribeTopics, in a thread);
        when it is not the confirmed one, one autocommitted call of
        ackline_record_topic_id (:func:`ackline.sinks.ingest.incarnation.record`) on a
        connection of its own, which records it where none is and says what is. It
        never replaces a recorded ID, so a crash anywhere leaves what a start finds."""
        self._loop = asyncio.get_running_loop()
        self._poked = asyncio.Event()
        while not self._disabled:
            began = time.monotonic()
            line = await self._check(began)
            if line is not None:
                self.refusal = line
                log.error("%s", line)
                on_other()
                return
            self._poked.clear()
            try:
                async with asyncio.timeout(CHECK_S):
                    await self._poked.wait()
            except TimeoutError:
                pass

    async def _check(self, began: float) -> str | None:
        """One check begun at ``began``: the refusal line, or None."""
        try:
            current = await in_daemon_thread(self._read, "ackline-incarnation")[0]
        except KafkaUnavailableError as exc:
            self._unreadable(str(exc))
            return None
        if current is None:  # deleted (maybe being made again), or a broker with no IDs
            self._unreadable("no topic ID")
            return None
        self._unreadable_said = False
        if current == self.confirmed:
            self.confirmed_at = began
            return None
        found = await self._record(current)
        if found is None:
            return None
        seen = incarnation.verdict(current, found)
        if seen is incarnation.Verdict.OTHER:
            return incarnation.other_incarnation_line(self.topic, self.group, found.stored, current)
        if self.confirmed is not None or seen is not incarnation.Verdict.SAME:
            log.info("topic %s: incarnation %s confirmed for %s", self.topic, current, self.group)
        self.confirmed, self.confirmed_at = current, began
        return None

    def _read(self) -> str | None:
        """The topic ID (in a thread), on the watch's one admin client."""
        if self._client is None:
            try:
                self._client = admin(self._bootstrap, self._conf)
            except KafkaException as exc:  # a bad client setting: the start said so
                raise KafkaUnavailableError(str(exc)) from exc
        try:
            return described_topic_id(self._client, self._bootstrap, self.topic, READ_S)
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
        except asyncpg.UndefinedFunctionError:
            self._disabled = True  # the start said so (migration 0015 not applied)
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
                "topic incarnation check: PostgreSQL did not answer (%s); partitions held "
                "past their log end stay held until it does",
                describe(exc),
            )
            self._db_said = True

    def _unreadable(self, why: str) -> None:
        if not self._unreadable_said:
            log.warning(
                "cannot read the topic ID of %s (%s): partitions held past their log end "
                "stay held until it is read",
                self.topic,
                why,
            )
            self._unreadable_said = True
