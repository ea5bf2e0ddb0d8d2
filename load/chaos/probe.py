"""What a chaos run observes from outside the workers: PostgreSQL, Kafka offsets.

:class:`Pg` is a synchronous, reconnecting view of the chaos database (as the
superuser: it terminates backends and changes server settings). :class:`OffsetWatch`
samples the group's committed Kafka offsets and the DB offsets and keeps the largest
amount by which Kafka was ever ahead; Kafka is read first, then the DB, and DB offsets
only grow, so a sample can never show Kafka ahead when it was not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
from confluent_kafka import Consumer, KafkaException, TopicPartition

from ackline.core.signals import stops_deferred
from ackline.core.tasks import take_outcome

_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)
T = TypeVar("T")


GHOST_STANDBY = "ackline_chaos_ghost"
"""A synchronous standby that never exists: while it is configured, every COMMIT that
wrote something waits for it (wait_event SyncRep), durable locally but unanswered."""


class Pg:
    """One superuser connection, reconnected on demand; every call is synchronous."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._loop = asyncio.new_event_loop()
        self._conn: asyncpg.Connection | None = None

    def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        """Run ``sql``; reconnect and raise the error when the connection fails.

        A stop request (SIGTERM, Ctrl-C) while the loop runs cancels the call and is raised
        once the loop has returned, never inside asyncpg, which can drop it
        (:func:`~ackline.core.signals.stops_deferred`). The connection, left mid-protocol,
        is dropped too, never reused, and the cut call's outcome is taken, so nothing
        logs a traceback about it.
        """
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = self._run(asyncpg.connect(self.dsn, timeout=10))
            return self._run(self._conn.fetch(sql, *args, timeout=60))
        except BaseException:
            self._drop()
            raise

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        task = self._loop.create_task(call)
        try:
            with stops_deferred(self._loop, task.cancel):
                return self._loop.run_until_complete(task)
        except BaseException:
            if not task.done():  # cut short by a stop request: mid-protocol
                task.add_done_callback(take_outcome)
                task.cancel()
                self._drop()  # its transport closed, the task ends at the next turn
                with contextlib.suppress(Exception):
                    self._loop.run_until_complete(asyncio.wait([task], timeout=1))
            else:  # the stop was raised in the task's own step: it holds it too
                take_outcome(task)
            raise

    def try_fetch(self, sql: str, *args: Any) -> list[asyncpg.Record] | None:
        """As :meth:`fetch`, None on a connection or server error (a restart)."""
        try:
            return self.fetch(sql, *args)
        except _ERRORS:
            return None

    def retry(self, sql: str, *args: Any, timeout: float = 120.0) -> list[asyncpg.Record]:
        """As :meth:`fetch`, retried through PostgreSQL restarts for up to ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.fetch(sql, *args)
            except _ERRORS:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                self._loop.run_until_complete(conn.close(timeout=5))
            except _ERRORS:
                conn.terminate()
        self._loop.close()

    def set_ghost_standby(self, on: bool) -> None:
        """Make every COMMIT wait for a standby that never comes (on), or stop (off)."""
        if on:
            self.retry(f"ALTER SYSTEM SET synchronous_standby_names = '{GHOST_STANDBY}'")
        else:
            self.retry("ALTER SYSTEM RESET synchronous_standby_names")
        self.retry("SELECT pg_reload_conf()")

    def writer_backends(self, where: str, worker: str = "%") -> list[int]:
        """Pids of ackline writer connections (application_name ackline:<worker>)."""
        rows = self.try_fetch(
            f"SELECT pid FROM pg_stat_activity WHERE application_name LIKE $1 AND {where}",
            f"ackline:{worker}",
        )
        return [int(r["pid"]) for r in rows or []]

    def terminate(self, pid: int) -> bool:
        rows = self.try_fetch("SELECT pg_terminate_backend($1) AS ok", pid)
        return bool(rows and rows[0]["ok"])

    def ingested_records(self, group: str) -> int | None:
        rows = self.try_fetch(
            "SELECT coalesce(sum(events), 0)::bigint AS n FROM ingest_batches WHERE group_id = $1",
            group,
        )
        return int(rows[0]["n"]) if rows else None

    def next_offsets(self, group: str, topic: str) -> dict[int, int | None] | None:
        rows = self.try_fetch(
            "SELECT partition, next_offset FROM consumer_offsets "
            "WHERE group_id = $1 AND topic = $2",
            group,
            topic,
        )
        if rows is None:
            return None
        return {int(r["partition"]): r["next_offset"] for r in rows}

    def owned_by(self, group: str, worker: str) -> set[int]:
        rows = self.try_fetch(
            "SELECT partition FROM consumer_offsets WHERE group_id = $1 AND owner = $2",
            group,
            worker,
        )
        return {int(r["partition"]) for r in rows or []}


@dataclass
class Ahead:
    partition: int
    kafka: int
    db: int | None


class OffsetWatch:
    """Samples Kafka's committed offsets of the group against the DB offsets.

    Kafka's side is read with a plain consumer of the group's id that never subscribes
    (``committed()``: no group membership, nothing committed). Not the AdminClient's
    list_consumer_group_offsets: a request of it that times out while the broker
    restarts can abort the process (librdkafka issue 4605). The consumer is made anew
    after every broker restart (:meth:`reset`).
    """

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int) -> None:
        self._bootstrap = bootstrap
        self._group, self._topic, self._partitions = group, topic, partitions
        self._consumer: Consumer | None = None
        self.samples = 0
        self.max_ahead = 0
        self.worst: Ahead | None = None

    def _client(self) -> Consumer:
        if self._consumer is None:
            quiet = logging.getLogger(
                "ackline.load.chaos.harness.kafka"
            )  # broker restarts are expected
            quiet.setLevel(logging.CRITICAL)
            conf: dict[str, Any] = {
                "bootstrap.servers": self._bootstrap,
                "group.id": self._group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "socket.timeout.ms": 5000,
                "logger": quiet,
            }
            self._consumer = Consumer(conf)
        return self._consumer

    def reset(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def kafka_committed(self) -> dict[int, int] | None:
        tps = [TopicPartition(self._topic, p) for p in range(self._partitions)]
        try:
            found = self._client().committed(tps, timeout=5)
        except KafkaException:
            return None  # the broker is restarting: no sample now
        return {tp.partition: tp.offset for tp in found if tp.offset >= 0}

    def sample(self, pg: Pg) -> None:
        kafka = self.kafka_committed()
        if kafka is None:
            return
        db = pg.next_offsets(self._group, self._topic)
        if db is None:
            return
        self.samples += 1
        for partition, offset in kafka.items():
            stored = db.get(partition)
            ahead = offset - (stored or 0)
            if ahead > self.max_ahead:
                self.max_ahead = ahead
                self.worst = Ahead(partition, offset, stored)
