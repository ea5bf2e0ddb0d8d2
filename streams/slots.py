"""Writer slots: one writer connection each, and the buffered records of its partitions.

A worker writes over ``writer_connections`` connections at once, each batch in one
transaction (sinks/ingest/writer.py). Two batches of one partition must never be in flight
together: the fence of the later one would either wait on the earlier one's row lock or
commit first and fence the earlier one out. So every partition belongs to one slot
(:class:`SlotMap`: from its first record until the worker gives it up, when nothing of it
is buffered or in flight) and a slot writes one batch at a time: a partition's batches
commit in offset order, and batches of different slots never touch the same offset row.
A partition goes to the slot with the fewest partitions, not to ``partition % slots``:
Kafka's assignors deal partitions out in turn, so with an even number of workers each
worker's partitions would all have one parity and one connection would do all the
writing. While one slot's COPY runs, the other's batch can begin, fence
and classify: PostgreSQL is no longer idle between two batches.

Each slot keeps its own buffer, and a batch takes at most ``batch_max_events`` records and
``batch_max_bytes`` bytes from its front (:meth:`Slot.take`). The worker stops fetching
only when its slots together hold :data:`BUFFERED_BATCHES` batches' worth each: the
records librdkafka hands over next may be any partition's, so a bound per slot stopped
the fetching for every slot as soon as one slot's buffer was full, and the other slot's
write then often ended with nothing to write next (one batch in five waited 20-40 ms
for records; docs/performance.md). A worker so holds at most ``writer_connections``
batches in flight and twice as many buffered.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from ackline.schemas.decode import Rejection, Row
from ackline.schemas.exact import ExactForm
from ackline.sinks.ingest.batch import TP, Batch
from ackline.sinks.ingest.writer import BatchWriter
from ackline.streams.assemble import Record
from ackline.streams.inflight import InFlight

Looked = Row | Rejection | ExactForm
"""What the consumer thread made of a buffered record: decoded, or, on a repeating slot, its
exact form (ackline.schemas.exact), which the writer confirms against the ledger."""

BUFFERED_BATCHES: Final = 2
"""Batches' worth of records the worker buffers per slot (counted over all its slots)."""


class SlotMap:
    """Which slot writes each partition the worker holds (pure, no I/O)."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"a worker needs at least one writer slot, not {slots}")
        self._of: dict[TP, int] = {}
        self._load = [0] * slots

    def of(self, tp: TP) -> int:
        """``tp``'s slot; a partition not seen yet goes to the least loaded slot (the
        lowest on a tie) and stays there until :meth:`release`."""
        slot = self._of.get(tp)
        if slot is None:
            slot = min(range(len(self._load)), key=self._load.__getitem__)
            self._of[tp] = slot
            self._load[slot] += 1
        return slot

    def release(self, tps: Iterable[TP]) -> None:
        """Forget ``tps``. Only once nothing of them is buffered or in flight: taken again,
        a partition may go to another slot."""
        for tp in tps:
            slot = self._of.pop(tp, None)
            if slot is not None:
                self._load[slot] -= 1


@dataclass(eq=False)
class Slot:
    """One writer and what waits for it; owned by the consumer thread."""

    writer: BatchWriter
    buffer: list[Record] = field(default_factory=list)
    # each buffered record's size as counted when it came (Record.size(), headers and
    # all): the take measures its prefix from these, not by sizing every record again
    sizes: list[int] = field(default_factory=list)
    decoded: list[Looked] = field(default_factory=list)  # of a prefix of buffer
    # Whether its last batch was mostly layer-1 duplicates (a replay): then its records are
    # first looked at as exact copies (ackline.schemas.exact), and those the writer cannot
    # confirm against the ledger are decoded there.
    repeating: bool = False
    buffer_bytes: int = 0
    buffer_since: float = 0.0
    inflight: InFlight | None = None
    batch: Batch | None = None  # the batch in flight
    started: float = 0.0  # when it was handed to the writer

    def full(self, max_events: int, max_bytes: int) -> bool:
        return len(self.buffer) >= max_events or self.buffer_bytes >= max_bytes

    def add(self, record: Record, size: int) -> None:
        if not self.buffer:
            self.buffer_since = time.monotonic()
        self.buffer.append(record)
        self.sizes.append(size)
        self.buffer_bytes += size

    def take(self, max_events: int, max_bytes: int) -> tuple[list[Record], list[Looked]]:
        """The next batch: the longest prefix of the buffer within ``max_events`` records
        and ``max_bytes`` bytes (at least one record, however large), with the decode
        results of a prefix of it. The rest stays, in order, with its own decoded prefix."""
        if len(self.buffer) <= max_events and self.buffer_bytes <= max_bytes:
            records, self.buffer = self.buffer, []
            decoded, self.decoded = self.decoded, []
            self.sizes, self.buffer_bytes = [], 0
            return records, decoded
        n = size = 0
        for rec_size in self.sizes:
            if n and (n >= max_events or size + rec_size > max_bytes):
                break
            n += 1
            size += rec_size
        records, self.buffer = self.buffer[:n], self.buffer[n:]
        del self.sizes[:n]
        decoded, self.decoded = self.decoded[:n], self.decoded[n:]
        self.buffer_bytes -= size
        self.buffer_since = time.monotonic()  # the rest waits from now (a linger counts)
        return records, decoded

    def pull(self, tps: set[TP]) -> list[Record]:
        """Take out the buffered records of ``tps``, in order (a hold parks them)."""
        pulled = [r for r in self.buffer if r.tp in tps]
        if pulled:
            self.drop(tps)
        return pulled

    def put_back(self, records: list[Record]) -> None:
        """Released records go first, in order; positions moved, so decode again."""
        if not records:
            return
        if not self.buffer:
            self.buffer_since = time.monotonic()
        self.buffer = records + self.buffer
        sizes = [r.size() for r in records]
        self.sizes = sizes + self.sizes
        self.buffer_bytes += sum(sizes)
        self.decoded = []

    def drop(self, gone: set[TP]) -> None:
        """Drop the buffered and decoded records of ``gone``."""
        keep = [i for i, r in enumerate(self.buffer) if r.tp not in gone]
        if len(keep) == len(self.buffer):
            return
        decoded = len(self.decoded)
        self.decoded = [self.decoded[i] for i in keep if i < decoded]
        self.buffer = [self.buffer[i] for i in keep]
        self.sizes = [self.sizes[i] for i in keep]
        self.buffer_bytes = sum(self.sizes)

    def clear(self) -> None:
        self.buffer, self.decoded, self.sizes, self.buffer_bytes = [], [], [], 0
