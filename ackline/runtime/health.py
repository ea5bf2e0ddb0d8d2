"""Liveness and readiness of a worker, read from its metrics.

The runtime already keeps the facts readiness needs in its gauges (assigned
partitions, last commit time, per-partition lag); :func:`probe_database` adds a cheap
periodic PostgreSQL check (``ackline_database_up``), so a request to ``/readyz`` reads
numbers and never queries anything. :func:`readiness` is the pure rule.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import asyncpg

from ackline.core.metrics import Metrics
from ackline.sinks.connection import describe

log = logging.getLogger(__name__)

# A database check older than this many probe intervals no longer counts.
STALE_CHECKS = 3


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What readiness looks at. Times are Unix seconds; 0 means never."""

    assigned: int
    lag: float
    last_commit: float
    started: float
    db_up: bool
    db_checked: float
    not_consumed: int = 0
    out_of_group: bool = False  # left the group: PostgreSQL does not answer this worker
    db_down_since: float = 0.0  # the worker's own operations failing since (0: they succeed)
    behind_since: float = 0.0  # behind (lag > 0) since, as the lag reports saw it (0: not)
    waiting_to_join: bool = False  # the start-up wait for PostgreSQL, before the group
    topic_missing: bool = False  # Kafka says the topic does not exist (deleted?)


@dataclass(frozen=True, slots=True)
class ReadyLimits:
    max_commit_age_s: float
    db_check_interval_s: float
    db_down_error_after_s: float = 60.0


def readiness(snap: Snapshot, now: float, limits: ReadyLimits) -> list[str]:
    """Why the worker is not ready; an empty list means ready.

    Not ready while it waits for PostgreSQL before joining its group (one reason: the
    others would be its consequences). Then ready means: it owns at least one partition
    and consumes every partition Kafka assigns to it; PostgreSQL answered a recent check,
    and the worker's own operations have not been failing for longer than
    ``db_down_error_after_s`` (the check can pass while the worker's connections do not);
    and, when it is behind (lag > 0), a batch committed within ``max_commit_age_s``,
    counted from the latest of the last commit, the start (a fresh worker gets that long)
    and when its lag reports first saw it behind (:meth:`Metrics.note_behind`): a worker
    idle and caught up for longer than the bound,
    with nothing to commit, was not ready the moment new records came.
    """
    if snap.waiting_to_join:
        return [
            "starting: waiting for PostgreSQL before joining the consumer group (the "
            "worker's WARNING lines say why it waits)"
        ]
    reasons: list[str] = []
    if snap.out_of_group:
        reasons.append(
            "left the consumer group: cannot connect to PostgreSQL (ACKLINE_DB_LEAVE_AFTER_S); "
            "joins again once every connection of the worker answers"
        )
    elif snap.assigned <= 0:
        reasons.append("no partitions assigned")
    if snap.topic_missing:
        reasons.append(
            "Kafka has no such topic now (deleted?): the worker has nothing to ingest; if "
            "it is made again, the worker stops on the new incarnation (exit 2)"
        )
    if snap.not_consumed > 0:
        reasons.append(
            f"{snap.not_consumed} partition(s) assigned but not consumed (a batch that did "
            f"not commit, or a fence, not claimed again yet; or DB offset past the log end: "
            f"see the WARNING and ERROR lines)"
        )
    db_age = now - snap.db_checked
    if snap.db_checked <= 0:
        reasons.append("PostgreSQL not checked yet")
    elif not snap.db_up:
        reasons.append("PostgreSQL unreachable at the last check")
    elif db_age > STALE_CHECKS * limits.db_check_interval_s:
        reasons.append(f"PostgreSQL last checked {db_age:.0f}s ago")
    failing = now - snap.db_down_since
    if snap.db_down_since > 0 and failing > limits.db_down_error_after_s:
        reasons.append(
            f"PostgreSQL operations of the worker failing for {failing:.0f}s "
            f"(db_down_error_after_s={limits.db_down_error_after_s:g})"
        )
    if snap.lag > 0:
        since = max(snap.last_commit, snap.started, snap.behind_since)
        age = now - since
        if age > limits.max_commit_age_s:
            reasons.append(
                f"lag {snap.lag:.0f} but no commit for {age:.0f}s "
                f"(ready_max_commit_age_s={limits.max_commit_age_s:g})"
            )
    return reasons


def snapshot(metrics: Metrics, started: float) -> Snapshot:
    """Read the readiness facts from ``metrics`` (cheap: a few in-memory numbers)."""
    return Snapshot(
        assigned=int(_gauge(metrics, "ackline_assigned_partitions")),
        lag=metrics.total_lag(),
        last_commit=_gauge(metrics, "ackline_last_commit_timestamp_seconds"),
        started=started,
        db_up=_gauge(metrics, "ackline_database_up") >= 1,
        db_checked=_gauge(metrics, "ackline_database_checked_timestamp_seconds"),
        not_consumed=int(_gauge(metrics, "ackline_partitions_not_consumed")),
        db_down_since=_gauge(metrics, "ackline_database_down_since_timestamp_seconds"),
        behind_since=_gauge(metrics, "ackline_behind_since_timestamp_seconds"),
        out_of_group=_gauge(metrics, "ackline_out_of_group") >= 1,
        waiting_to_join=_gauge(metrics, "ackline_waiting_to_join") >= 1,
        topic_missing=_gauge(metrics, "ackline_topic_missing") >= 1,
    )


def _gauge(metrics: Metrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    return 0.0 if value is None else float(value)


_DOWN: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    OSError,
    TimeoutError,
)


async def probe_database(dsn: str, metrics: Metrics, interval: float, name: str) -> None:
    """Every ``interval`` seconds, ``SELECT 1`` on a dedicated connection; runs until cancelled.

    Sets ``ackline_database_up`` (1/0) and ``ackline_database_checked_timestamp_seconds``.
    Its own connection keeps the writer's session free and sees a restarted server at
    once (the connection is dropped and remade after any failure). Read-only.
    """
    conn: asyncpg.Connection | None = None
    was_up: bool | None = None
    try:
        while True:
            up = True
            try:
                if conn is None or conn.is_closed():
                    conn = await asyncpg.connect(
                        dsn,
                        timeout=interval,
                        server_settings={"application_name": f"ackline-health:{name}"[:63]},
                    )
                async with asyncio.timeout(interval):
                    await conn.fetchval("SELECT 1")
            except _DOWN as exc:
                up = False
                if was_up is not False:
                    log.warning("PostgreSQL health check failed: %s", describe(exc))
                if conn is not None:
                    conn.terminate()
                    conn = None
            if up and was_up is False:
                log.info("PostgreSQL health check passes again")
            was_up = up
            metrics.db_up.set(1 if up else 0)
            metrics.db_checked.set(time.time())
            await asyncio.sleep(interval)
    finally:
        if conn is not None and not conn.is_closed():
            conn.terminate()
