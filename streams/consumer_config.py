"""What the default runtime's consumer needs from the settings, and its librdkafka config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ackline.schemas.decode import DEFAULT_LIMITS, Limits


@dataclass(frozen=True)
class RuntimeConfig:
    bootstrap: str
    topic: str
    group_id: str
    worker_id: str
    group_protocol: str = "classic"
    session_timeout_ms: int = 10_000
    start_from: str = "earliest"
    batch_max_events: int = 2_000  # the settings' default
    batch_max_bytes: int = 8 * 1_048_576
    batch_linger_ms: int = 0  # 0: a batch closes as soon as the writer is free
    limits: Limits = DEFAULT_LIMITS
    revoke_wait_s: float = 20.0
    db_leave_after_s: float = 90.0  # 0: never leave the group while PostgreSQL is away
    shutdown_wait_s: float = 30.0
    max_poll_interval_ms: int = 300_000
    newer_version_wait_s: float = 0.0  # hold a partition at a newer payload version (holds.py)
    # Security properties (kafka_client_config); may hold secrets, so kept out of repr.
    kafka_extra: tuple[tuple[str, Any], ...] = field(default=(), repr=False)

    def consumer_conf(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group_id,
            "client.id": self.worker_id,
            "enable.auto.offset.store": False,  # stored only after the DB commit
            "enable.auto.commit": True,  # commits what was stored: advisory, for lag tools
            "auto.commit.interval.ms": 1_000,
            "isolation.level": "read_committed",
            # Every partition is assigned at an explicit offset (the DB's, or the start
            # resolved once at the first claim), so the reset applies only to an offset out
            # of range: one that retention deleted. The log start is then the only right
            # answer (the gap is counted); "latest" would skip what the log still holds.
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            # bounded prefetch: at most this much waits in librdkafka per worker
            "queued.max.messages.kbytes": max(min(16_384, self.batch_max_bytes // 1024), 1024),
            # one fetch response (held whole while it is parsed) no larger than a batch
            "fetch.max.bytes": max(self.batch_max_bytes, 1_048_576),
            "queued.min.messages": 10_000,
            # Once the queue is over those bounds librdkafka stops fetching a partition for
            # this long (its default: 1 s). A worker empties the queue far sooner, then
            # waited: ~0.5 s of every second of a backlog drain went so.
            "fetch.queue.backoff.ms": 20,
            "group.protocol": self.group_protocol,
            "max.poll.interval.ms": self.max_poll_interval_ms,
            # the group handler's state (streams.groupwatch) and each partition's last
            # stable offset, which lag is measured against (streams.lag); served inside consume()
            "statistics.interval.ms": 1_000,
        }
        if self.group_protocol == "classic":
            conf["partition.assignment.strategy"] = "cooperative-sticky"
            conf["session.timeout.ms"] = self.session_timeout_ms
            conf["heartbeat.interval.ms"] = max(self.session_timeout_ms // 5, 500)
        conf.update(dict(self.kafka_extra))
        return conf
