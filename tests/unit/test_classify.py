"""The two-layer dedup decision, without services."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime

from ackline.schemas.decode import Row
from ackline.sinks.ingest.batch import Coord, Incoming
from ackline.sinks.ingest.classify import classify


def item(txn: str, body: str, eid: uuid.UUID | None = None, offset: int = 0) -> Incoming:
    row = Row(
        event_id=eid or uuid.uuid4(),
        txn_id=txn,
        type="agent.step",
        agent_id="a",
        request_id="r",
        occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
        schema_version=1,
        payload_json="{}",
        body_json=body,
        body_hash=hashlib.sha256(body.encode()).digest(),
    )
    return Incoming(Coord("t", 0, offset), row)


def test_new_events_are_inserted() -> None:
    a, b = item("t1", "A"), item("t2", "B")
    out = classify([a, b], {}, {})
    assert out.inserts == [a, b]
    assert out.duplicates == {"ledger": 0, "primary_key": 0}
    assert out.conflicts == []


def test_duplicate_inside_one_batch_first_wins() -> None:
    a = item("t1", "A")
    again = Incoming(Coord("t", 0, 1), a.row)
    out = classify([a, again], {}, {})
    assert out.inserts == [a]
    assert out.duplicates["ledger"] == 1


def test_producer_retry_is_a_ledger_duplicate() -> None:
    a = item("t1", "A")
    retry = item("t1", "A", offset=1)  # new event_id, same txn and body
    out = classify([a, retry], {}, {})
    assert out.inserts == [a]
    assert out.duplicates["ledger"] == 1


def test_changed_body_under_a_stored_txn_is_a_ledger_conflict() -> None:
    stored = item("t1", "A")
    changed = item("t1", "A2")
    out = classify([changed], {"t1": (stored.row.body_hash, stored.row.event_id)}, {})
    assert out.inserts == []
    [c] = out.conflicts
    assert (c.layer, c.stored_hash, c.stored_event_id) == (
        "ledger",
        stored.row.body_hash,
        stored.row.event_id,
    )


def test_same_event_id_new_txn_is_a_primary_key_conflict() -> None:
    stored = item("t1", "A")
    clash = item("t9", "Z", eid=stored.row.event_id)
    out = classify([clash], {}, {stored.row.event_id: stored.row.body_hash})
    [c] = out.conflicts
    assert c.layer == "primary_key"
    assert out.inserts == []


def test_primary_key_duplicate_when_only_activity_knows_it() -> None:
    stored = item("t1", "A")
    out = classify([stored], {}, {stored.row.event_id: stored.row.body_hash})
    assert out.duplicates["primary_key"] == 1


def test_in_batch_conflict_compares_with_the_batch_winner() -> None:
    a = item("t1", "A")
    b = item("t1", "B", offset=1)
    out = classify([a, b], {}, {})
    assert out.inserts == [a]
    [c] = out.conflicts
    assert c.stored_hash == a.row.body_hash
