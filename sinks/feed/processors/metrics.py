"""Prometheus metrics of `ackline process`, one label per processor.

Like the worker's (``ackline.core.metrics``), every "applied" figure is counted after
COMMIT, never when read; lag is sampled from the database by
:func:`ackline.sinks.feed.processors.runner.watch`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ProcessorMetrics:
    """One registry per process (tests run several side by side)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        label = ["processor"]
        self.applied = Counter(
            "ackline_processor_events",
            "Events applied, counted when their batch committed",
            label,
            registry=r,
        )
        self.erased = Counter(
            "ackline_processor_erasure_notices",
            "Erasure notices handed (one per erased event; not counted as events applied)",
            label,
            registry=r,
        )
        self.batches = Counter(
            "ackline_processor_batches", "Batches committed (effects + cursor)", label, registry=r
        )
        self.errors = Counter(
            "ackline_processor_errors",
            "Errors by kind: transient (retried on a new connection), apply (a batch "
            "raised and rolled back), stopped (the processor stopped at an event), "
            "superseded (another filter took over), committed (the committed hook raised "
            "after its batch committed)",
            ["processor", "kind"],
            registry=r,
        )
        self.lost_races = Counter(
            "ackline_processor_lost_races",
            "Batches given up because another instance advanced the cursor first",
            label,
            registry=r,
        )
        self.lag_events = Gauge(
            "ackline_processor_lag_events",
            "Ingested events and erasure notices after the processor's cursor",
            label,
            registry=r,
        )
        self.lag_seconds = Gauge(
            "ackline_processor_lag_seconds",
            "Age of the oldest ingested batch after the processor's cursor (0: caught up)",
            label,
            registry=r,
        )
        self.failed = Gauge(
            "ackline_processor_failed",
            "1 while the processor is stopped at an event it raised on",
            label,
            registry=r,
        )
        self.paused = Gauge(
            "ackline_processor_paused", "1 while an operator has paused it", label, registry=r
        )
        self.last_commit = Gauge(
            "ackline_processor_last_commit_timestamp_seconds",
            "Unix time of the processor's last commit",
            label,
            registry=r,
        )
        self.db_up = Gauge(
            "ackline_processor_database_up",
            "1 when the last lag sample reached PostgreSQL",
            registry=r,
        )
