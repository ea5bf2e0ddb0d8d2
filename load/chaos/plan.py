"""The fault schedule of a chaos run: pure, derived from the seed alone.

A run's faults are a list of :class:`Fault`, sorted by ``at``: the fraction of the
expected records ingested when the fault starts. Timing in seconds is not part of the
plan (it depends on the machine); the order, the kinds, the targets and the armed
injection points are, so a run is reproduced from its seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

FaultKind = Literal[
    "kill", "stop", "broker", "postgres", "commit", "processor", "retention", "erase"
]
CommitMethod = Literal["in_commit", "before_commit"]

KILL_POINTS: tuple[str, ...] = (
    "after_fetch",
    "mid_copy",
    "before_commit",
    "after_commit",
    "after_claim",
    "before_dlq",
    "revoke_in_flight",
)
"""Points a restarted worker may be armed to SIGKILL itself at (ackline.core.faults)."""

ARMED_SHARE = 0.4
"""Share of kills whose replacement worker is armed to kill itself at a point."""

PROCESSOR_SALT = 0x9C0CE55
"""Mixed into the seed for the processor's kills: adding them leaves the rest of a
seed's schedule as it was."""


@dataclass(frozen=True)
class Fault:
    at: float
    """Ingest progress (0..1) at which the fault starts."""
    kind: FaultKind
    slot: int = 0
    """Worker slot targeted (kill, stop, commit before_commit)."""
    arm: str = ""
    """kill, processor: ACKLINE_FAULTS of the process started in the killed one's place
    ("" unarmed)."""
    hard: bool = False
    """broker/postgres: SIGKILL and crash recovery instead of a clean stop."""
    method: CommitMethod = "in_commit"
    """commit: terminate a backend whose COMMIT is in flight, or one stalled before it."""

    def describe(self) -> str:
        if self.kind == "kill":
            return f"SIGKILL worker slot {self.slot}" + (
                f", restart armed {self.arm}" if self.arm else ""
            )
        if self.kind == "processor":
            return "SIGKILL the runs processor" + (
                f", restart armed {self.arm}" if self.arm else ""
            )
        if self.kind == "stop":
            return f"SIGSTOP/SIGCONT a worker in slot {self.slot} holding a batch"
        if self.kind in ("broker", "postgres"):
            name = "Kafka broker" if self.kind == "broker" else "PostgreSQL"
            return f"restart the {name} ({'SIGKILL' if self.hard else 'clean stop'})"
        if self.kind == "retention":
            return "retention: detach and drop today's partition while workers write into it"
        if self.kind == "erase":
            return "erase the agent with the most stored events while workers ingest"
        return f"terminate a writer backend ({self.method.replace('_', ' ')})"


def plan(
    seed: int,
    *,
    workers: int,
    kills: int,
    stops: int,
    broker_restarts: int,
    pg_restarts: int,
    commit_faults: int,
    processor_kills: int = 0,
    retention_drops: int = 0,
    erasures: int = 0,
) -> list[Fault]:
    """The faults of a run, sorted by ``at`` (ties keep the kind order below).

    Zombies and commit faults come early (they need a batch in hand, so a backlog);
    kills and restarts spread over most of the run. Kills of the ``runs`` processor
    (half of them restarting it armed to kill itself between its effects and its
    COMMIT) draw from a generator of their own; retention drops and erasures in the
    run's middle are drawn last from the seed's, so the other faults of a seed are those
    of runs without them.
    """
    if workers < 2:
        raise ValueError("a chaos run needs at least 2 workers (a zombie needs an heir)")
    rng = random.Random(seed)
    faults: list[Fault] = []
    for _ in range(kills):
        arm = ""
        if rng.random() < ARMED_SHARE:
            point = rng.choice(KILL_POINTS)
            nth = (
                1
                if point in ("after_claim", "before_dlq", "revoke_in_flight")
                else rng.randint(1, 4)
            )
            arm = f"{point}=kill@{nth}"
        faults.append(Fault(rng.uniform(0.02, 0.9), "kill", rng.randrange(workers), arm))
    for _ in range(stops):
        faults.append(Fault(rng.uniform(0.04, 0.6), "stop", rng.randrange(workers)))
    for _ in range(commit_faults):
        method: CommitMethod = "before_commit" if rng.random() < 0.3 else "in_commit"
        faults.append(
            Fault(rng.uniform(0.03, 0.75), "commit", rng.randrange(workers), method=method)
        )
    for i in range(broker_restarts):
        faults.append(Fault(rng.uniform(0.2, 0.85), "broker", hard=i % 2 == 1))
    for i in range(pg_restarts):
        faults.append(Fault(rng.uniform(0.08, 0.85), "postgres", hard=i % 2 == 1))
    drops = [rng.uniform(0.3, 0.7) for _ in range(retention_drops)]
    erased = [rng.uniform(0.2, 0.8) for _ in range(erasures)]
    if drops and erased and min(erased) > min(drops):
        # An erasure after a drop of today's partition, both late (a run whose faults
        # lag its ingest), found nothing stored to erase and failed the run's coverage:
        # the first erasure comes first.
        first = erased.index(min(erased))
        erased[first] = min(drops) - 1e-9
    faults += [Fault(at, "retention") for at in drops]
    faults += [Fault(at, "erase") for at in erased]
    prng = random.Random(seed ^ PROCESSOR_SALT)
    for i in range(processor_kills):
        arm = f"processor_before_commit=kill@{prng.randint(1, 4)}" if i % 2 == 0 else ""
        faults.append(Fault(prng.uniform(0.05, 0.9), "processor", arm=arm))
    return sorted(faults, key=lambda f: f.at)
