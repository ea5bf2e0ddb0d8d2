"""Prometheus metrics. Every "ingested" figure is counted after the DB commit, never on fetch."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """One registry per runtime, so tests can run several side by side."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ingested = Counter(
            "ackline_ingested_rows", "Activity rows committed to PostgreSQL", registry=r
        )
        self.duplicates = Counter(
            "ackline_duplicates", "Duplicates dropped, by dedup layer", ["layer"], registry=r
        )
        self.exact_copies = Counter(
            "ackline_exact_copies",
            "Ledger duplicates written without being decoded (exact copies it confirmed)",
            registry=r,
        )
        self.conflicts = Counter(
            "ackline_conflicts", "Conflicts quarantined, by dedup layer", ["layer"], registry=r
        )
        self.rejects = Counter(
            "ackline_rejects", "Rejected records, by reason", ["reason"], registry=r
        )
        self.batch_size = Histogram(
            "ackline_batch_size",
            "Records per committed batch",
            buckets=(1, 10, 50, 100, 250, 500, 1000, 2000, 5000, 10000),
            registry=r,
        )
        self.batch_seconds = Histogram(
            "ackline_batch_seconds",
            "Time from batch dispatch to DB commit",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.batches = Counter("ackline_batches", "Batches committed", registry=r)
        self.fenced = Counter(
            "ackline_fenced_batches", "Batches rolled back because the epoch moved on", registry=r
        )
        self.retention_skipped = Counter(
            "ackline_retention_skipped_offsets",
            "Offsets deleted by retention before they were ingested (skipped, reported)",
            ["topic", "partition"],
            registry=r,
        )
        self.lag = Gauge(
            "ackline_partition_lag",
            "High watermark minus the DB next offset",
            ["topic", "partition"],
            registry=r,
        )
        self.retries = Counter(
            "ackline_db_retries", "Batch retries, by cause", ["cause"], registry=r
        )
        self.dead_letters = Counter(
            "ackline_dead_letters", "Dead-letter records acknowledged by Kafka", registry=r
        )
        self.assigned = Gauge("ackline_assigned_partitions", "Partitions owned now", registry=r)
        self.held = Gauge(
            "ackline_held_partitions",
            "Partitions held at a record of a payload version newer than this worker knows, "
            "waiting for a worker that knows it (docs/schema.md)",
            registry=r,
        )
        self.topic_partitions = Gauge(
            "ackline_topic_partitions",
            "Partitions of the topic this worker's group consumes (for the nobody-consumes "
            "alert: the group's assigned partitions summed over its workers fall short)",
            registry=r,
        )
        self.not_consumed = Gauge(
            "ackline_partitions_not_consumed",
            "Partitions Kafka assigns to this worker that it does not consume (suspended "
            "after a batch that did not commit or a fence, not claimed again yet; or DB "
            "offset past the log end)",
            registry=r,
        )
        self.last_commit = Gauge(
            "ackline_last_commit_timestamp_seconds", "Unix time of the last DB commit", registry=r
        )
        self.db_up = Gauge(
            "ackline_database_up", "1 when the last PostgreSQL health check succeeded", registry=r
        )
        self.db_down_since = Gauge(
            "ackline_database_down_since_timestamp_seconds",
            "Unix time since when the worker's own PostgreSQL operations have failed (0: they "
            "succeed)",
            registry=r,
        )
        self.db_checked = Gauge(
            "ackline_database_checked_timestamp_seconds",
            "Unix time of the last PostgreSQL health check",
            registry=r,
        )
        self.out_of_group = Gauge(
            "ackline_out_of_group",
            "1 while the worker has left the consumer group because it cannot connect to "
            "PostgreSQL (ACKLINE_DB_LEAVE_AFTER_S), until all its connections answer",
            registry=r,
        )
        self.waiting_to_join = Gauge(
            "ackline_waiting_to_join",
            "1 while the worker waits for PostgreSQL (its schema, its worker id) before it "
            "joins the consumer group",
            registry=r,
        )
        self.topic_missing = Gauge(
            "ackline_topic_missing",
            "1 while Kafka says the worker's topic does not exist (deleted, maybe being "
            "made again), as the watch of its incarnation last read it",
            registry=r,
        )
        self.behind_since = Gauge(
            "ackline_behind_since_timestamp_seconds",
            "Unix time since when the worker has been behind (lag > 0), as its lag reports "
            "saw it (0: caught up)",
            registry=r,
        )

    def total_lag(self) -> float:
        """``ackline_partition_lag`` summed over the partitions it has now."""
        return sum(
            s.value
            for family in self.lag.collect()
            for s in family.samples
            if s.name == "ackline_partition_lag"
        )

    def note_behind(self, now: float) -> None:
        """After a lag report: start the behind clock when the lag turned positive, stop it
        at 0. While the worker owns nothing the clock is left as it is: its lag gauges
        are gone then, and a worker cycling out of the group and back must not restart it.
        /readyz counts the commit age from it too: a worker idle past the bound, with
        nothing to commit, was not ready the moment records came."""
        if not self.registry.get_sample_value("ackline_assigned_partitions"):
            return
        lag = self.total_lag()
        if lag <= 0:
            self.behind_since.set(0)
        elif not self.registry.get_sample_value("ackline_behind_since_timestamp_seconds"):
            self.behind_since.set(now)

    def precreate(
        self, layers: Iterable[str], reasons: Iterable[str], causes: Iterable[str]
    ) -> None:
        """Create every labelled series the alerts read, at 0.

        A labelled counter has no sample until its first increment, and ``increase()``
        over a series that appears with the value 1 sees no increase: the first conflict
        after a restart would not fire the alert. Created at start, each series is 0
        from the first scrape. ``layers``: dedup layers (duplicates, conflicts);
        ``reasons``: reject reasons; ``causes``: batch retry causes.
        """
        for layer in layers:
            self.duplicates.labels(layer)
            self.conflicts.labels(layer)
        for reason in reasons:
            self.rejects.labels(reason)
        for cause in causes:
            self.retries.labels(cause)
