"""The limit: the same rows COPYed straight into ackline's tables, no Kafka, no checks.

``python -m ackline.load.bench.limit DSN CAPTURE [--connections N]`` decodes the capture's
events with the same decoder as the worker (untimed), then, N chunks at a time, binary-COPYs
the rows into ``txn_ledger``, ``event_keys`` and ``activity`` of a freshly migrated database
(same columns, same indexes, today's partition) with ``asyncpg.copy_records_to_table``:
each chunk one transaction on its own connection, the N transactions at once. Only the
COPYs and COMMITs are timed (wall time of each round of N) and counted as CPU. Prints one
JSON line with the results.

The limit the bench reports is the best rate of 1 or N parallel connections, N being the
connections the bench's ackline worker writes over (:func:`writer_connections`): a worker
that wrote over two connections would otherwise be compared with a ceiling it could pass.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any, Final

import asyncpg

from ackline.core.errors import SettingsError
from ackline.load.capture.file import CapturedRecord, CaptureReader
from ackline.schemas.decode import Row, decode
from ackline.sinks.ingest.rows import (
    ACTIVITY_COLUMNS,
    EVENT_KEY_COLUMNS,
    LEDGER_COLUMNS,
    Placed,
    copy_records,
)

CHUNK: Final = 10_000
DEFAULT_WRITER_CONNECTIONS: Final = 2
"""``ACKLINE_WRITER_CONNECTIONS``'s default (the load floor may not import the settings;
tests/unit/test_bench_logic.py keeps the two equal)."""


def writer_connections() -> int:
    """The PostgreSQL connections the bench's ackline workers write rows over:
    ``ACKLINE_WRITER_CONNECTIONS`` when set (the bench passes it on to them), else the
    setting's default."""
    raw = os.environ.get("ACKLINE_WRITER_CONNECTIONS", "")
    if not raw:
        return DEFAULT_WRITER_CONNECTIONS
    try:
        return int(raw)
    except ValueError:
        raise SettingsError("ACKLINE_WRITER_CONNECTIONS", f"{raw!r} is not a count") from None


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rounds(records: Iterator[CapturedRecord], chunk: int, width: int) -> Iterator[list[list[Any]]]:
    """Consecutive chunks of ``chunk`` records, ``width`` chunks per round (the last ones
    shorter). Pure: the COPY rounds of ``width`` parallel connections."""
    if chunk < 1 or width < 1:
        raise ValueError(f"chunk and width must be at least 1, not {chunk} and {width}")
    while True:
        group: list[list[Any]] = []
        for _ in range(width):
            part = [rec for _, rec in zip(range(chunk), records, strict=False)]
            if not part:
                break
            group.append(part)
        if not group:
            return
        yield group


def _rows(
    chunk: list[CapturedRecord], topic: str, batch: int, day: date
) -> tuple[list[Any], list[Any], list[Any]]:
    placed: list[Placed] = []
    for rec in chunk:
        row = decode(rec.value)
        if isinstance(row, Row):
            placed.append(((topic, rec.partition, rec.offset), row))
    return copy_records(placed, batch, day)


async def _copy(
    conn: asyncpg.Connection, ledger: list[Any], keys: list[Any], activity: list[Any]
) -> None:
    async with conn.transaction():
        await conn.copy_records_to_table("txn_ledger", columns=LEDGER_COLUMNS, records=ledger)
        await conn.copy_records_to_table("event_keys", columns=EVENT_KEY_COLUMNS, records=keys)
        await conn.copy_records_to_table("activity", columns=ACTIVITY_COLUMNS, records=activity)


async def run(dsn: str, path: Path, connections: int = 1) -> dict[str, Any]:
    conns = [await asyncpg.connect(dsn) for _ in range(connections)]
    timed = cpu = decode_s = 0.0
    rows = batch = 0
    try:
        day = await conns[0].fetchval("SELECT (now() AT TIME ZONE 'UTC')::date")
        with CaptureReader(path) as reader:
            topic = reader.header.topic
            for group in rounds(iter(reader), CHUNK, connections):
                t0 = time.perf_counter()
                decoded = []
                for chunk in group:
                    batch += 1
                    decoded.append(_rows(chunk, topic, batch, day))
                decode_s += time.perf_counter() - t0
                c0, t0 = _cpu(), time.perf_counter()
                await asyncio.gather(
                    *(
                        _copy(conn, led, keys, act)
                        for conn, (led, keys, act) in zip(conns, decoded, strict=False)
                    )
                )
                timed += time.perf_counter() - t0
                cpu += _cpu() - c0
                rows += sum(len(act) for _, _, act in decoded)
    finally:
        for conn in conns:
            await conn.close()
    return {
        "rows": rows,
        "connections": connections,
        "copy_seconds": timed,
        "copy_cpu_s": cpu,
        "decode_seconds": decode_s,
        "decode_us_per_event": 1e6 * decode_s / max(rows, 1),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ackline.load.bench.limit", description=__doc__)
    p.add_argument("dsn")
    p.add_argument("capture", type=Path)
    p.add_argument("--connections", type=int, default=1, help="parallel COPY connections")
    args = p.parse_args(argv)
    if args.connections < 1:
        p.error("--connections must be at least 1")
    result = asyncio.run(run(args.dsn, args.capture, args.connections))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
