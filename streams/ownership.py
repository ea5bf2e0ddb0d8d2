"""What a worker owns, and which records a batch may take. Pure: no I/O, no Kafka client.

Both runtimes keep their partitions in one :class:`Ledger`. Kafka's own bookkeeping
(committed offsets, a consumer's position, faust's acks) is never trusted for where a
partition resumes; the ledger holds, per owned partition:

- the owner **epoch** PostgreSQL gave this worker when it claimed the partition (every
  batch's transaction compare-and-sets it: docs/design.md, "Fencing");
- the **DB next offset**: where PostgreSQL says the partition resumes, advanced only after
  a batch's transaction committed;
- the highest offset already **taken** into a batch under this claim;
- after a batch that did not commit, a **rewind mark**: the partition is being re-read
  from its DB next offset, and records fetched before that seek took effect are refused.

A record is taken into a batch only when it was fetched in the consumer generation of the
claim (faust hands records across generations), its partition is owned, it is at or past
the DB next offset, past every offset already taken, and not a leftover of a rewound
read. Everything else is dropped: whoever owns the partition re-reads it from the DB next
offset. The offsets committed to Kafka are the DB next offsets, never more.

Why the rewind mark: a batch that did not commit on some partition (fenced elsewhere in
the same transaction, or cancelled) leaves that partition's DB offset where it was, while
the records after the batch may already be fetched. Taking them would start the next
batch past the dropped records, and the fence (``next_offset <= first_offset``: offsets
are not contiguous, so it cannot ask for equality) would let it commit: the dropped
records would be lost. After the seek back to the DB next offset, the first record
fetched is at or below the highest offset taken before (the dropped batch's records
exist), while every record fetched before the seek is above it: that is the mark.

A claim sets the same mark when records of its partition and of its generation were
refused before it for want of a claim (the ledger still on an older claim, or the
partition not held), at or past its DB offset. faust can let records flow between an
assignment and its claim's seek (its recovery resumed the flow after a seek that a revoke
overtook): those records are refused, aiokafka's position moves past them, and the ones
fetched after them, still queued when the claim lands, would start the first batch past
them. The re-read after the seek reaches back to the highest refused record, so the mark
clears (unless Kafka's retention deleted it meanwhile: :func:`marks_past_retention`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from ackline.sinks.ingest.batch import TP, PartitionRange
from ackline.sinks.ingest.offsets import Claim

NO_GENERATION = -1
"""The generation of a runtime that does not track consumer generations (confluent)."""


class Admit(Enum):
    """Why a record may or may not enter a batch."""

    TAKE = "take"
    STALE = "stale"  # fetched in another consumer generation than the claim, or before a rewind
    UNOWNED = "unowned"  # not claimed by this worker (now)
    COMMITTED = "committed"  # below the DB next offset: PostgreSQL already has it
    REPEAT = "repeat"  # at or below an offset already taken under this claim


RETAKE_FIRST_S = 0.0
"""A fenced partition is taken back at once the first time..."""
RETAKE_MAX_S = 60.0
"""...and after a doubling wait, up to this, when fenced again soon after a retake."""


@dataclass(slots=True)
class _Owned:
    epoch: int
    next_offset: int | None  # None: PostgreSQL has no offset for this partition yet
    taken: int | None = None
    rewound_below: int | None = None  # refuse records above this until one at or below it
    refused: int | None = None  # the highest offset refused while suspended or blocked (fetched)
    suspended: bool = False  # fenced: records refused until taken back (or released)
    blocked: str | None = None  # why its records are refused for now (DB offset past the log end)
    retake_at: float = 0.0  # when a suspended partition may be claimed again
    backoff: float = RETAKE_FIRST_S  # the wait before the next retake, if fenced again

    def consumed(self) -> bool:
        return not self.suspended and self.blocked is None


@dataclass(frozen=True, slots=True)
class Rewind:
    """A partition to re-read: seek it to ``offset`` (None: to the start-from end)."""

    tp: TP
    offset: int | None


class Ledger:
    """Ownership, DB offsets and Kafka commits of one worker (one thread uses it)."""

    def __init__(self) -> None:
        self.generation = NO_GENERATION
        self._owned: dict[TP, _Owned] = {}
        self._kafka: dict[TP, int] = {}
        # Per partition, the newest generation whose records were refused while no claim
        # of this ledger covered them (a generation not claimed yet, or a partition not
        # held), and the highest such offset: the mark of a claim of that partition in that
        # generation (:meth:`claimed`). Only records that carry a generation.
        self._early: dict[TP, tuple[int, int]] = {}

    # ---- ownership -------------------------------------------------------------------

    def claimed(
        self, claims: Iterable[Claim], generation: int = NO_GENERATION, replace: bool = False
    ) -> None:
        """Own the partitions of ``claims`` (made in consumer ``generation``).

        ``replace``: the claims are the whole assignment (faust rebalances eagerly), so
        partitions missing from them are no longer owned. Otherwise they add to (or renew)
        what is owned (cooperative rebalances, a re-claim). A partition whose records were
        refused before the claim at or past its DB offset starts with a rewind mark (the
        module docstring).
        """
        self.generation = generation
        fresh = {(c.topic, c.partition): _Owned(c.epoch, c.next_offset) for c in claims}
        for tp, owned in fresh.items():
            refused_in, early = self._early.pop(tp, (NO_GENERATION, -1))
            if refused_in != generation or generation == NO_GENERATION:
                continue  # records of another generation are refused after the claim anyway
            if owned.next_offset is None or owned.next_offset <= early:
                owned.rewound_below = early
        if replace:
            self._early.clear()
        self._owned = fresh if replace else {**self._owned, **fresh}
        self._kafka = {tp: off for tp, off in self._kafka.items() if tp in self._owned}

    def release(self, tps: Iterable[TP]) -> None:
        """Stop owning ``tps`` (revoked, lost or fenced): their records are dropped."""
        for tp in map(_tp, tps):
            self._owned.pop(tp, None)
            self._kafka.pop(tp, None)

    def owns(self, tp: TP, epoch: int | None = None) -> bool:
        """Whether ``tp`` is owned (under ``epoch``, when given)."""
        owned = self._owned.get(_tp(tp))
        return owned is not None and owned.consumed() and (epoch is None or owned.epoch == epoch)

    def owned(self) -> dict[TP, int]:
        """Partition → epoch, for every partition owned now (not suspended)."""
        return {tp: o.epoch for tp, o in self._owned.items() if o.consumed()}

    def tracked(self) -> list[TP]:
        """Every partition in the ledger: owned, suspended after a fence, or blocked."""
        return list(self._owned)

    def epoch(self, tp: TP) -> int:
        return self._owned[_tp(tp)].epoch

    def resume_offsets(self) -> dict[TP, int | None]:
        """Where each owned partition resumes: the DB next offset (None: no offset yet)."""
        return {tp: o.next_offset for tp, o in self._owned.items() if o.consumed()}

    def block(self, tp: TP, reason: str) -> bool:
        """Refuse ``tp``'s records for now (its DB offset is past the log end: they would
        be taken for committed ones); it counts as not consumed until :meth:`unblock`.
        True when this is news (the caller logs it once)."""
        owned = self._owned[_tp(tp)]
        news = owned.blocked != reason
        owned.blocked = reason
        return news

    def unblock(self, tp: TP) -> Rewind:
        """Consume ``tp`` again from its DB next offset (the caller seeks it there), as a
        :meth:`rewind`: a runtime that kept fetching the blocked partition (faust's, which
        neither seeks nor pauses it) may hold records past that offset fetched before the
        seek, and taking one would let a batch commit past the re-read ones."""
        owned = self._owned[_tp(tp)]
        owned.blocked = None
        return self.rewind(tp, owned.next_offset)

    def blocked(self) -> dict[TP, str]:
        """Owned partitions not consumed for now, and why."""
        return {tp: o.blocked for tp, o in self._owned.items() if o.blocked is not None}

    def db_next(self, tp: TP) -> int | None:
        owned = self._owned.get(_tp(tp))
        return None if owned is None else owned.next_offset

    def expected(self, tp: TP) -> int | None:
        """The offset the next record of ``tp`` should have at least (after the last one
        taken, else the DB next offset); None when unknown. For retention-gap checks: a
        re-read after a rewind counts too (nothing is taken while its mark holds, so its
        first record is measured from the DB offset: retention may have taken the start
        of the range it re-reads)."""
        owned = self._owned.get(_tp(tp))
        if owned is None:
            return None
        if owned.taken is not None:
            return owned.taken + 1
        return owned.next_offset

    # ---- records ---------------------------------------------------------------------

    def admit(self, tp: TP, offset: int, generation: int = NO_GENERATION) -> Admit:
        """Decide whether the record at ``tp``/``offset`` may enter a batch; TAKE marks it
        taken, so a repeated delivery of it (or of anything before it) is refused."""
        if generation != self.generation:
            self._fetched_early(tp, offset, generation)
            return Admit.STALE
        owned = self._owned.get(_tp(tp))
        if owned is None or not owned.consumed():
            if owned is not None:
                # suspended or blocked, fetched all the same: a retake or an unblock must
                # refuse what came before its seek
                owned.refused = offset if owned.refused is None else max(owned.refused, offset)
            elif generation != NO_GENERATION:
                self._fetched_early(tp, offset, generation)
            return Admit.UNOWNED
        if owned.rewound_below is not None:
            if offset > owned.rewound_below:
                return Admit.STALE  # fetched before the seek back took effect
            owned.rewound_below = None
        if owned.next_offset is not None and offset < owned.next_offset:
            return Admit.COMMITTED
        if owned.taken is not None and offset <= owned.taken:
            return Admit.REPEAT
        owned.taken = offset
        return Admit.TAKE

    def _fetched_early(self, tp: TP, offset: int, generation: int) -> None:
        """A record of ``generation`` refused for want of a claim: fetched before the seek
        of that generation's claim of its partition, if one comes, which must refuse what
        follows it until the re-read reaches back (:meth:`claimed`). Within a generation
        a partition's records come in offset order from one position, so the highest
        refused bounds the ones still queued from below; a leftover of an older
        generation says nothing about them (it is refused after the claim anyway)."""
        tp = _tp(tp)
        refused_in, early = self._early.get(tp, (NO_GENERATION, -1))
        if generation == refused_in:
            self._early[tp] = (generation, max(early, offset))
        elif generation > refused_in:
            self._early[tp] = (generation, offset)

    def committed(self, ranges: Iterable[PartitionRange]) -> None:
        """The batch covering ``ranges`` committed in PostgreSQL: advance the DB next
        offsets of the partitions still owned under the batch's epoch (a commit also ends
        the retake back-off of a partition: it is ours again for good)."""
        for r in ranges:
            owned = self._owned.get((r.topic, r.partition))
            if owned is None or owned.suspended or owned.epoch != r.epoch:
                continue
            if owned.next_offset is None or r.next_offset > owned.next_offset:
                owned.next_offset = r.next_offset
            owned.backoff = RETAKE_FIRST_S

    def not_committed(
        self, ranges: Iterable[PartitionRange], rows: Mapping[TP, Claim], now: float
    ) -> tuple[list[TP], list[Rewind]]:
        """The batch covering ``ranges`` did not commit (or may not have): ``rows`` are its
        partitions' offset rows as PostgreSQL has them now. Returns (fenced, rewinds).

        In memory only. A partition still owned under the batch's epoch whose row holds
        another epoch was claimed by someone else: it is suspended (``fenced``) until
        :meth:`retake` or :meth:`release`. Every other one is rewound to the DB next offset
        of its row: the caller drops what it buffered of it and seeks it there
        (``rewinds``). A partition claimed again by this worker since (a new epoch here)
        is left alone: its new claim already reads from the DB offset.
        """
        fenced: list[TP] = []
        rewinds: list[Rewind] = []
        for r in ranges:
            tp = (r.topic, r.partition)
            if not self.owns(tp, r.epoch):
                continue
            row = rows.get(tp)
            if row is None or row.epoch != r.epoch:
                self._suspend(tp, now)
                fenced.append(tp)
            else:
                rewinds.append(self.rewind(tp, row.next_offset))
        return fenced, rewinds

    def _suspend(self, tp: TP, now: float) -> None:
        owned = self._owned[tp]
        owned.suspended = True
        owned.retake_at = now + owned.backoff
        owned.backoff = min(max(owned.backoff * 2, 1.0), RETAKE_MAX_S)
        self._kafka.pop(tp, None)

    def suspend(self, tps: Iterable[TP], now: float, fenced: bool = False) -> list[TP]:
        """Suspend those of ``tps`` consumed now, to be taken back (:meth:`retake`): returns
        them. ``fenced`` (the batch's fence failed on them: someone else claimed them, or their
        offset row went back): after the growing backoff of a fence,
        so two workers that both believe they own a partition cannot spin; otherwise as
        soon as the caller may claim."""
        away = [tp for tp in map(_tp, tps) if tp in self._owned and self._owned[tp].consumed()]
        for tp in away:
            if fenced:
                self._suspend(tp, now)
                continue
            self._owned[tp].suspended = True
            self._owned[tp].retake_at = now
            self._kafka.pop(tp, None)
        return away

    def suspend_all(self, now: float) -> list[TP]:
        """Suspend every partition consumed now (this worker may have been cut off from its
        group); each is taken back (:meth:`retake`) once due and the group is up again."""
        return self.suspend(list(self._owned), now)

    def retakes_due(self, now: float) -> list[TP]:
        """Suspended partitions whose retake wait is over."""
        return [tp for tp, o in self._owned.items() if o.suspended and o.retake_at <= now]

    def retake(self, claim: Claim) -> Rewind | None:
        """Own suspended ``claim``'s partition again under the new claim; the rewind mark
        of what was taken before is kept (records fetched before the seek back are
        refused). The caller seeks it to the returned offset. None when the partition is
        no longer suspended here: the faust runtime claims with an await, during which a
        revoke may release it or a new assignment claim it afresh (its own claim stands)."""
        tp = (claim.topic, claim.partition)
        owned = self._owned.get(tp)
        if owned is None or not owned.suspended:
            return None
        owned.epoch = claim.epoch
        owned.suspended = False
        return self.rewind(tp, claim.next_offset)

    def rewind(self, tp: TP, next_offset: int | None) -> Rewind:
        """Re-read owned ``tp`` from ``next_offset`` (the DB next offset just read).

        Records above the highest offset fetched so far (taken, or refused while the
        partition was suspended or blocked) are refused until the first one at or below it arrives
        (the seek took effect). When ``next_offset`` is past everything fetched (another
        writer moved it), nothing fetched so far can be re-read: records below it are
        refused as committed and no mark is needed. Records refused while suspended count:
        a late claimer may have committed past what this worker took but not past what it
        fetched, and a record fetched before the seek, taken, would make the re-read ones
        below it repeats (lost; a review found it in this ledger, the default runtime's
        librdkafka drops what was fetched before a seek).
        """
        owned = self._owned[_tp(tp)]
        owned.next_offset = next_offset
        fetched = [o for o in (owned.taken, owned.refused) if o is not None]
        owned.taken = owned.refused = None
        high = max(fetched, default=None)
        earlier = owned.rewound_below
        if earlier is not None and next_offset is not None and next_offset > earlier:
            earlier = None  # the re-read starts past an earlier mark: nothing clears it now
        owned.rewound_below = earlier
        if high is not None and (next_offset is None or next_offset <= high):
            owned.rewound_below = high if earlier is None else min(high, earlier)
        return Rewind(_tp(tp), next_offset)

    def marks(self) -> dict[TP, int]:
        """Consumed partitions whose rewind mark still holds: partition → mark."""
        return {
            tp: o.rewound_below
            for tp, o in self._owned.items()
            if o.rewound_below is not None and o.consumed()
        }

    def past_retention(self, tp: TP, log_start: int) -> Rewind | None:
        """The re-read after a rewind, when retention deleted everything up to its mark:
        ``log_start`` is past it, so no record at or below the mark can come again and
        every one above it would be refused as fetched before the seek, for ever (Kafka
        resets a deleted position to the log start). Re-read from ``log_start`` instead,
        with no mark: the first record there may be any offset from ``log_start`` on (a
        transaction marker or an aborted record takes the log start), so no mark could
        name it. Only for a runtime whose seek drops what was fetched before it
        (librdkafka's); the admission of the first record counts the offsets retention
        took (:meth:`expected`). None when the mark still holds (or there is none)."""
        owned = self._owned.get(_tp(tp))
        if owned is None or not owned.consumed() or owned.rewound_below is None:
            return None
        if log_start <= owned.rewound_below:
            return None
        owned.rewound_below = None
        owned.taken = owned.refused = None
        return Rewind(_tp(tp), log_start)

    # ---- Kafka commits (advisory) ----------------------------------------------------

    def commit_targets(self, assignment: Iterable[TP] | None = None) -> dict[TP, int]:
        """Offsets to commit to Kafka: the DB next offset of each owned partition (in
        ``assignment`` when given) that moved since the last Kafka commit. Never more."""
        allowed = None if assignment is None else {_tp(tp) for tp in assignment}
        out: dict[TP, int] = {}
        for tp, owned in self._owned.items():
            if owned.suspended or (allowed is not None and tp not in allowed):
                continue
            if owned.next_offset is not None and owned.next_offset > self._kafka.get(tp, -1):
                out[tp] = owned.next_offset
        return out

    def kafka_committed(self, offsets: Mapping[TP, int]) -> None:
        """Kafka acknowledged the commit of ``offsets``."""
        for tp, offset in offsets.items():
            if _tp(tp) in self._owned:
                self._kafka[_tp(tp)] = offset


def marks_past_retention(marks: Mapping[TP, int], log_starts: Mapping[TP, int]) -> dict[TP, int]:
    """The partitions of ``marks`` (:meth:`Ledger.marks`) whose log start is past their
    rewind mark: partition → log start. Pure.

    Nothing at or below such a mark can be fetched again (the log start only moves up),
    so the mark never clears and every record is refused. The default runtime re-reads
    from the log start (:meth:`Ledger.past_retention`); the faust runtime cannot tell a
    record queued before its seek from one after, so it rejoins the group and its next
    assignment claims the partition afresh."""
    return {tp: log_starts[tp] for tp, mark in marks.items() if log_starts.get(tp, -1) > mark}


def past_log_end(tp: TP, next_offset: int, end: int) -> str:
    """Why a partition whose DB offset is past its log end is not consumed. Pure."""
    return (
        f"{tp[0]}[{tp[1]}]: DB offset {next_offset} is past the log end {end} (the topic was "
        f"recreated or its log truncated); not consumed: its records would be taken for "
        f"committed ones. Move the DB offset (consumer_offsets) once you know which records "
        f"are new"
    )


def log_end_unknown(tp: TP, next_offset: int) -> str:
    """Why a partition whose log end could not be read at its assignment is not consumed
    yet: were its DB offset past the log end, its records would be taken for committed
    ones, so it waits until the end is read (the lag report reads it again). Pure."""
    return (
        f"{tp[0]}[{tp[1]}]: the log end did not answer at the assignment; not consumed "
        f"until it is read and found at or past the DB offset {next_offset}"
    )


def _tp(tp: TP) -> TP:
    """A plain (topic, partition) tuple from faust's or aiokafka's named tuples."""
    return (tp[0], tp[1])
