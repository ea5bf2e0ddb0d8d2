"""The fault schedule of `make chaos-infra`: pure, derived from the seed alone.

Like :mod:`ackline.load.chaos.plan`, a run's faults are sorted by ``at``, the share of the
expected records ingested when the fault starts; the kinds, targets and order come from
the seed, the timing from the machine. The four classes (``--faults``):

- ``network``: black holes of one worker's PostgreSQL link (one of them while its COMMIT
  is in flight) and of all its Kafka links, connection resets, and a phase of latency with
  jitter on every worker link;
- ``cluster``: SIGKILLs of the leader of the busiest partition, one rolling restart;
- ``failover``: the PostgreSQL primary crashes and the standby is promoted, first with
  synchronous replication (nothing acknowledged may be lost), then asynchronous with the
  WAL sender held back (acknowledged commits are lost);
- ``disk``: the filesystem of the activity table's tablespace fills up.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

CLASSES = ("network", "cluster", "failover", "disk")
InfraKind = Literal[
    "pg_hole",
    "kafka_hole",
    "reset",
    "latency_on",
    "latency_off",
    "leader_kill",
    "roll",
    "failover",
    "disk_full",
]


@dataclass(frozen=True)
class Minimums:
    """How many of each fault a run must do (``ok`` needs them all)."""

    pg_holes: int = 5
    kafka_holes: int = 5
    resets: int = 3
    latency_phases: int = 1
    leader_kills: int = 3
    rolls: int = 1
    failovers_sync: int = 1
    failovers_async: int = 1
    disk_full: int = 1

    def only(self, classes: Collection[str]) -> Minimums:
        """The minimums of the selected classes (the others zero)."""
        network = "network" in classes
        cluster = "cluster" in classes
        failover = "failover" in classes
        return Minimums(
            pg_holes=self.pg_holes if network else 0,
            kafka_holes=self.kafka_holes if network else 0,
            resets=self.resets if network else 0,
            latency_phases=self.latency_phases if network else 0,
            leader_kills=self.leader_kills if cluster else 0,
            rolls=self.rolls if cluster else 0,
            failovers_sync=self.failovers_sync if failover else 0,
            failovers_async=self.failovers_async if failover else 0,
            disk_full=self.disk_full if "disk" in classes else 0,
        )


@dataclass(frozen=True)
class InfraFault:
    at: float
    kind: InfraKind
    slot: int = 0
    """The worker slot whose links the network faults hit."""
    in_commit: bool = False
    """pg_hole: start it while the worker's COMMIT is in flight."""
    target: str = ""
    """reset: "kafka" or "pg"."""
    sync: bool = False
    """failover: synchronous replication (else asynchronous, with the WAL sender held)."""

    def describe(self) -> str:
        if self.kind == "pg_hole":
            when = " while its COMMIT is in flight" if self.in_commit else ""
            return f"black-hole worker slot {self.slot}'s PostgreSQL link{when}"
        if self.kind == "kafka_hole":
            return f"black-hole worker slot {self.slot}'s Kafka links past its session timeout"
        if self.kind == "reset":
            return f"reset worker slot {self.slot}'s {self.target} connections"
        if self.kind == "latency_on":
            return "latency with jitter on every worker link: on"
        if self.kind == "latency_off":
            return "latency with jitter on every worker link: off"
        if self.kind == "leader_kill":
            return "SIGKILL the leader of the busiest partition"
        if self.kind == "roll":
            return "rolling restart of all brokers"
        if self.kind == "failover":
            mode = "synchronous" if self.sync else "asynchronous, WAL sender held back"
            return f"PostgreSQL failover ({mode}): crash the primary, promote, rebuild"
        return "fill the activity tablespace's filesystem, then free it"


def infra_plan(
    seed: int, *, workers: int, classes: Collection[str], minimums: Minimums
) -> list[InfraFault]:
    """The faults of a run, sorted by ``at`` (ties keep the order they were made in).

    The synchronous failover comes before the asynchronous one (the pair starts
    synchronous); the latency phase spans a fifth of the run.
    """
    unknown = set(classes) - set(CLASSES)
    if unknown:
        raise ValueError(f"unknown fault classes {sorted(unknown)} (known: {', '.join(CLASSES)})")
    if workers < 2:
        raise ValueError("an infrastructure chaos run needs at least 2 workers")
    m = minimums.only(classes)
    rng = random.Random(seed)
    faults: list[InfraFault] = []

    def spread(lo: float, hi: float) -> float:
        return rng.uniform(lo, hi)

    commit_hole = rng.randrange(m.pg_holes) if m.pg_holes else -1
    for i in range(m.pg_holes):
        faults.append(
            InfraFault(spread(0.05, 0.85), "pg_hole", rng.randrange(workers), i == commit_hole)
        )
    for _ in range(m.kafka_holes):
        faults.append(InfraFault(spread(0.05, 0.85), "kafka_hole", rng.randrange(workers)))
    for _ in range(m.resets):
        target = rng.choice(("kafka", "pg"))
        faults.append(InfraFault(spread(0.05, 0.9), "reset", rng.randrange(workers), target=target))
    for _ in range(m.latency_phases):
        start = spread(0.1, 0.6)
        faults.append(InfraFault(start, "latency_on"))
        faults.append(InfraFault(start + 0.2, "latency_off"))
    for _ in range(m.leader_kills):
        faults.append(InfraFault(spread(0.05, 0.85), "leader_kill"))
    for _ in range(m.rolls):
        faults.append(InfraFault(spread(0.25, 0.7), "roll"))
    for _ in range(m.failovers_sync):
        faults.append(InfraFault(spread(0.1, 0.4), "failover", sync=True))
    for _ in range(m.failovers_async):
        faults.append(InfraFault(spread(0.45, 0.8), "failover", sync=False))
    for _ in range(m.disk_full):
        faults.append(InfraFault(spread(0.1, 0.85), "disk_full"))
    return sorted(faults, key=lambda f: f.at)


__all__ = ["CLASSES", "InfraFault", "InfraKind", "Minimums", "infra_plan"]
