"""The COPY records line up with their column lists, and the columns exist in the schema."""

from __future__ import annotations

import re
from pathlib import Path

from ackline.load.generate import generate
from ackline.schemas.decode import Row, decode
from ackline.sinks.ingest.rows import (
    ACTIVITY_COLUMNS,
    LEDGER_COLUMNS,
    activity_record,
    ledger_record,
)

INIT = Path(__file__).resolve().parents[2] / "schemas" / "sql" / "0001_init.sql"


def _table_columns(table: str) -> set[str]:
    body = re.search(rf"CREATE TABLE {table} \((.*?)\n\);", INIT.read_text(), re.S)
    assert body is not None, table
    return {line.split()[0] for line in body.group(1).strip().splitlines() if line.strip()}


def _row() -> Row:
    value = next(s.value for s in generate(5) if s.poison_reason is None)
    row = decode(value)
    assert isinstance(row, Row)
    return row


def test_records_follow_their_columns() -> None:
    row = _row()
    ledger = dict(zip(LEDGER_COLUMNS, ledger_record(row, "t", 3, 42, 7), strict=True))
    activity = dict(zip(ACTIVITY_COLUMNS, activity_record(row, "t", 3, 42, 7), strict=True))
    for rec in (ledger, activity):
        assert (rec["txn_id"], rec["event_id"], rec["body_hash"]) == (
            row.txn_id,
            row.event_id,
            row.body_hash,
        )
        assert (rec["src_topic"], rec["src_partition"], rec["src_offset"]) == ("t", 3, 42)
        assert rec["batch_id"] == 7
    assert activity["payload"] == row.payload_json
    assert activity["occurred_at"] == row.occurred_at


def test_columns_exist_in_the_schema() -> None:
    assert set(LEDGER_COLUMNS) <= _table_columns("txn_ledger")
    assert set(ACTIVITY_COLUMNS) <= _table_columns("activity")
