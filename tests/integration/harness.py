"""Helpers for integration tests: worker processes, producing, waiting on conditions."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import asyncpg

from ackline.core.faults import Faults
from ackline.dev.ports import pick_free_port
from ackline.dev.toxiproxy import Proxy, ToxiproxyServer
from ackline.load.chaos.workers import metric_total
from ackline.sinks.admin.migrate import load_migrations, migrate
from ackline.streams.admin import delete_topic, ensure_topic
from ackline.streams.errors import TopicError

T = TypeVar("T")


@dataclass(frozen=True)
class Services:
    bootstrap: str
    database_url: str
    state_dir: Path


def dsn_for(dsn: str, database: str) -> str:
    base, _, _ = dsn.rpartition("/")
    return f"{base}/{database}"


# One template per xdist worker: with ACKLINE_KAFKA_BOOTSTRAP and ACKLINE_DATABASE_URL set,
# both workers share one server, and a worker's session start drops and remakes its template.
TEMPLATE_DB = "ackline_test_template" + (
    f"_{os.environ['PYTEST_XDIST_WORKER']}" if "PYTEST_XDIST_WORKER" in os.environ else ""
)


@contextmanager
def fresh_database(services: Services) -> Iterator[str]:
    """A fresh, migrated database (a copy of the migrated template), dropped after."""
    name = f"t_{uuid.uuid4().hex[:12]}"

    async def create() -> None:
        conn = await asyncpg.connect(services.database_url)
        try:
            await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE_DB}"')
        finally:
            await conn.close()

    async def drop() -> None:
        conn = await asyncpg.connect(services.database_url)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(create())
    try:
        yield dsn_for(services.database_url, name)
    finally:
        asyncio.run(drop())


@contextmanager
def fresh_topic(services: Services) -> Iterator[str]:
    """A fresh 3-partition topic, deleted after with its dead-letter topic."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    ensure_topic(services.bootstrap, name, partitions=3)
    try:
        yield name
    finally:
        for t in (name, f"{name}.dlq"):
            # the dead-letter topic exists only when a worker ran
            with contextlib.suppress(TopicError):
                delete_topic(services.bootstrap, t)


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.2
) -> None:
    """Poll ``condition`` until true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def db(dsn: str, query: str, *args: Any) -> list[asyncpg.Record]:
    async def go() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(query, *args)
        finally:
            await conn.close()

    return asyncio.run(go())


class PointGate(Faults):
    """Holds whatever reaches fault point ``point`` until ``release`` is set (only the
    first to reach it when ``once``); ``reached`` says one has."""

    def __init__(self, point: str, once: bool = False) -> None:
        super().__init__()
        self.point = point
        self.armed = True
        self.once = once
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def ahit(self, point: str) -> None:
        if point == self.point and self.armed:
            self.armed = not self.once
            self.reached.set()
            await self.release.wait()


def next_utc_midnight(dsn: str) -> datetime:
    """The next midnight UTC by the database's clock: a retention run "now" at it drops
    today's partition (the tests' way to make a drop without waiting a day)."""
    today = db(dsn, "SELECT (now() AT TIME ZONE 'UTC')::date AS d")[0]["d"]
    return datetime.combine(today + timedelta(days=1), datetime.min.time(), UTC)


def relay_postgresql(server: ToxiproxyServer, dsn: str) -> tuple[Proxy, str]:
    """A proxy named "pg" on ``server`` in front of ``dsn``'s PostgreSQL, and ``dsn``
    through it."""
    pg = urlsplit(dsn)
    where = f"{pg.hostname}:{pg.port}"
    proxy = server.create_proxy("pg", upstream=where)
    return proxy, dsn.replace(where, proxy.listen)


def run_async(coro: Awaitable[T]) -> T:
    async def wrap() -> T:
        return await coro

    return asyncio.run(wrap())


@contextmanager
def database_upto(services: Services, upto: int) -> Iterator[str]:
    """A fresh database migrated up to migration ``upto`` (the fixture's template is
    migrated all the way), dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    db(services.database_url, f'CREATE DATABASE "{name}"')
    dsn = dsn_for(services.database_url, name)

    async def up() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await migrate(conn, [m for m in load_migrations() if m.version <= upto])
        finally:
            await conn.close()

    try:
        asyncio.run(up())
        yield dsn
    finally:
        db(services.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


LIVE_WORKERS: list[Worker] = []
"""Every Worker started by the current test; the conftest kills leftovers after it."""


class Worker:
    """One `ackline run` process with its own log file and metrics port.

    ACKLINE_DATABASE_URL is the test database as the superuser; `ackline run` connects
    as ``ackline_ingest`` to that database (ackline.endpoints.ingest_dsn: the local stack
    trusts the role), so every worker in the tests runs with the worker's real privileges.
    """

    def __init__(
        self,
        services: Services,
        dsn: str,
        topic: str,
        log_dir: Path,
        name: str = "w1",
        group: str | None = None,
        prefix: Sequence[str] = (),
        args: Sequence[str] = (),
        **settings: Any,
    ) -> None:
        """``prefix`` goes before the command (e.g. ``ip netns exec NS``), ``args`` after
        it (e.g. ``--until-drained``)."""
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.release_path = log_dir / f"{name}.release"
        self.release_path.unlink(missing_ok=True)  # not one left by an earlier worker so named
        self.metrics_port = pick_free_port()
        env = {
            **os.environ,
            "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
            "ACKLINE_DATABASE_URL": dsn,
            "ACKLINE_TOPIC": topic,
            "ACKLINE_GROUP_ID": group or f"g-{topic}",
            "ACKLINE_DLQ_TOPIC": f"{topic}.dlq",
            "ACKLINE_WORKER_ID": name,
            "ACKLINE_METRICS_PORT": str(self.metrics_port),
            "ACKLINE_FAULT_RELEASE_FILE": str(self.release_path),
            "ACKLINE_SESSION_TIMEOUT_MS": "6000",
            "ACKLINE_BATCH_MAX_MS": "100",
        }
        env.update({f"ACKLINE_{k.upper()}": str(v) for k, v in settings.items()})
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "ackline", "run", *args],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        LIVE_WORKERS.append(self)

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def release_stall(self, point: str = "") -> None:
        """End the worker's current ``stall`` fault now (``fault_stall_seconds`` bounds
        it still): for a test whose stall only has to outlast what it waits for. With
        ``point``, only a stall at that fault point (a later one, if that one is over)."""
        ready = self.release_path.with_suffix(".next")
        ready.write_text(point)
        ready.replace(self.release_path)  # whole at once: never read empty half-way

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)
        self._log.close()

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM and wait; return the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str) -> float:
        """Sum of a metric's samples scraped from the worker's /metrics."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return metric_total(resp.read().decode(), name)

    def reap(self) -> int:
        """Wait for a process that ends by itself (an armed kill); return its status."""
        code = self.proc.wait(60)
        self._log.close()
        return code

    def discard(self) -> None:
        """Kill the process if it still runs and close its log (test teardown)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        if not self._log.closed:
            self._log.close()

    def ensure_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"worker {self.name} exited {self.proc.returncode}:\n{self.log()[-4000:]}"
            )
