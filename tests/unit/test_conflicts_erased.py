"""`ackline conflicts show N` of a conflict an erasure touched: it printed the erased
incoming body as ``null`` (and, when the stored row was kept, a diff ending ``-> null``);
it now says the body was erased, by which erasure, as ``rejects show`` does."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from ackline.commands.inspect import _conflict_text
from ackline.sinks.admin.inspect import ConflictDetail, ConflictRow

_ROW = ConflictRow(
    conflict_id=5,
    layer="ledger",
    event_id="00000000-0000-4000-8000-000000000001",
    txn_id="run-1:1",
    stored_event_id="00000000-0000-4000-8000-000000000001",
    stored_hash=b"\x01",
    incoming_hash=b"\x02",
    topic="t",
    partition=0,
    offset=1,
    batch_id=2,
    detected_at=datetime(2026, 12, 5, tzinfo=UTC),
    erasure_id=4,
)
_STORED: dict[str, Any] = {
    "event_id": _ROW.stored_event_id,
    "txn_id": "run-1:1",
    "type": "agent.step",
    "agent_id": "kept-agent",
    "request_id": "r",
    "occurred_at": "2026-01-01T00:00:00+00:00",
    "schema_version": 1,
    "payload": {"thought": "plan"},
}


@pytest.mark.parametrize(
    ("stored", "stored_erasure_id", "stored_line"),
    [(None, 4, "(erased by erasure 4)"), (_STORED, None, '"kept-agent"')],
    ids=["both-erased", "stored-kept"],
)
def test_an_erased_incoming_body_says_it_was_erased(
    stored: dict[str, Any] | None, stored_erasure_id: int | None, stored_line: str
) -> None:
    text = _conflict_text(ConflictDetail(_ROW, None, stored, stored_erasure_id))
    assert "null" not in text and "not found" not in text
    assert "incoming body:\n(erased by erasure 4)\nstored row:\n" in text
    assert stored_line in text.split("stored row:\n", 1)[1]
    assert "changed (stored -> incoming):\n  (not known: a body was erased)\n" in text
