"""The one wiring of an ingest worker, shared by both runtimes.

:func:`build_ingest` turns the settings into the parts every ingest worker needs — the
metrics, the fault points, the writer's and the claims' PostgreSQL connections (as the
ingest role), the batch writer, the dead-letter producer, the decoder's limits and the
status server — without any I/O. Each runtime adds only what is its own: the
confluent-kafka consumer thread (:mod:`ackline.runtime.confluent`) or the faust app
(:mod:`ackline.runtime.faust_app`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ackline.clients import ingest_dsn, kafka_client_config
from ackline.core.errors import SettingsError
from ackline.core.faults import Faults
from ackline.core.metrics import Metrics
from ackline.runtime.health import ReadyLimits
from ackline.runtime.httpserver import StatusServer
from ackline.schemas.decode import Limits
from ackline.schemas.errors import SchemaError
from ackline.schemas.plugins import load_plugins
from ackline.settings import Settings
from ackline.sinks.admin.partitions import Upkeep
from ackline.sinks.connection import Database
from ackline.sinks.ingest.writer import BatchWriter
from ackline.streams.deadletter import DeadLetterProducer

log = logging.getLogger(__name__)


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
    db: Database  # the writer's connection
    control_db: Database  # claims and re-reads of offset rows, apart from the writer's
    writer: BatchWriter
    dead_letters: DeadLetterProducer
    limits: Limits
    server: StatusServer

    def serve(self) -> None:
        """Serve /metrics, /healthz and /readyz when ``metrics_port`` is set."""
        if self.settings.metrics_port:
            self.server.start(self.settings.metrics_host, self.settings.metrics_port)

    async def close(self) -> None:
        """Stop the status server, flush the dead-letter producer, close the connections."""
        self.server.close()
        self.dead_letters.close()
        await self.db.close()
        await self.control_db.close()


def build_ingest(settings: Settings, bootstrap: str, dsn: str) -> Ingest:
    """Wire an ingest worker from ``settings``. No I/O.

    ``dsn`` is the operator's; the worker connects as the ingest role
    (:func:`ackline.clients.ingest_dsn`, which raises SettingsError before anything
    connects when it cannot).
    """
    worker_dsn = ingest_dsn(settings, dsn)
    kafka_conf = kafka_client_config(settings)
    metrics = Metrics()
    faults = Faults(settings.faults, settings.fault_stall_seconds)

    def database(kind: str) -> Database:
        return Database(
            worker_dsn,
            idle_in_transaction_timeout_ms=settings.db_idle_in_transaction_timeout_ms,
            application_name=f"{kind}:{settings.worker_id}"[:63],
        )

    db = database("ackline")
    writer = BatchWriter(
        db,
        settings.group_id,
        settings.worker_id,
        faults,
        on_retry=lambda cause: metrics.retries.labels(cause).inc(),
        upkeep=Upkeep(
            settings.partition_interval, settings.partitions_ahead, settings.retention_keep()
        ),
    )
    return Ingest(
        settings=settings,
        bootstrap=bootstrap,
        dsn=worker_dsn,
        kafka_conf=kafka_conf,
        metrics=metrics,
        faults=faults,
        db=db,
        control_db=database("ackline-control"),
        writer=writer,
        dead_letters=DeadLetterProducer(bootstrap, settings.dlq_topic, extra=kafka_conf),
        limits=Limits(max_bytes=settings.max_message_bytes, max_depth=settings.max_json_depth),
        server=StatusServer(
            metrics,
            ReadyLimits(settings.ready_max_commit_age_s, settings.db_check_interval_s),
            started=time.time(),
        ),
    )
