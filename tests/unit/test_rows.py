"""The COPY records line up with their column lists, and the columns exist in the schema."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

from ackline.load.generate import generate
from ackline.schemas.decode import Row, decode
from ackline.sinks.ingest.rows import (
    ACTIVITY_COLUMNS,
    EVENT_KEY_COLUMNS,
    LEDGER_COLUMNS,
    UNPARTITIONED_ACTIVITY_COLUMNS,
    activity_record,
    event_key_record,
    ledger_record,
)

SQL = Path(__file__).resolve().parents[2] / "schemas" / "sql"


def _table_columns(table: str, file: str = "0001_init.sql") -> set[str]:
    text = (SQL / file).read_text()
    body = re.search(rf"CREATE TABLE {table} \((.*?)\n\)[^;]*;", text, re.S)
    assert body is not None, table
    lines = [line.strip() for line in body.group(1).strip().splitlines()]
    return {line.split()[0] for line in lines if line and not line.startswith(("--", "CONSTRAINT"))}


def _row() -> Row:
    value = next(s.value for s in generate(5) if s.poison_reason is None)
    row = decode(value)
    assert isinstance(row, Row)
    return row


def test_records_follow_their_columns() -> None:
    row = _row()
    ledger = dict(zip(LEDGER_COLUMNS, ledger_record(row, "t", 3, 42, 7), strict=True))
    day = date(2026, 1, 2)
    activity = dict(zip(ACTIVITY_COLUMNS, activity_record(row, "t", 3, 42, 7, day), strict=True))
    keys = dict(zip(EVENT_KEY_COLUMNS, event_key_record(row, 7), strict=True))
    assert keys == {"event_id": row.event_id, "body_hash": row.body_hash, "batch_id": 7}
    assert activity["ingested_on"] == day
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
    assert set(UNPARTITIONED_ACTIVITY_COLUMNS) <= _table_columns("activity")
    partitioned = _table_columns("activity", "0008_activity_partitioned.sql")
    assert set(ACTIVITY_COLUMNS) == partitioned - {"ingested_at"}  # ingested_at: now()
    assert set(EVENT_KEY_COLUMNS) == _table_columns(
        "event_keys_backfill", "0007_event_keys_backfill.sql"
    )
