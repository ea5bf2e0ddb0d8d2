"""Records taken from a faust stream → one batch for the batch writer.

No I/O and no faust: the agent turns each faust event into a :class:`Record` (its raw
key, value, headers and coordinates, untouched by any faust serializer) and this module
decides, with the :class:`~.ledger.Ledger`, which records the batch takes and decodes
them with ackline's own decoder. Undecodable values become :class:`Poison` for the
dead-letter topic, never an exception and never an automatic ack.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ackline.schemas.decode import Limits, Rejection, decode
from ackline.sinks.ingest.batch import TP, Batch, Coord, Incoming, PartitionRange
from ackline.streams.deadletter import Poison
from ackline.streams.faust_runtime.ledger import Admit, Ledger

Headers = list[tuple[str, str | bytes | None]]


@dataclass(frozen=True, slots=True)
class Record:
    """One consumed Kafka record as faust delivered it, before any decoding."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    generation: int  # the consumer generation it was fetched in


@dataclass(slots=True)
class Draft:
    """A batch ready for the dead-letter write and then the writer.

    ``batch.rejects`` is filled only once the dead-letter topic acknowledged ``poison``.
    ``dropped`` counts the records not taken, by :class:`~.ledger.Admit` reason.
    """

    batch: Batch
    poison: list[Poison] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)

    @property
    def empty(self) -> bool:
        return not self.batch.ranges


def draft_batch(records: Sequence[Record], ledger: Ledger, limits: Limits) -> Draft:
    """Take what the ledger admits, in delivery order, and decode it.

    Each partition's range runs from its first to its last taken offset (+1), under the
    epoch the partition is owned with now; offsets are not contiguous under
    read_committed, so the range is never computed from a count.
    """
    spans: dict[TP, list[int]] = {}
    draft = Draft(batch=Batch(ranges=()))
    for rec in records:
        tp = (rec.topic, rec.partition)
        verdict = ledger.admit(tp, rec.offset, rec.generation)
        if verdict is not Admit.TAKE:
            draft.dropped[verdict.value] += 1
            continue
        span = spans.setdefault(tp, [rec.offset, rec.offset])
        span[1] = rec.offset
        coord = Coord(rec.topic, rec.partition, rec.offset)
        decoded = decode(rec.value, limits)
        if isinstance(decoded, Rejection):
            draft.poison.append(
                Poison(coord, decoded.reason, decoded.detail, rec.key, rec.value, rec.headers)
            )
        else:
            draft.batch.events.append(Incoming(coord, decoded))
    draft.batch.ranges = tuple(
        PartitionRange(t, p, first, last + 1, ledger.epoch((t, p)))
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
