"""What every phase of the bench shares: where things are, one phase's measurements, the
cluster's CPU, waiting on a system, and the bench stack.

Kept apart from :mod:`ackline.load.bench.run` so that the phases in their own modules
(:mod:`~ackline.load.bench.flood`, :mod:`~ackline.load.bench.rtt`,
:mod:`~ackline.load.bench.backlog`) use the same helpers without importing the driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import asyncpg

from ackline.core.signals import ignore_sigterm
from ackline.dev import stack
from ackline.load.bench.measure import (
    ProcessResult,
    cpu_seconds_of,
    descendants,
    kill_all,
    steady_rate,
)
from ackline.load.bench.systems import Env, System, query, run_sql
from ackline.load.errors import LoadError
from ackline.streams.admin import admin_client, delete_topics

ROOT: Final = Path(__file__).resolve().parents[2]
PARTITIONS: Final = 12
STALL_RECORDS: Final = 1_000
"""Fewer records than this committed in a whole stall window counts as stalled (a
crashing agent that a supervisor restarts keeps moving, one record per restart)."""


class BenchError(LoadError):
    """A phase of the bench failed (a system died, stalled, or never finished)."""


def say(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


@dataclass
class Phase:
    """One system's measurements in one phase."""

    events: int = 0
    events_per_s: float = 0.0
    wall_s: float = 0.0
    cpu_client_s: float = 0.0
    cpu_pg_s: float = 0.0
    cpu_kafka_s: float = 0.0
    peak_rss_mb: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in self.__dict__.items()}


class Cluster:
    """CPU seconds used so far by a stack's PostgreSQL and Kafka broker."""

    def __init__(self, state_dir: Path, kafka_pid: int | None = None) -> None:
        status = stack.status(state_dir)
        self.pg_pid = int(status["postgres"]["pid"])
        self.kafka_pid = kafka_pid if kafka_pid is not None else int(status["kafka"]["pid"])

    def cpu(self) -> tuple[float, float]:
        return cpu_seconds_of(descendants(self.pg_pid)), cpu_seconds_of([self.kafka_pid])


def wait_for(
    done: Callable[[], bool],
    system: System,
    timeout: float,
    what: str,
    stall_after: float | None = None,
    progress: Callable[[], int] | None = None,
    stall_records: int = STALL_RECORDS,
) -> bool:
    """Poll ``done`` every 0.5 s; False when stalled (fewer than ``stall_records`` more in
    ``progress`` over ``stall_after`` seconds)."""
    deadline = time.monotonic() + timeout
    history: list[tuple[float, int]] = []
    while time.monotonic() < deadline:
        if done():
            return True
        for proc in system.procs:
            if not proc.alive():
                raise BenchError(
                    f"{system.name} exited {proc.proc.returncode} before {what}:\n"
                    + proc.log_text()[-3000:]
                )
        if stall_after is not None and progress is not None:
            now = time.monotonic()
            history.append((now, progress()))
            window = [v for t, v in history if t >= now - stall_after]
            if history[0][0] <= now - stall_after and window[-1] - window[0] < stall_records:
                return False  # (almost) no progress for stall_after seconds
        time.sleep(0.5)
    raise BenchError(f"{system.name}: timed out after {timeout:.0f} s waiting for {what}")


def stop_all(system: System) -> list[ProcessResult]:
    return [p.stop() for p in system.procs]


def fill(
    phase: Phase, results: list[ProcessResult], cpu0: tuple[float, float], cluster: Cluster
) -> None:
    """The phase's CPU (the system's own, PostgreSQL's, the broker's) and peak RSS."""
    pg, kafka = cluster.cpu()
    phase.cpu_pg_s = pg - cpu0[0]
    phase.cpu_kafka_s = kafka - cpu0[1]
    phase.cpu_client_s = sum(r.cpu_s for r in results)
    phase.peak_rss_mb = max((r.peak_rss_mb for r in results), default=0.0)
    if len(results) > 1:
        phase.notes["peak_rss_mb_sum"] = round(sum(r.peak_rss_mb for r in results), 1)


def settle_disk(env: Env) -> None:
    """Write the page cache's dirty pages out before a timed phase.

    The machine has one disk for Kafka's logs, PostgreSQL's data and its WAL, and the
    kernel writes dirty pages back ~30 s after they were made (``vm.dirty_expire_
    centisecs``). Without this, the gigabytes that one phase wrote are flushed during the
    next one, and every COMMIT's WAL flush waits behind them: COMMITs of 150-540 ms were
    logged in a latency phase that began 30 s after a replay. A CHECKPOINT first, so
    PostgreSQL's dirty buffers are written too and no spread checkpoint of the last phase
    still runs into this one. Each timed phase starts with the disk quiet, whichever
    system it measures.

    Before both, every database is vacuumed and analyzed, because the bench server runs
    with autovacuum off (:data:`SERVER_SETTINGS`): no phase pays for vacuuming rows
    another phase wrote, and each starts with its planner statistics current.
    """
    started = time.monotonic()
    run_sql(lambda: vacuum_all(env))
    run_sql(lambda: query(env.dsn("postgres"), "CHECKPOINT"))
    os.sync()
    took = time.monotonic() - started
    if took > 1.0:
        say(f"wrote the page cache's dirty pages out in {took:.1f} s before the phase")


async def vacuum_all(env: Env) -> None:
    """``VACUUM (ANALYZE)`` in every database that takes connections, one at a time."""
    listed = await query(
        env.dsn("postgres"),
        # datconnlimit -2: left invalid by an interrupted DROP DATABASE (PostgreSQL 15.4+),
        # which no one can connect to (vacuumdb --all skips them the same way)
        "SELECT datname FROM pg_database WHERE datallowconn AND datconnlimit <> -2"
        " ORDER BY datname",
    )
    for row in listed:
        conn = await asyncpg.connect(env.dsn(row["datname"]))
        try:
            await conn.execute("VACUUM (ANALYZE)")
        finally:
            await conn.close()


class RowCounter:
    """Counts a system's rows over one connection kept for a whole phase, and says how much
    CPU its own backend used, so that the phase's PostgreSQL CPU can leave it out.

    The bench itself polls every 0.5 s, and a ``count(*)`` over a growing million-row table
    is work no system asked for. Counted over a new connection each time (a backend forked,
    parallel workers started), it took 2.5 s of PostgreSQL's CPU in a million-event drain,
    charged to whichever system was draining and not to the limit, which is not polled.
    Now one backend, no parallel workers, its CPU its own ``/proc`` entry (read before it
    ends); and :meth:`reached` counts only when the rate so far says the end is near, so
    the count takes less CPU from the system it watches (~1 s of a 20 s drain, on the
    other core or this one).
    """

    def __init__(self, dsn: str, table: str) -> None:
        self.table = table
        self._loop = asyncio.new_event_loop()
        self._conn = self._loop.run_until_complete(
            asyncpg.connect(dsn, server_settings={"max_parallel_workers_per_gather": "0"})
        )
        self.cpu0 = self.cpu()
        self._last = (time.monotonic(), 0)
        self._next = 0.0

    def reached(self, expected: int) -> bool:
        """True once the table holds ``expected`` rows. Counts every 0.5 to 4 s: after
        half the time that the last two counts' rate says is left (the cap bounds how late
        the end is seen when a slow start made that rate look low)."""
        now = time.monotonic()
        if now < self._next:
            return False
        rows = self.rows()
        if rows >= expected:
            return True
        then, before = self._last
        rate = (rows - before) / max(now - then, 1e-9)
        left = (expected - rows) / rate if rate > 0 else 0.0
        self._last = (now, rows)
        self._next = now + min(4.0, max(0.5, 0.5 * left))
        return False

    def rows(self) -> int:
        sql = f"SELECT count(*) FROM {self.table}"
        return int(self._loop.run_until_complete(self._conn.fetchval(sql)))

    def cpu(self) -> float:
        """CPU seconds of the counting backend so far (it is alive until :meth:`close`)."""
        return cpu_seconds_of([self._conn.get_server_pid()], children=False)

    def close(self) -> None:
        try:
            self._loop.run_until_complete(self._conn.close())
        finally:
            self._loop.close()


def drain_backlog(system: System, topic: str, expected: int, cluster: Cluster) -> Phase:
    """``system`` drains ``expected`` events already in ``topic`` into a fresh database.

    Its rate is the steady rate of the rows' commit timestamps (:func:`steady_rate`), so
    process start-up and the group join do not count.
    """
    say(f"{system.name}: first ingest of {expected:,} events from {topic}")
    system.reset()
    settle_disk(system.env)
    counter = RowCounter(system.dsn, system.table)
    try:
        cpu0 = cluster.cpu()
        started = time.time()
        system.start(topic)
        try:
            wait_for(
                lambda: counter.reached(expected),
                system,
                timeout=600 + expected / 500,
                what=f"{expected:,} rows",
            )
        finally:
            results = stop_all(system)
        phase = Phase(events=expected)
        fill(phase, results, cpu0, cluster)
        polled = counter.cpu() - counter.cpu0
    finally:
        counter.close()
    phase.cpu_pg_s -= polled
    phase.notes["bench_count_pg_cpu_s"] = round(polled, 2)
    times = system.commit_times()
    phase.events_per_s = steady_rate(times)
    phase.wall_s = max(times) - started
    phase.notes["rows"] = len(times)
    phase.notes["load_avg_1m"] = load_avg()
    say(f"{system.name}: {phase.events_per_s:,.0f} events/s")
    return phase


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


SERVER_SETTINGS: Final = (
    ("track_commit_timestamp", "on"),
    ("max_wal_size", "4GB"),
    ("checkpoint_timeout", "15min"),
)
"""The bench server's settings beyond the dev stack's. Commit timestamps are how rates and
latencies are measured. The WAL settings follow PostgreSQL's own hint: with the default
1 GB, a million-event ingest logged "checkpoints are occurring too frequently (23 seconds
apart) ... Consider increasing max_wal_size", and each checkpoint makes the next write of
every page carry a full-page image. A server sized for bulk ingest raises both; every
system of the bench, the limit included, writes to this same server.

For ``make bench`` autovacuum is off too (:func:`ensure_stack`), and :func:`settle_disk`
vacuums every database between phases instead.
With it on, the launcher reached a database when its turn came, not when its phase did:
in one run the vacuum of the limit's three million-row tables ran during ackline's first
ingest and counted as ackline's PostgreSQL CPU, while the limit's own phases, shorter than
a launcher round, paid for no vacuum at all. Vacuuming the rows it inserted is a real cost
of every system; with autovacuum off it is charged to none, so the ratios compare the
writes alone."""


def _sql(dsn: str, sql: str) -> list[Any]:
    return run_sql(lambda: query(dsn, sql))


def ensure_stack(state_dir: Path, autovacuum: bool = False) -> tuple[stack.StackInfo, bool]:
    """The bench stack, up, with :data:`SERVER_SETTINGS` and ``autovacuum`` on or off (set
    either way, since ``ALTER SYSTEM`` outlives the run: ``make bench-backlog`` measures a
    long drain as a deployment runs it, with autovacuum on); True if started here."""
    was_running = all(s["running"] for s in stack.status(state_dir).values())
    info = stack.up(state_dir)
    try:
        restart = False
        dsn = info.database_url
        wanted = (*SERVER_SETTINGS, ("autovacuum", "on" if autovacuum else "off"))
        for name, value in wanted:
            if _sql(dsn, f"SHOW {name}")[0][0] != value:
                _sql(dsn, f"ALTER SYSTEM SET {name} = '{value}'")
                restart = True
        if restart:
            stack.restart_postgres(state_dir)
    except BaseException:  # a stop request or a failure: leave no stack started here
        if not was_running:
            stack.down(state_dir)
        raise
    return info, not was_running


@contextlib.contextmanager
def bench_stack(
    state_dir: Path, run_id: str, autovacuum: bool = False, keep: bool = False
) -> Iterator[stack.StackInfo]:
    """The bench stack for one run (:func:`ensure_stack`), and its teardown whatever the
    run did. Use it inside :func:`~ackline.core.signals.terminate_as_exit`: a SIGTERM then
    raises through this teardown, which ignores SIGTERM from its start to that block's end.

    Teardown, in order: SIGTERM ignored; every process a phase left running killed; the
    run's topics deleted (a failure is reported, not raised); the stack stopped if it was
    started here. ``keep`` skips the last two. A crash inside it leaves at worst the run's
    topics and a stack started here, which the next run's ``ensure_stack`` reuses."""
    info, started_here = ensure_stack(state_dir, autovacuum=autovacuum)
    try:
        yield info
    finally:
        ignore_sigterm()  # the stack is stopped whatever comes now
        kill_all()  # whatever a failed phase left running
        if not keep:
            drop_run_topics(info.kafka_bootstrap, run_id)
            if started_here:
                say("stopping the bench stack")
                stack.down(state_dir)


def run_topics(names: Iterable[str], run_id: str) -> list[str]:
    """The topics a bench run made: every name that holds its run id (its input topics,
    their ``.connect`` copies and dead-letter topics, the latency, flood and backlog topics).
    Pure."""
    return sorted(n for n in names if run_id in n)


def drop_run_topics(bootstrap: str, run_id: str) -> list[str]:
    """Delete the topics of run ``run_id`` (each run writes gigabytes under fresh names,
    which the broker would otherwise keep: repeated runs filled a disk). Returns what it
    asked the broker to delete; a failure is reported, never raised, so the run's results
    still count."""
    try:
        with admin_client(bootstrap) as client:
            gone = run_topics(client.list_topics(timeout=10).topics, run_id)
        delete_topics(bootstrap, gone)
    except Exception as exc:  # cleanup must not fail a finished run
        say(f"could not delete this run's topics: {exc}")
        return []
    if gone:
        say(f"deleted this run's {len(gone)} topics")
    return gone


def host_port(dsn: str) -> tuple[str, int]:
    """``postgresql://user@host:port/db`` -> (host, port)."""
    host, port = dsn.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)
    return host, int(port)


__all__ = [
    "PARTITIONS",
    "ROOT",
    "BenchError",
    "Cluster",
    "Phase",
    "RowCounter",
    "bench_stack",
    "drain_backlog",
    "drop_run_topics",
    "ensure_stack",
    "fill",
    "host_port",
    "load_avg",
    "run_topics",
    "say",
    "settle_disk",
    "stop_all",
    "wait_for",
]
