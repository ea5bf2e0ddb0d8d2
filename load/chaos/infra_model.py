"""The data of a `make chaos-infra` run: its configuration, fault counts and report.

The report's JSON object (:meth:`InfraReport.to_json`) is the last line printed: every
key `make chaos` prints (:meth:`ackline.load.chaos.model.ChaosReport.to_json`), then the
infrastructure faults' counts. ``ok`` follows the same rules as `make chaos`: verify
exact and drained, every minimum met, and Kafka's committed offsets never ahead of the DB,
except where an asynchronous failover took back commits Kafka had already been told
about (``kafka_ahead_after_failover``, reported apart: those offsets were the DB's on the
old primary; the workers resume from the DB, so it can never make a record be skipped).
Beside them: no acknowledged commit lost by a synchronous failover, every Kafka black
hole cost its worker its partitions and gave them back, every disk-full episode was
alerted (metric and ``/readyz``) and drained, the ``runs`` projection and the dispatcher
exact against ``activity``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ackline.load.chaos.infra_plan import CLASSES, Minimums
from ackline.load.chaos.model import ChaosConfig, ChaosReport, Counts
from ackline.load.chaos.runs_check import RunsCheck
from ackline.load.verify import Verdict, render_summary

LATENCY_MS = (5, 49)
"""The latency phase: each direction of every worker link waits 27 ± 22 ms."""


@dataclass(frozen=True)
class InfraConfig:
    events: int = 1_000_000
    workers: int = 3
    partitions: int = 12
    classes: tuple[str, ...] = CLASSES
    seed: int | None = None
    runtime: str = "confluent"
    group_protocol: str = "classic"
    state_dir: Path = Path(".ackline/chaos-infra")
    batch_max_events: int = 1000
    produce_rate: float = 1500.0
    """Production is held to this many events per second, so the backlog outlasts the
    faults (a failover, a roll or a black hole takes tens of seconds each)."""
    minimums: Minimums = field(default_factory=Minimums)
    session_timeout_ms: int = 6000
    statement_timeout_s: float = 8.0
    """The workers' PostgreSQL statement and COMMIT bound; a PostgreSQL black hole lasts
    longer than it."""
    pg_hole_s: float = 14.0
    kafka_hole_min_s: float = 12.0
    """A Kafka black hole lasts at least this (twice the session timeout), and until the
    worker's partitions are all claimed by others (or ``kafka_hole_max_s``)."""
    kafka_hole_max_s: float = 60.0
    async_lag_s: float = 2.0
    """How long the WAL sender is held before the asynchronous failover's crash."""
    async_lag_wait_s: float = 120.0
    """Past ``async_lag_s``, how long to wait for a batch acknowledged past the hold."""
    down_error_after_s: float = 5.0
    """ACKLINE_DB_DOWN_ERROR_AFTER_S of the workers: a full disk fails /readyz after it."""
    drain_timeout_s: float = 3600.0
    keep_stack: bool = False

    def command(self, seed: int) -> str:
        """The command line that reproduces a run of this configuration with ``seed``."""
        m = self.minimums
        return (
            f"ackline chaos --faults {','.join(self.classes)} --seed {seed} "
            f"--events {self.events} --workers {self.workers} --partitions {self.partitions} "
            f"--batch-max-events {self.batch_max_events} --produce-rate {self.produce_rate:g} "
            f"--runtime {self.runtime} --group-protocol {self.group_protocol} "
            f"--pg-blackholes {m.pg_holes} --kafka-blackholes {m.kafka_holes} "
            f"--resets {m.resets} --leader-kills {m.leader_kills} --broker-rolls {m.rolls} "
            f"--sync-failovers {m.failovers_sync} --async-failovers {m.failovers_async} "
            f"--disk-full {m.disk_full}"
        )

    def base(self) -> ChaosConfig:
        """The `make chaos` configuration this run reports under: no process faults."""
        return ChaosConfig(
            events=self.events,
            workers=self.workers,
            partitions=self.partitions,
            kills=0,
            stops=0,
            broker_restarts=0,
            pg_restarts=0,
            commit_faults=0,
            processor_kills=0,
            seed=self.seed,
            group_protocol=self.group_protocol,
            runtime=self.runtime,
            state_dir=self.state_dir,
            batch_max_events=self.batch_max_events,
            produce_rate=self.produce_rate,
            session_timeout_ms=self.session_timeout_ms,
        )


@dataclass
class InfraCounts:
    pg_holes: int = 0
    pg_holes_in_commit: int = 0
    pg_holes_recovered: int = 0
    kafka_holes: int = 0
    kafka_holes_lost: int = 0
    """Holes after which the worker's partitions were all owned by others."""
    kafka_holes_back: int = 0
    """Holes after which the worker owned partitions again."""
    kafka_holes_fenced: int = 0
    """Batches of a black-holed worker fenced after it lost its partitions."""
    resets: int = 0
    latency_phases: int = 0
    leader_kills: int = 0
    broker_rolls: int = 0
    pg_failovers: int = 0
    pg_failovers_async: int = 0
    rolled_back_commits: int = 0
    """Acknowledged batches an asynchronous failover took back."""
    sync_lost_commits: int = 0
    """Acknowledged batches a synchronous failover took back (must be 0)."""
    rebuilds: list[str] = field(default_factory=list)
    disk_full_episodes: int = 0
    disk_full_alerted: int = 0
    disk_full_drained: int = 0
    commits_reconciled: int = 0
    """Unknown COMMIT outcomes the workers found committed by reading (log lines)."""
    commits_retried: int = 0
    """Unknown COMMIT outcomes found rolled back, and written again (log lines)."""
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DispatchCheck:
    requests: int
    runs: int
    deliveries: int
    requested_events: int

    @property
    def mismatches(self) -> int:
        """Requests without a run or runs without a request, plus deliveries that do not
        add up to the agent.requested events in activity (each delivered once)."""
        return abs(self.requests - self.runs) + abs(self.deliveries - self.requested_events)


@dataclass(frozen=True)
class InfraReport:
    config: InfraConfig
    base: ChaosReport
    counts: InfraCounts
    kafka_ahead_after_failover: int
    runs: RunsCheck | None
    dispatch: DispatchCheck | None

    @property
    def verdict(self) -> Verdict:
        return self.base.verdict

    def shortfalls(self) -> list[str]:
        """Why the run is not ok (empty: it is)."""
        c, m = self.counts, self.config.minimums.only(self.config.classes)
        out = []
        if not (self.verdict.ok and self.verdict.drained):
            out.append("verify is not exact and drained")
        if self.base.max_kafka_ahead_of_db != 0:
            out.append(f"Kafka ahead of the DB by {self.base.max_kafka_ahead_of_db}, unexplained")
        wanted = [
            ("PostgreSQL black holes", c.pg_holes, m.pg_holes),
            ("... one while COMMIT is in flight", c.pg_holes_in_commit, min(1, m.pg_holes)),
            ("... the worker committing again after", c.pg_holes_recovered, m.pg_holes),
            ("Kafka black holes", c.kafka_holes, m.kafka_holes),
            ("... partitions all lost", c.kafka_holes_lost, m.kafka_holes),
            ("... partitions back", c.kafka_holes_back, m.kafka_holes),
            ("resets", c.resets, m.resets),
            ("latency phases", c.latency_phases, m.latency_phases),
            ("leader kills", c.leader_kills, m.leader_kills),
            ("broker rolls", c.broker_rolls, m.rolls),
            ("failovers", c.pg_failovers, m.failovers_sync + m.failovers_async),
            ("asynchronous failovers", c.pg_failovers_async, m.failovers_async),
            (
                "commits rolled back by them",
                min(c.rolled_back_commits, 1),
                min(1, m.failovers_async),
            ),
            ("disk-full episodes", c.disk_full_episodes, m.disk_full),
            ("... alerted", c.disk_full_alerted, m.disk_full),
            ("... drained", c.disk_full_drained, m.disk_full),
        ]
        out += [f"{label}: {done} < {need}" for label, done, need in wanted if done < need]
        if c.sync_lost_commits:
            out.append(f"a synchronous failover lost {c.sync_lost_commits} acknowledged commits")
        if self.runs is not None and self.runs.mismatches:
            out.append(f"runs projection: {self.runs.mismatches} mismatches")
        if self.dispatch is not None and self.dispatch.mismatches:
            out.append(f"dispatcher: {self.dispatch.mismatches} mismatches")
        return out

    @property
    def ok(self) -> bool:
        return not self.shortfalls()

    def to_json(self) -> dict[str, Any]:
        out = self.base.to_json()
        c = self.counts
        out.update(
            {
                "ok": self.ok,
                "faults": ",".join(self.config.classes),
                "net_blackholes": c.pg_holes + c.kafka_holes,
                "net_resets": c.resets,
                "latency_ms": list(LATENCY_MS) if c.latency_phases else [],
                "leader_kills": c.leader_kills,
                "broker_rolls": c.broker_rolls,
                "pg_failovers": c.pg_failovers,
                "pg_failovers_async": c.pg_failovers_async,
                "rolled_back_commits": c.rolled_back_commits,
                "disk_full_episodes": c.disk_full_episodes,
                "kafka_ahead_after_failover": self.kafka_ahead_after_failover,
                "pg_blackholes": c.pg_holes,
                "pg_blackholes_in_commit": c.pg_holes_in_commit,
                "kafka_blackholes": c.kafka_holes,
                "kafka_blackholes_lost_and_back": min(c.kafka_holes_lost, c.kafka_holes_back),
                "kafka_blackholes_fenced": c.kafka_holes_fenced,
                "sync_lost_commits": c.sync_lost_commits,
                "rebuilds": c.rebuilds,
                "disk_full_alerted": c.disk_full_alerted,
                "commits_reconciled": c.commits_reconciled,
                "commits_retried": c.commits_retried,
                "dispatch_mismatch": None if self.dispatch is None else self.dispatch.mismatches,
            }
        )
        return out

    def render(self) -> str:
        c = self.counts
        m = self.config.minimums.only(self.config.classes)
        cfg = self.config
        rows = [
            ("PostgreSQL black holes", c.pg_holes, m.pg_holes,
             f"{c.pg_holes_in_commit} during COMMIT, {c.pg_holes_recovered} recovered"),
            ("Kafka black holes", c.kafka_holes, m.kafka_holes,
             f"{c.kafka_holes_lost} lost all partitions, {c.kafka_holes_back} came back, "
             f"{c.kafka_holes_fenced} fenced batches"),
            ("connection resets", c.resets, m.resets, ""),
            ("latency phases", c.latency_phases, m.latency_phases,
             f"{LATENCY_MS[0]}-{LATENCY_MS[1]} ms each way"),
            ("leader SIGKILLs", c.leader_kills, m.leader_kills, ""),
            ("rolling restarts", c.broker_rolls, m.rolls, ""),
            ("PostgreSQL failovers", c.pg_failovers, m.failovers_sync + m.failovers_async,
             f"{c.pg_failovers_async} async; rebuilt by {', '.join(c.rebuilds) or '-'}"),
            ("commits rolled back (async)", c.rolled_back_commits, min(1, m.failovers_async),
             f"{c.sync_lost_commits} lost by the synchronous one"),
            ("disk-full episodes", c.disk_full_episodes, m.disk_full,
             f"{c.disk_full_alerted} alerted, {c.disk_full_drained} drained"),
        ]  # fmt: skip
        lines = [
            f"infrastructure chaos run, seed {self.base.seed}: {cfg.events:,} events, "
            f"{cfg.workers} workers, {cfg.partitions} partitions, faults "
            f"{','.join(cfg.classes)}, {self.base.duration_s:.0f} s",
            f"{'fault':<32}{'done':>6}{'min':>6}",
        ]
        for label, done, minimum, note in rows:
            mark = "ok" if done >= minimum else "TOO FEW"
            lines.append(f"{label:<32}{done:>6}{minimum:>6}  {mark:<8}{note}")
        lines.append(
            f"{'max Kafka offset ahead of DB':<32}{self.base.max_kafka_ahead_of_db:>6}{0:>6}  "
            f"{'ok' if self.base.max_kafka_ahead_of_db == 0 else 'KAFKA AHEAD':<8}"
            f"{self.base.offset_samples} samples; {self.kafka_ahead_after_failover} ahead "
            "after an async failover (offsets the old primary had)"
        )
        lines.append(
            f"unknown COMMIT outcomes: {c.commits_reconciled} found committed by reading, "
            f"{c.commits_retried} found rolled back and written again"
        )
        for note in [*self.base.counts.skipped, *c.notes]:
            lines.append(f"note: {note}")
        lines.append(render_summary(self.verdict))
        if self.runs is not None:
            lines.append(f"runs projection vs activity: {self.runs.mismatches} mismatches")
        if self.dispatch is not None:
            d = self.dispatch
            lines.append(
                f"dispatcher vs activity: {d.runs:,} runs for {d.requests:,} requests, "
                f"{d.deliveries:,} deliveries for {d.requested_events:,} agent.requested "
                f"events: {d.mismatches} mismatches"
            )
        for reason in self.shortfalls():
            lines.append(f"FAILED: {reason}")
        lines.append(f"reproduce: {cfg.command(self.base.seed)}")
        lines.append(f"chaos verdict: {'OK' if self.ok else 'FAILED'}")
        return "\n".join(lines)


__all__ = ["LATENCY_MS", "Counts", "DispatchCheck", "InfraConfig", "InfraCounts", "InfraReport"]
