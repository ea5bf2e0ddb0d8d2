"""What this worker owns, and which records a batch may take. Pure: no I/O, no faust.

faust's own bookkeeping (acked offsets, gaps, read offsets, committed offsets) is not
trusted by this runtime. The ledger replaces it with three facts per partition:

- the owner **epoch** PostgreSQL gave this worker when it claimed the partition, and the
  Kafka consumer **generation** the claim was made in;
- the **DB next offset**: where PostgreSQL says the partition resumes (advanced only
  after a batch's transaction committed);
- the highest offset already **taken** into a batch under this claim.

A record is taken into a batch only when it was fetched in the generation of the claim,
its partition is owned, it is at or past the DB next offset and past every offset
already taken. Everything else is dropped (it is re-read by whoever owns it, from the DB
next offset). The offsets committed to Kafka are the DB next offsets, never more.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from ackline.sinks.ingest.batch import TP, PartitionRange
from ackline.sinks.ingest.offsets import Claim

NO_GENERATION = -1


class Admit(Enum):
    """Why a record may or may not enter a batch."""

    TAKE = "take"
    STALE = "stale"  # fetched in another consumer generation than the claim
    UNOWNED = "unowned"  # not claimed by this worker (now)
    COMMITTED = "committed"  # below the DB next offset: PostgreSQL already has it
    REPEAT = "repeat"  # at or below an offset already taken under this claim


@dataclass(slots=True)
class _Owned:
    epoch: int
    next_offset: int | None  # None: PostgreSQL has no offset for this partition yet
    taken: int | None = None


class Ledger:
    """Ownership, DB offsets and Kafka commits of one worker. Single-threaded (the loop)."""

    def __init__(self) -> None:
        self.generation = NO_GENERATION
        self._owned: dict[TP, _Owned] = {}
        self._kafka: dict[TP, int] = {}

    # ---- ownership -------------------------------------------------------------------

    def claimed(self, generation: int, claims: Iterable[Claim]) -> None:
        """Replace the ownership with ``claims``, made in consumer ``generation``.

        faust rebalances eagerly: every assignment is the complete one, so partitions
        missing from ``claims`` are no longer owned.
        """
        self.generation = generation
        self._owned = {(c.topic, c.partition): _Owned(c.epoch, c.next_offset) for c in claims}
        self._kafka = {tp: off for tp, off in self._kafka.items() if tp in self._owned}

    def release(self, tps: Iterable[TP]) -> None:
        """Stop owning ``tps`` (revoked): their records are dropped from now on."""
        for tp in tps:
            self._owned.pop(_tp(tp), None)
            self._kafka.pop(_tp(tp), None)

    def forget_fenced(self, ranges: Iterable[PartitionRange], fenced: Iterable[TP]) -> list[TP]:
        """After a batch was fenced: stop owning the fenced partitions still held under the
        batch's epoch (another worker holds them). A partition claimed again since (a new
        epoch) stays owned: its records are re-read from the DB offset by the new claim.
        """
        epochs = {(r.topic, r.partition): r.epoch for r in ranges}
        gone = []
        for tp in map(_tp, fenced):
            owned = self._owned.get(tp)
            if owned is not None and owned.epoch == epochs.get(tp):
                del self._owned[tp]
                self._kafka.pop(tp, None)
                gone.append(tp)
        return gone

    def owned(self) -> dict[TP, int]:
        """Partition → epoch, for every partition owned now."""
        return {tp: o.epoch for tp, o in self._owned.items()}

    def epoch(self, tp: TP) -> int:
        return self._owned[_tp(tp)].epoch

    def resume_offsets(self) -> dict[TP, int | None]:
        """Where each owned partition resumes: the DB next offset (None: no offset yet)."""
        return {tp: o.next_offset for tp, o in self._owned.items()}

    # ---- records ---------------------------------------------------------------------

    def admit(self, tp: TP, offset: int, generation: int) -> Admit:
        """Decide whether the record at ``tp``/``offset`` may enter a batch; TAKE marks it
        taken, so a repeated delivery of it (or of anything before it) is refused."""
        if generation != self.generation:
            return Admit.STALE
        owned = self._owned.get(_tp(tp))
        if owned is None:
            return Admit.UNOWNED
        if owned.next_offset is not None and offset < owned.next_offset:
            return Admit.COMMITTED
        if owned.taken is not None and offset <= owned.taken:
            return Admit.REPEAT
        owned.taken = offset
        return Admit.TAKE

    def committed(self, ranges: Iterable[PartitionRange]) -> None:
        """The batch covering ``ranges`` committed in PostgreSQL: advance the DB next
        offsets of the partitions still owned under the batch's epoch."""
        for r in ranges:
            owned = self._owned.get((r.topic, r.partition))
            if owned is None or owned.epoch != r.epoch:
                continue
            if owned.next_offset is None or r.next_offset > owned.next_offset:
                owned.next_offset = r.next_offset

    # ---- Kafka commits (advisory) ----------------------------------------------------

    def commit_targets(self, assignment: Iterable[TP] | None = None) -> dict[TP, int]:
        """Offsets to commit to Kafka: the DB next offset of each owned partition (in
        ``assignment`` when given) that moved since the last Kafka commit. Never more."""
        allowed = None if assignment is None else {_tp(tp) for tp in assignment}
        out: dict[TP, int] = {}
        for tp, owned in self._owned.items():
            if allowed is not None and tp not in allowed:
                continue
            if owned.next_offset is not None and owned.next_offset > self._kafka.get(tp, -1):
                out[tp] = owned.next_offset
        return out

    def kafka_committed(self, offsets: Mapping[TP, int]) -> None:
        """Kafka acknowledged the commit of ``offsets``."""
        for tp, offset in offsets.items():
            if _tp(tp) in self._owned:
                self._kafka[_tp(tp)] = offset


def _tp(tp: TP) -> TP:
    """A plain (topic, partition) tuple from faust's or aiokafka's named tuples."""
    return (tp[0], tp[1])
