"""Records → one batch for the writer, in both runtimes. Pure: no I/O, no Kafka client.

A runtime turns each consumed record into a :class:`Record` (raw key, value and
coordinates, untouched by any client serializer); :func:`draft_batch` lets the ownership
:class:`~ackline.streams.ownership.Ledger` pick which records the batch takes and
:func:`assemble` decodes them with ackline's own decoder into a
:class:`~ackline.sinks.ingest.batch.Batch`. Undecodable values become :class:`Poison` for
the dead-letter topic, never an exception.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from ackline.core.tuples import builder
from ackline.schemas.decode import Limits, Rejection, Row, decode
from ackline.schemas.exact import ExactForm
from ackline.sinks.ingest.batch import (
    TP,
    Batch,
    PartitionRange,
    new_coord,
    new_incoming,
    new_repeat,
)
from ackline.streams.deadletter import Headers, Poison
from ackline.streams.headers import headers_size
from ackline.streams.ownership import NO_GENERATION, Admit, Ledger


class Record(NamedTuple):
    """One consumed Kafka record, before any decoding (a named tuple: one is made per
    record on the hot path, at a third of a frozen dataclass's cost).

    ``headers``: the list, or a function that extracts them from the client's message
    (read only for poison; such a record's size cannot count them).
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers | Callable[[], Headers]
    generation: int = NO_GENERATION  # the consumer generation it was fetched in

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)

    def header_list(self) -> Headers:
        return self.headers() if callable(self.headers) else self.headers

    def size(self) -> int:
        """What the record counts against ``batch_max_bytes`` (:func:`record_size`); a
        record whose headers are not read yet counts none."""
        headers = self.headers
        return record_size(self.key, self.value, [] if callable(headers) else headers)


def record_size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    """What a record counts against ``batch_max_bytes``: key, value and headers (a record
    of a few bytes may carry a megabyte of them). The one formula: the default runtime
    sizes each record with it as it takes it, and its slots keep that size. Pure."""
    return len(value or b"") + len(key or b"") + (headers_size(headers) if headers else 0)


new_record: Final = builder(Record)
"""Record((topic, partition, offset, key, value, headers, generation)), once per record
(ackline.core.tuples): every field, the generation too."""


@dataclass(slots=True)
class Draft:
    """A batch ready for the dead-letter write and then the writer.

    ``batch.rejects`` is filled only once the dead-letter topic acknowledged ``poison``.
    ``dropped`` counts the records not taken, by :class:`~.ownership.Admit` reason.
    """

    batch: Batch
    poison: list[Poison] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)

    @property
    def empty(self) -> bool:
        return not self.batch.ranges


def draft_batch(records: Sequence[Record], ledger: Ledger, limits: Limits) -> Draft:
    """Take what the ledger admits, in delivery order, and assemble it (faust: records are
    admitted when a batch is drafted)."""
    taken: list[Record] = []
    dropped: Counter[str] = Counter()
    for rec in records:
        verdict = ledger.admit(rec.tp, rec.offset, rec.generation)
        if verdict is Admit.TAKE:
            taken.append(rec)
        else:
            dropped[verdict.value] += 1
    draft = assemble(taken, [decode(rec.value, limits) for rec in taken], ledger.owned())
    draft.dropped = dropped
    return draft


def assemble(
    records: Sequence[Record],
    decoded: Sequence[Row | Rejection | ExactForm],
    epochs: Mapping[TP, int],
) -> Draft:
    """One batch of admitted ``records`` and their ``decoded`` values, in order (an
    :class:`ExactForm` stands for a record taken for an exact copy of a stored event,
    undecoded: it becomes a :class:`~ackline.sinks.ingest.batch.Repeat`).

    Each partition's range runs from its first to its last record (+1), under the epoch it
    is owned with (``epochs``); offsets are not contiguous under read_committed, so the
    range is never computed from a count.
    """
    spans: dict[TP, list[int]] = {}
    draft = Draft(batch=Batch(ranges=()))
    for rec, result in zip(records, decoded, strict=True):
        tp = (rec.topic, rec.partition)  # Record.tp without a call per record
        span = spans.get(tp)
        if span is None:
            spans[tp] = [rec.offset, rec.offset]
        else:
            span[1] = rec.offset
        coord = new_coord((rec.topic, rec.partition, rec.offset))
        if isinstance(result, Rejection):
            draft.poison.append(
                Poison(coord, result.reason, result.detail, rec.key, rec.value, rec.header_list())
            )
        elif isinstance(result, ExactForm):
            events = draft.batch.events
            draft.batch.repeats.append(
                new_repeat((coord, result.txn_id, result.body_hash, rec.value, len(events)))
            )
        else:
            draft.batch.events.append(new_incoming((coord, result)))
    draft.batch.ranges = tuple(
        PartitionRange(t, p, first, last + 1, epochs[(t, p)])
        for (t, p), (first, last) in sorted(spans.items())
    )
    return draft


def headers_of(raw: object) -> Headers:
    """aiokafka hands headers as a sequence of (key, value) pairs; faust may give a dict."""
    if raw is None:
        return []
    if isinstance(raw, Mapping):
        return [(str(k), v) for k, v in raw.items()]
    if isinstance(raw, Sequence):
        return [(str(k), v) for k, v in raw]
    return []
