"""The one wiring of an ingest worker, shared by both runtimes.

:func:`build_ingest` turns the settings into the parts every ingest worker needs — the
metrics, the fault points, the writer's and the claims' PostgreSQL connections (as the
ingest role), the batch writer, the dead-letter producer, the decoder's limits and the
status server — without any I/O. Each runtime adds only what is its own: the
confluent-kafka consumer thread (:mod:`ackline.runtime.confluent`) or the faust app
(:mod:`ackline.runtime.faust_app`).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import get_args

from ackline.clients import ingest_dsn, kafka_client_config
from ackline.core.errors import SettingsError
from ackline.core.faults import Faults
from ackline.core.metrics import Metrics
from ackline.runtime.health import ReadyLimits
from ackline.runtime.httpserver import StatusServer
from ackline.runtime.incarnation_watch import IncarnationWatch
from ackline.runtime.progress_line import ProgressLog, WorkerProgress
from ackline.schemas.decode import REASONS, Limits
from ackline.schemas.errors import SchemaError
from ackline.schemas.plugins import load_plugins
from ackline.settings import Settings, dsn_address
from ackline.sinks.admin.partitions import Upkeep
from ackline.sinks.connection import Database
from ackline.sinks.ingest.classify import Layer
from ackline.sinks.ingest.writer import BatchWriter
from ackline.streams.deadletter import DeadLetterProducer

log = logging.getLogger(__name__)

RETRY_CAUSES = ("commit_uncertain", "race", "transient", "partition_missing", "schema_moved")
"""The causes BatchWriter counts its retries by (ackline.sinks.ingest.writer; a unit test
keeps the two in step)."""


def load_payload_plugins(spec: str) -> None:
    """Register the payload versions of ACKLINE_PAYLOAD_PLUGINS (before any decoding)."""
    if not spec.strip():
        return
    try:
        added = load_plugins(spec)
    except SchemaError as exc:
        raise SettingsError("ACKLINE_PAYLOAD_PLUGINS", str(exc)) from exc
    log.info("payload plugins registered %s", ", ".join(f"{t} v{v}" for t, v in added) or "-")


@dataclass
class Ingest:
    """The parts of one ingest worker (see the module docstring). Nothing is connected yet."""

    settings: Settings
    bootstrap: str
    dsn: str  # the ingest role's DSN: every connection of the worker uses it
    kafka_conf: dict[str, object]
    metrics: Metrics
    faults: Faults
    dbs: tuple[Database, ...]  # the writers' connections, one per writer
    control_db: Database  # claims and re-reads of offset rows, apart from the writers'
    writers: tuple[BatchWriter, ...]  # settings.writer_connections of them
    dead_letters: DeadLetterProducer
    limits: Limits
    server: StatusServer
    progress: ProgressLog
    incarnation: IncarnationWatch  # the topic's incarnation, watched while it runs

    def serve(self) -> None:
        """Serve /metrics, /healthz and /readyz (unless ``metrics_port`` is 0), then log
        the worker's one start-up line; the progress lines begin (:mod:`progress_line`).

        The default port taken by another process (a second worker on one host) falls
        back to a free port, with a warning; an explicitly set port that cannot be bound
        is a SettingsError. The start-up line names the worker id, group, topic(s),
        runtime, database address (never its credentials) and metrics address.
        """
        s = self.settings
        address = self.server.serve(s)
        log.info(
            "worker %s starting: group %s, topic %s, runtime %s, PostgreSQL %s, metrics %s",
            s.worker_id,
            s.group_id,
            s.topic,
            s.runtime,
            dsn_address(self.dsn),
            address,
            extra={
                "worker_id": s.worker_id,
                "group_id": s.group_id,
                "topics": [s.topic],
                "runtime": s.runtime,
                "database": dsn_address(self.dsn),
                "metrics": address,
            },
        )
        self.progress.start()

    @contextmanager
    def waiting_to_join(self) -> Iterator[None]:
        """The block is the start-up wait before the group (``before_join``): /readyz says
        so while it runs. A refusal raised from it (schema missing, worker id taken) stops
        the progress lines and the status server, which :meth:`serve` started: the worker
        exits without joining, and its other parts were never used."""
        self.metrics.waiting_to_join.set(1)
        try:
            yield
        except BaseException:
            self.progress.stop()
            self.server.close()
            raise
        finally:
            self.metrics.waiting_to_join.set(0)

    async def close(self, timeout: float | None = None) -> None:
        """Stop the status server; flush the dead-letter producer and close the
        connections, all at once, each within ``timeout`` (else its own bound), so a
        broker or database that stopped answering costs one bound, not one per client."""
        self.progress.stop()
        self.server.close()
        await asyncio.gather(
            asyncio.to_thread(self.dead_letters.close, timeout),
            *(db.close(timeout) for db in (*self.dbs, self.control_db)),
        )

    @property
    def writer(self) -> BatchWriter:
        """The first writer: the faust runtime writes over one connection."""
        return self.writers[0]


def decode_limits(settings: Settings) -> Limits:
    """The decoder's limits from the settings (the consumer's, the writer's, faust's)."""
    return Limits(max_bytes=settings.max_message_bytes, max_depth=settings.max_json_depth)


def build_ingest(settings: Settings, bootstrap: str, dsn: str) -> Ingest:
    """Wire an ingest worker from ``settings``. No I/O.

    ``dsn`` is the operator's; the worker connects as the ingest role
    (:func:`ackline.clients.ingest_dsn`, which raises SettingsError before anything
    connects when it cannot).
    """
    worker_dsn = ingest_dsn(settings, dsn)
    kafka_conf = kafka_client_config(settings)
    metrics = Metrics()
    metrics.precreate(get_args(Layer), REASONS, RETRY_CAUSES)  # alerts see the first increment
    faults = settings.fault_points()

    failing: dict[str, float] = {}  # per connection: failing since (Unix time)

    def on_down(kind: str) -> Callable[[float | None], None]:
        """Readiness sees the oldest run of failures of the worker's connections."""

        def note(since: float | None) -> None:
            if since is None:
                failing.pop(kind, None)
            else:
                failing[kind] = since
            metrics.db_down_since.set(min(failing.values(), default=0.0))

        return note

    def database(kind: str, name: str | None = None) -> Database:
        return Database(
            worker_dsn,
            idle_in_transaction_timeout_ms=settings.db_idle_in_transaction_timeout_ms,
            connect_timeout=settings.db_connect_timeout_s,
            statement_timeout=settings.db_statement_timeout_s,
            commit_timeout=settings.db_commit_timeout_s,
            down_error_after=settings.db_down_error_after_s,
            application_name=f"{name or kind}:{settings.worker_id}"[:63],
            on_down=on_down(kind),
        )

    # All writer connections carry the worker's one application_name ("ackline:<worker>");
    # readiness tells their outages apart. One upkeep, shared: one writer at a time runs it.
    dbs = tuple(
        database("ackline" if i == 0 else f"ackline-{i + 1}", "ackline")
        for i in range(settings.writer_connections)
    )
    upkeep = Upkeep(
        settings.partition_interval, settings.partitions_ahead, settings.retention_keep()
    )
    limits = decode_limits(settings)
    writers = tuple(
        BatchWriter(
            db,
            settings.group_id,
            settings.worker_id,
            faults,
            on_retry=lambda cause: metrics.retries.labels(cause).inc(),
            upkeep=upkeep,
            limits=limits,
        )
        for db in dbs
    )
    return Ingest(
        settings=settings,
        bootstrap=bootstrap,
        dsn=worker_dsn,
        kafka_conf=kafka_conf,
        metrics=metrics,
        faults=faults,
        dbs=dbs,
        control_db=database("ackline-control"),
        writers=writers,
        dead_letters=DeadLetterProducer(
            bootstrap, settings.dlq_topic, kafka_conf, reject_max_bytes=settings.batch_max_bytes
        ),
        limits=limits,
        incarnation=IncarnationWatch(
            bootstrap,
            kafka_conf,
            settings.topic,
            settings.group_id,
            worker_dsn,
            settings.db_connect_timeout_s,
            settings.worker_id,
            on_missing=lambda missing: metrics.topic_missing.set(int(missing)),
        ),
        server=StatusServer(
            metrics,
            ReadyLimits(
                settings.ready_max_commit_age_s,
                settings.db_check_interval_s,
                settings.db_down_error_after_s,
            ),
            started=time.time(),
        ),
        progress=ProgressLog(WorkerProgress(metrics.registry), settings.progress_log_s),
    )


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD_BYTES = 128 * 1024


def tune_malloc() -> bool:
    """Keep large buffers out of the heap, so a worker's memory follows its byte bound.

    glibc serves allocations of 128 KiB and more with mmap and returns them to the system
    when freed, but after freeing one it raises that threshold to the freed size, so the
    next record-sized buffers (1 MiB poison values, COPY and dead-letter buffers) come
    from the heap, which fragments and does not shrink: a flood of 0.9 MB records peaked
    at 232 MB of RSS, 152 MB with the threshold fixed (tests/integration/test_flood.py).
    Fixing it with mallopt disables the raising. True when applied (glibc only).
    """
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False
