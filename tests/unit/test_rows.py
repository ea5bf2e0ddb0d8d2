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
    copy_records,
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
    day = date(2026, 1, 2)
    (ledger_rec,), (key_rec,), (activity_rec,) = copy_records([(("t", 3, 42), row)], 7, day)
    ledger = dict(zip(LEDGER_COLUMNS, ledger_rec, strict=True))
    activity = dict(zip(ACTIVITY_COLUMNS, activity_rec, strict=True))
    keys = dict(zip(EVENT_KEY_COLUMNS, key_rec, strict=True))
    assert keys == {"event_id": row.event_id, "body_hash": row.body_hash, "batch_id": 7}
    assert activity["ingested_on"] == day
    for rec in (ledger, activity):
        assert (rec["src_topic"], rec["src_partition"], rec["src_offset"]) == ("t", 3, 42)
        assert rec["batch_id"] == 7
    # every column named as a Row field holds that field (the rows are unpacked by position)
    fields = row._asdict()
    for rec in (ledger, activity, keys):
        for column, value in rec.items():
            if column in fields:
                assert value == fields[column], column
    assert activity["payload"] == row.payload_json
    named = {c for c in ACTIVITY_COLUMNS if c in fields}
    assert named == set(fields) - {"payload_json", "body_json"}


def test_records_keep_the_order_of_their_events() -> None:
    rows = [
        r for s in generate(20) if s.poison_reason is None and isinstance(r := decode(s.value), Row)
    ]
    placed = [(("t", i % 3, i), row) for i, row in enumerate(rows)]
    ledger, keys, activity = copy_records(placed, 1, date(2026, 1, 2))
    assert [k[0] for k in keys] == [a[0] for a in activity] == [r.event_id for r in rows]
    assert [rec[5] for rec in ledger] == list(range(len(rows)))


def test_columns_exist_in_the_schema() -> None:
    assert set(LEDGER_COLUMNS) <= _table_columns("txn_ledger")
    assert set(UNPARTITIONED_ACTIVITY_COLUMNS) <= _table_columns("activity")
    partitioned = _table_columns("activity", "0008_activity_partitioned.sql")
    assert set(ACTIVITY_COLUMNS) == partitioned - {"ingested_at"}  # ingested_at: now()
    assert set(EVENT_KEY_COLUMNS) == _table_columns(
        "event_keys_backfill", "0007_event_keys_backfill.sql"
    )
