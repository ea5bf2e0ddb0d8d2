"""The limit: the same rows COPYed straight into ackline's tables, no Kafka, no checks.

``python -m ackline.load.bench.limit DSN CAPTURE`` decodes the capture's events with the same
decoder as the worker (untimed), then, chunk after chunk, binary-COPYs the rows into
``txn_ledger``, ``event_keys`` and ``activity`` of a freshly migrated database (same
columns, same indexes, today's partition) with ``asyncpg.copy_records_to_table``, one
transaction per chunk. Only the COPY and COMMIT are timed and counted as CPU. Prints one
JSON line with the results.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

import asyncpg

from ackline.load.capture.file import CapturedRecord, CaptureReader
from ackline.schemas.decode import Row, decode
from ackline.sinks.ingest.rows import (
    ACTIVITY_COLUMNS,
    EVENT_KEY_COLUMNS,
    LEDGER_COLUMNS,
    activity_record,
    event_key_record,
    ledger_record,
)

CHUNK = 10_000


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rows(
    chunk: list[CapturedRecord], topic: str, batch: int, day: date
) -> tuple[list[Any], list[Any], list[Any]]:
    ledger, keys, activity = [], [], []
    for rec in chunk:
        row = decode(rec.value)
        if not isinstance(row, Row):
            continue
        ledger.append(ledger_record(row, topic, rec.partition, rec.offset, batch))
        keys.append(event_key_record(row, batch))
        activity.append(activity_record(row, topic, rec.partition, rec.offset, batch, day))
    return ledger, keys, activity


async def run(dsn: str, path: Path) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    timed = cpu = decode_s = 0.0
    rows = 0
    try:
        day = await conn.fetchval("SELECT (now() AT TIME ZONE 'UTC')::date")
        with CaptureReader(path) as reader:
            topic = reader.header.topic
            chunk: list[CapturedRecord] = []
            batch = 0
            records = iter(reader)
            while True:
                chunk = [rec for _, rec in zip(range(CHUNK), records, strict=False)]
                if not chunk:
                    break
                batch += 1
                t0 = time.perf_counter()
                ledger, keys, activity = _rows(chunk, topic, batch, day)
                decode_s += time.perf_counter() - t0
                c0, t0 = _cpu(), time.perf_counter()
                async with conn.transaction():
                    await conn.copy_records_to_table(
                        "txn_ledger", columns=LEDGER_COLUMNS, records=ledger
                    )
                    await conn.copy_records_to_table(
                        "event_keys", columns=EVENT_KEY_COLUMNS, records=keys
                    )
                    await conn.copy_records_to_table(
                        "activity", columns=ACTIVITY_COLUMNS, records=activity
                    )
                timed += time.perf_counter() - t0
                cpu += _cpu() - c0
                rows += len(activity)
    finally:
        await conn.close()
    return {
        "rows": rows,
        "copy_seconds": timed,
        "copy_cpu_s": cpu,
        "decode_seconds": decode_s,
        "decode_us_per_event": 1e6 * decode_s / max(rows, 1),
    }


def main() -> None:
    result = asyncio.run(run(sys.argv[1], Path(sys.argv[2])))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
