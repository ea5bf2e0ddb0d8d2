"""The data of a chaos run: its configuration, its fault counts and its report.

The report's JSON object (:meth:`ChaosReport.to_json`) is the last line `make chaos`
prints; ``ok`` requires the verify verdict to be exact, every minimum count to be met,
every zombie to be fenced, Kafka's committed offsets never ahead of the DB offsets, and
(with the ``runs`` processor on) every run's row equal to its recomputation from
``activity`` (``runs_mismatch`` 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ackline.load.chaos.runs_check import RunsCheck
from ackline.load.generate import Knobs
from ackline.load.verify import Verdict, render_summary


@dataclass(frozen=True)
class ChaosConfig:
    events: int = 1_000_000
    workers: int = 3
    partitions: int = 12
    kills: int = 30
    stops: int = 3
    broker_restarts: int = 2
    pg_restarts: int = 2
    commit_faults: int = 10
    retention_drops: int = 1
    """Retention drops of the partition being written (docs/retention.md)."""
    erasures: int = 1
    """Erasures of an agent's activity while it is being ingested."""
    seed: int | None = None
    group_protocol: str = "classic"
    runtime: str = "confluent"  # `ackline run --runtime` (docs/faust.md)
    state_dir: Path = Path(".ackline/chaos")
    batch_max_events: int = 1000
    writer_connections: tuple[int, ...] = ()
    """The workers' ACKLINE_WRITER_CONNECTIONS, by worker slot in turn: (1, 2) runs a
    group that mixes one-connection and two-connection workers; empty: their default."""
    produce_rate: float = 0.0
    """Events per second the producer is held to (0: as fast as it goes); a short run uses
    it to keep a backlog while its faults happen."""
    session_timeout_ms: int = 4000
    drain_timeout_s: float = 3600.0
    keep_stack: bool = False
    processor_kills: int = 4
    """SIGKILLs of the `ackline process runs` beside the workers (0: run no processor)."""

    def command(self, seed: int) -> str:
        """The command line that reproduces a run of this configuration with ``seed``."""
        return (
            f"ackline chaos --seed {seed} --events {self.events} --workers {self.workers} "
            f"--partitions {self.partitions} --kills {self.kills} --stops {self.stops} "
            f"--broker-restarts {self.broker_restarts} --pg-restarts {self.pg_restarts} "
            f"--commit-faults {self.commit_faults} --group-protocol {self.group_protocol} "
            f"--batch-max-events {self.batch_max_events} --produce-rate {self.produce_rate:g} "
            f"--runtime {self.runtime} --processor-kills {self.processor_kills}"
            + (
                f" --writer-connections {','.join(map(str, self.writer_connections))}"
                if self.writer_connections
                else ""
            )
        )

    def knobs(self) -> Knobs:
        # The full mix; oversize poison kept small (the workers' limit is 64 KiB).
        return Knobs(oversize_bytes=70_000)


@dataclass
class Counts:
    kills: int = 0
    armed_kills: int = 0
    stops: int = 0
    stops_fenced: int = 0
    broker_restarts: int = 0
    pg_restarts: int = 0
    commit_faults: int = 0
    commit_faults_in_commit: int = 0
    retention_drops: int = 0
    erasures: int = 0
    erased_events: int = 0
    unexpected_exits: int = 0
    processor_kills: int = 0
    processor_armed_kills: int = 0
    processor_exits: int = 0
    """The processor ended by itself, not at an armed point (restarted)."""
    skipped: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ChaosReport:
    seed: int
    config: ChaosConfig
    counts: Counts
    verdict: Verdict
    fenced_batches: int
    fenced_log_lines: int
    offset_samples: int
    max_kafka_ahead_of_db: int
    duration_s: float
    runs: RunsCheck | None = None
    """The runs projection against activity (None: no processor ran)."""

    @property
    def runs_ok(self) -> bool:
        if self.config.processor_kills <= 0:
            return True
        return (
            self.runs is not None
            and self.runs.mismatches == 0
            and self.counts.processor_kills >= self.config.processor_kills
        )

    @property
    def ok(self) -> bool:
        c, cfg = self.counts, self.config
        return (
            self.verdict.ok
            and self.verdict.drained
            and c.kills >= cfg.kills
            and c.stops >= cfg.stops
            and c.stops_fenced >= cfg.stops
            and self.fenced_batches >= cfg.stops
            and c.broker_restarts >= cfg.broker_restarts
            and c.pg_restarts >= cfg.pg_restarts
            and c.commit_faults >= cfg.commit_faults
            and c.retention_drops >= cfg.retention_drops
            and c.erasures >= cfg.erasures
            and self.max_kafka_ahead_of_db == 0
            and self.runs_ok
        )

    def to_json(self) -> dict[str, Any]:
        v, c = self.verdict, self.counts
        return {
            "events": self.config.events,
            "workers": self.config.workers,
            "kills": c.kills,
            "stops": c.stops,
            "broker_restarts": c.broker_restarts,
            "pg_restarts": c.pg_restarts,
            "commit_faults": c.commit_faults,
            "fenced_batches": self.fenced_batches,
            "lost": v.lost,
            "duplicated": v.duplicated,
            "conflicts_expected": v.conflicts_expected,
            "conflicts_quarantined": v.conflicts_quarantined,
            "rejects_expected": v.rejects_expected,
            "rejected": v.rejected,
            "max_kafka_ahead_of_db": self.max_kafka_ahead_of_db,
            "ok": self.ok,
            "seed": self.seed,
            "duration_s": round(self.duration_s, 1),
            "partitions": self.config.partitions,
            "group_protocol": self.config.group_protocol,
            "runtime": self.config.runtime,
            "records": v.produced,
            "aborted": v.aborted,
            "ingested": v.ingested,
            "duplicates_dropped": v.duplicates_dropped,
            "armed_kills": c.armed_kills,
            "zombies_fenced": c.stops_fenced,
            "commit_in_flight": c.commit_faults_in_commit,
            "offset_samples": self.offset_samples,
            "unexpected_exits": c.unexpected_exits,
            "runs_mismatch": None if self.runs is None else self.runs.mismatches,
            "runs": None if self.runs is None else self.runs.runs,
            "processor_kills": c.processor_kills,
            "processor_armed_kills": c.processor_armed_kills,
            "processor_exits": c.processor_exits,
            "retention_drops": c.retention_drops,
            "erasures": c.erasures,
            "erased": v.erased,
            "dropped_by_retention": v.dropped_by_retention,
        }

    def render(self) -> str:
        c, cfg = self.counts, self.config
        rows = [
            ("worker SIGKILLs", c.kills, cfg.kills, f"{c.armed_kills} at armed fault points"),
            ("zombies (SIGSTOP/SIGCONT)", c.stops, cfg.stops, f"{c.stops_fenced} fenced"),
            ("fenced batches", self.fenced_batches, cfg.stops, f"{self.fenced_log_lines} logged"),
            ("Kafka broker restarts", c.broker_restarts, cfg.broker_restarts, ""),
            ("PostgreSQL restarts", c.pg_restarts, cfg.pg_restarts, ""),
            (
                "backends terminated at COMMIT",
                c.commit_faults,
                cfg.commit_faults,
                f"{c.commit_faults_in_commit} with COMMIT in flight",
            ),
            (
                "retention drops (live partition)",
                c.retention_drops,
                cfg.retention_drops,
                f"{self.verdict.dropped_by_retention} ingested events went with them",
            ),
            (
                "erasures (agent, live)",
                c.erasures,
                cfg.erasures,
                f"{c.erased_events} events erased, {self.verdict.erased} of them winners",
            ),
        ]
        lines = [
            f"chaos run, seed {self.seed}: {cfg.events:,} events, {cfg.workers} workers, "
            f"{cfg.partitions} partitions, group protocol {cfg.group_protocol}, "
            f"runtime {cfg.runtime}, "
            f"{self.duration_s:.0f} s",
            f"{'fault':<32}{'done':>6}{'min':>6}",
        ]
        for label, done, minimum, note in rows:
            mark = "ok" if done >= minimum else "TOO FEW"
            lines.append(f"{label:<32}{done:>6}{minimum:>6}  {mark:<8}{note}")
        ahead = "ok" if self.max_kafka_ahead_of_db == 0 else "KAFKA AHEAD"
        lines.append(
            f"{'max Kafka offset ahead of DB':<32}{self.max_kafka_ahead_of_db:>6}{0:>6}  "
            f"{ahead:<8}{self.offset_samples} samples"
        )
        if cfg.processor_kills > 0:
            lines.append(
                f"{'runs processor SIGKILLs':<32}{c.processor_kills:>6}{cfg.processor_kills:>6}  "
                f"{'ok' if c.processor_kills >= cfg.processor_kills else 'TOO FEW':<8}"
                f"{c.processor_armed_kills} between effects and COMMIT"
            )
        if c.unexpected_exits:
            lines.append(f"workers that exited by themselves (restarted): {c.unexpected_exits}")
        if c.processor_exits:
            lines.append(f"processor exits by itself (restarted): {c.processor_exits}")
        for note in c.skipped:
            lines.append(f"note: {note}")
        lines.append(render_summary(self.verdict))
        if self.runs is not None:
            r = self.runs
            mark = "ok" if r.mismatches == 0 else "MISMATCH"
            lines.append(
                f"runs projection vs activity: {r.runs:,} runs, {r.mismatches} mismatches "
                f"({r.missing} missing, {r.extra} extra, {r.different} different)  {mark}"
                + (f"  e.g. {', '.join(r.examples)}" if r.examples else "")
            )
        lines.append(f"reproduce: {cfg.command(self.seed)}")
        lines.append(f"chaos verdict: {'OK' if self.ok else 'FAILED'}")
        return "\n".join(lines)
