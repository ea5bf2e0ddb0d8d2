"""Pure two-layer dedup: decide, for each incoming event, insert, duplicate or conflict.

Rules (docs/design.md, "Two dedup layers"), applied in source order so the first event wins:

1. Layer 1, the ledger, keyed by ``txn_id``: when the key is known (stored in the
   database, or taken by an earlier event of the same batch), an equal body hash is a
   duplicate and a different one a conflict.
2. Layer 2, the primary key, keyed by ``event_id``: the same, for events whose
   ``txn_id`` is new.
3. Otherwise the event is new: it is inserted, and its keys are taken for the rest of
   the batch (so two copies inside one batch give one insert and one duplicate).

The stored side is never overwritten; a conflict carries the stored hash and the stored
event id so it can be quarantined with both hashes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from ackline.sinks.ingest.batch import Incoming

Layer = Literal["ledger", "primary_key"]


@dataclass(frozen=True, slots=True)
class Conflict:
    incoming: Incoming
    layer: Layer
    stored_hash: bytes
    stored_event_id: uuid.UUID


@dataclass(slots=True)
class Classified:
    inserts: list[Incoming] = field(default_factory=list)
    duplicates: dict[Layer, int] = field(default_factory=lambda: {"ledger": 0, "primary_key": 0})
    conflicts: list[Conflict] = field(default_factory=list)

    def conflicts_on(self, layer: Layer) -> int:
        return sum(1 for c in self.conflicts if c.layer == layer)


def classify(
    events: Iterable[Incoming],
    stored_ledger: Mapping[str, tuple[bytes, uuid.UUID]],
    stored_activity: Mapping[uuid.UUID, bytes],
) -> Classified:
    """Classify ``events`` (in source order) against the stored keys.

    ``stored_ledger`` maps txn_id to (body_hash, event_id) of the ledger rows that
    exist; ``stored_activity`` maps event_id to body_hash of the activity rows that exist.
    """
    ledger: dict[str, tuple[bytes, uuid.UUID]] = dict(stored_ledger)
    activity: dict[uuid.UUID, bytes] = dict(stored_activity)
    out = Classified()
    for item in events:
        row = item.row
        by_txn = ledger.get(row.txn_id)
        if by_txn is not None:
            _judge(out, item, "ledger", by_txn[0], by_txn[1])
            continue
        by_id = activity.get(row.event_id)
        if by_id is not None:
            _judge(out, item, "primary_key", by_id, row.event_id)
            continue
        ledger[row.txn_id] = (row.body_hash, row.event_id)
        activity[row.event_id] = row.body_hash
        out.inserts.append(item)
    return out


def _judge(
    out: Classified, item: Incoming, layer: Layer, stored_hash: bytes, stored_id: uuid.UUID
) -> None:
    if stored_hash == item.row.body_hash:
        out.duplicates[layer] += 1
    else:
        out.conflicts.append(Conflict(item, layer, stored_hash, stored_id))
