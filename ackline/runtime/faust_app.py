"""``make_app(ingest)``: the Faust app of the faust runtime, built by a factory.

Nothing here runs at import: no module-level app, no connection, no topic. The app is
configured from ackline's :class:`~ackline.settings.Settings` alone — faust is given an
empty environment (``env={}``), so no faust environment variable (``STREAM_WAIT_EMPTY``,
``BROKER_COMMIT_EVERY`` …) can change a setting this runtime depends on.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ackline.core.errors import SettingsError
from ackline.runtime.wiring import Ingest
from ackline.settings import Settings
from ackline.streams.faust_runtime.sink import FaustSink, KafkaSide
from ackline.streams.faust_runtime.transport import (
    AcklineApp,
    AcklineConsumer,
    NoTablesManager,
    Ownership,
)

AGENT_NAME = "ackline-ingest"
COMMIT_INTERVAL_S = 1.0  # Kafka commits of the DB offsets: advisory, for lag tooling
METADATA_MAX_AGE_MS = 5_000  # see faust_settings: bounds an empty-assignment stall
PARTITION_FETCH_BYTES = 1_048_576  # aiokafka's max_partition_fetch_bytes


@dataclass
class Parts:
    """What :func:`make_app` wired, for the worker and the tests."""

    sink: FaustSink
    ingest: Ingest


class FaustApp(AcklineApp):
    """The app :func:`make_app` returns: an :class:`AcklineApp` with its parts."""

    parts: Parts

    async def on_stop(self) -> None:
        """faust's graceful stop (flow stopped, taken records written and acked, DB
        offsets committed to Kafka), after the shutdown fault point."""
        await self.parts.sink.stopping()
        await super().on_stop()

    async def on_shutdown(self) -> None:
        """After faust stopped every service (agents included): close ackline's clients."""
        await super().on_shutdown()
        await self.parts.ingest.close()


def request_timeout_s(settings: Settings) -> float:
    """faust's broker_request_timeout: how long faust waits for a seek after an
    assignment before it abandons recovery (``ACKLINE_FAUST_RECOVERY_WAIT_S``, 90 s by
    default), and at least the session timeout (faust insists) with 30 s to spare."""
    return max(settings.faust_recovery_wait_s, settings.session_timeout_ms / 1000 + 30.0)


def faust_settings(settings: Settings, bootstrap: str) -> dict[str, Any]:
    """The faust configuration for ``settings``. Pure.

    The choices that the guarantees rest on: raw values (ackline decodes), waiting for
    in-flight messages at revoke and shutdown (``stream_wait_empty``), no web server, no
    leader topic, no topic creation, no tables, and an empty environment.
    """
    session_s = settings.session_timeout_ms / 1000
    return {
        "broker": [f"kafka://{host.strip()}" for host in bootstrap.split(",") if host.strip()],
        "env": {},
        "autodiscover": False,
        "key_serializer": "raw",
        "value_serializer": "raw",
        "processing_guarantee": "at_least_once",
        "stream_wait_empty": True,
        "stream_recovery_delay": 0.1,
        "stream_buffer_maxsize": max(settings.batch_max_events, 1_000),
        # Bytes, too (docs/faust.md, "Memory"): aiokafka keeps at most one fetch per
        # partition, each of at most this much (or one larger record); the app bounds
        # each request (fetch_max_bytes), the channel queue and the take by batch_max_bytes.
        "consumer_max_fetch_size": PARTITION_FETCH_BYTES,
        # Partitions are sought to explicit offsets; a reset happens only for an offset
        # retention deleted, where the log start is the one right answer (the consumer
        # runtime's docstring says why "latest" there would skip records).
        "consumer_auto_offset_reset": "earliest",
        "broker_client_id": settings.worker_id,
        "broker_session_timeout": session_s,
        "broker_heartbeat_interval": max(session_s / 5, 0.5),
        "broker_max_poll_interval": settings.max_poll_interval_ms / 1000,
        "broker_commit_interval": COMMIT_INTERVAL_S,
        "broker_request_timeout": request_timeout_s(settings),
        # The group leader assigns from its metadata; right after a broker restart that can
        # lack the topic's partitions ("No partition metadata"), so it assigns nothing to
        # anyone, and only a metadata refresh that sees them triggers a new assignment.
        # aiokafka's default refresh (5 minutes) left the whole group idle that long.
        "consumer_metadata_max_age_ms": METADATA_MAX_AGE_MS,
        "web_enabled": False,
        "topic_disable_leader": True,
        "topic_allow_declare": False,
        "table_standby_replicas": 0,
        "TableManager": NoTablesManager,  # no tables: no start-up wait for them
        "store": "memory://",
        "worker_redirect_stdouts": False,
        "datadir": str(Path(settings.state_dir) / "faust"),
    }


def make_app(ingest: Ingest) -> FaustApp:
    """Build the faust app on ``ingest``'s parts: one agent (concurrency 1) feeding the
    batch writer. No I/O: the clients connect when the worker starts.

    Raises SettingsError for what this runtime cannot do (SSL/SASL, the consumer group
    protocol, holds at newer payload versions).
    """
    settings = ingest.settings
    if settings.kafka_security_protocol != "PLAINTEXT":
        raise SettingsError(
            "ACKLINE_KAFKA_SECURITY_PROTOCOL",
            "the faust runtime supports PLAINTEXT only; use --runtime confluent for SSL/SASL",
        )
    if settings.group_protocol != "classic":
        raise SettingsError(
            "ACKLINE_GROUP_PROTOCOL",
            "the faust runtime (aiokafka) speaks the classic group protocol only",
        )
    if settings.newer_version_wait_s > 0:
        raise SettingsError(
            "ACKLINE_NEWER_VERSION_WAIT_S",
            "the faust runtime does not hold partitions at newer payload versions (0 only)",
        )
    sink = FaustSink(
        group_id=settings.group_id,
        worker_id=settings.worker_id,
        control_db=ingest.control_db,
        writer=ingest.writer,
        dead_letters=ingest.dead_letters,
        metrics=ingest.metrics,
        limits=ingest.limits,
        batch_max_events=settings.batch_max_events,
        batch_max_ms=settings.batch_max_ms,
        batch_max_bytes=settings.batch_max_bytes,
        faults=ingest.faults,
        claim_deadline_s=request_timeout_s(settings) * 2 / 3,  # exits before faust gives up
        revoke_wait_s=settings.revoke_wait_s,
    )
    app = FaustApp(settings.group_id, **faust_settings(settings, ingest.bootstrap))
    app.buffer_max_bytes = settings.batch_max_bytes  # before any channel makes its queue
    app.ownership = Ownership(
        topic=settings.topic,
        start_from=settings.start_from,
        ledger=sink.ledger,
        claim=sink.claim,
        revoking=sink.revoking,
        faults=ingest.faults,
        seek_deadline_s=request_timeout_s(settings) * 8 / 9,  # exits before faust gives up
    )
    app.parts = Parts(sink, ingest)
    sink.kafka = _kafka_side(app)
    sink.settled = functools.partial(ingest.incarnation.settled, lambda: bool(app.should_stop))
    topic = app.topic(settings.topic, key_serializer="raw", value_serializer="raw")
    app.agent(topic, name=AGENT_NAME, concurrency=1)(sink.consume)
    return app


def _kafka_side(app: FaustApp) -> KafkaSide:
    """The sink's view of the app's consumer (which exists only once the app runs)."""

    def assigned() -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in app.consumer.assignment()}

    async def seek(offsets: Mapping[tuple[str, int], int | None]) -> None:
        await cast(AcklineConsumer, app.consumer).seek_positions(offsets)

    return KafkaSide(assigned=assigned, seek=seek)
