"""`make bench-backlog`: memory on a 10 M backlog, and the ingest rate as the table grows.

Two parts (``--part rss|curve|both``, default both):

* **rss**: the backlog is the bench's 1 M generated events (:mod:`ackline.load.bench.data`)
  written ten times into one fresh 12-partition topic, each copy with fresh ids
  (``event_id`` from UUID5 of the original and the copy number, ``txn_id`` suffixed
  ``~c<copy>``), so every one of the 10 M is a new event, with realistic bodies.
  Producing is untimed; then a single worker with default settings drains the topic
  while the bench samples its resident memory every 0.2 s (and reads the kernel's peak,
  ``ru_maxrss``, at the end). Writes ``load/bench/backlog.json``; the headline of
  ``make bench`` picks it up.
* **curve** (docs/retention.md, "Cost as the table grows"): the ingest rate of one worker
  draining ``--drain`` realistic events (default 1 M, fresh ids per level, each level its
  own topic, produced untimed beforehand) into a database that already stores 0, 10 M and
  30 M events. The stored events are compact (empty payload, short ids) and written
  straight into the partitioned schema by SQL, 1 M per past day, with time-ordered UUIDv7
  event_ids of their day (what the SDK emits) and random txn_ids (the producer's), so the
  key tables (``event_keys``, ``txn_ledger``) and their indexes hold 30 M keys as they
  would in production. Rate: the committed
  events between 10 % and 90 % of the drain over that time. Also per level: the key
  indexes' sizes and the share of their block reads that missed PostgreSQL's buffers.
  Writes ``load/bench/backlog_curve.json``, one JSON object per line, the last one with
  ``ratio_at_10m`` and ``ratio_at_30m`` (rate at 30 M stored / rate on an empty
  database). Disk: about 20 GB of PostgreSQL at 30 M (``df -h`` first).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg

from ackline.core.signals import terminate_as_exit
from ackline.load.bench.common import (
    PARTITIONS,
    ROOT,
    Cluster,
    bench_stack,
    say,
)
from ackline.load.bench.data import ensure_topic_patiently, prepare
from ackline.load.bench.measure import descendants, rss_kb
from ackline.load.bench.systems import Ackline, Env
from ackline.load.capture.file import CapturedRecord, CaptureReader
from ackline.load.capture.replay import Pace, replay
from ackline.schemas.eventid import unix_ms_of, uuid7

RESULT = Path(__file__).resolve().parent / "backlog.json"
CURVE = Path(__file__).resolve().parent / "backlog_curve.json"
LEVELS = (0, 10_000_000, 30_000_000)
FILL_CHUNK = 1_000_000
FILL_BATCH = 10**12
"""Batch ids of the filled rows start here (far above the sequence's)."""


def copy_value(value: bytes, copy: int) -> bytes:
    """The event with new ids for copy ``copy`` (copy 0 is the original). A UUIDv7
    original's copy is a UUIDv7 ``copy`` days later (new events have new times), with
    bits from UUID5 of the original and the copy number."""
    if copy == 0:
        return value
    event = json.loads(value)
    original = uuid.UUID(event["event_id"])
    fresh = uuid.uuid5(original, f"copy-{copy}")
    ms = unix_ms_of(original)
    if ms is not None:
        fresh = uuid7(ms + copy * 86_400_000, fresh.int)
    event["event_id"] = str(fresh)
    event["txn_id"] = f"{event['txn_id']}~c{copy}"
    return json.dumps(event, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def copies(path: Path, count: int) -> Iterator[CapturedRecord]:
    for copy in range(count):
        with CaptureReader(path) as reader:
            for rec in reader:
                yield replace(rec, value=copy_value(rec.value or b"{}", copy))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ackline.load.bench.backlog",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--part", choices=("rss", "curve", "both"), default="both")
    p.add_argument("--copies", type=int, default=10, help="rss: copies of the 1 M events")
    p.add_argument("--events", type=int, default=1_000_000, help="events per copy")
    p.add_argument("--drain", type=int, default=1_000_000, help="curve: events per level")
    p.add_argument(
        "--levels",
        default=",".join(str(n) for n in LEVELS),
        help="curve: events stored before each drain (comma list, ascending, first 0)",
    )
    args = p.parse_args(argv)
    state_dir = ROOT / ".ackline" / "bench"
    run_id = uuid.uuid4().hex[:8]
    logs = state_dir / "logs" / f"backlog-{run_id}"
    logs.mkdir(parents=True, exist_ok=True)
    # SIGTERM raises through the finally that stops it all; once there it is ignored.
    with terminate_as_exit(), bench_stack(state_dir, run_id, autovacuum=True) as info:
        return _parts(args, state_dir, logs, run_id, info.kafka_bootstrap, info.database_url)


def _parts(
    args: argparse.Namespace, state_dir: Path, logs: Path, run_id: str, bootstrap: str, dsn: str
) -> int:
    """The parts asked for; 0 when their targets are met."""
    ok = True
    if args.part in ("rss", "both"):
        result = _run(args, state_dir, logs, run_id, bootstrap, dsn)
        RESULT.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result), flush=True)
        ok = result["peak_rss_mb"] <= 300
    if args.part in ("curve", "both"):
        lines = _curve(args, state_dir, logs, run_id, bootstrap, dsn)
        CURVE.write_text("".join(json.dumps(line) + "\n" for line in lines))
        for line in lines:
            print(json.dumps(line), flush=True)
        ok = ok and lines[-1].get("ratio_at_30m", 0.0) >= 0.8
    return 0 if ok else 1


def _run(
    args: argparse.Namespace, state_dir: Path, logs: Path, run_id: str, bootstrap: str, dsn: str
) -> dict[str, Any]:
    host, port = dsn.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)
    env = Env(bootstrap, host, int(port), state_dir, logs, run_id)
    data = prepare(bootstrap, args.events, state_dir / "data", say)
    total = args.events * args.copies
    topic = f"bench-backlog-{run_id}"
    ensure_topic_patiently(bootstrap, topic, PARTITIONS)
    say(f"producing the backlog: {total:,} events into {topic} (untimed)")
    sent = replay(
        bootstrap,
        copies(data.capture, args.copies),
        topic,
        Pace("max"),
        source_partitions=range(PARTITIONS),
    )
    say(sent.render())
    worker = Ackline("backlog", env)
    worker.reset()
    cluster = Cluster(state_dir)
    pg0, kafka0 = cluster.cpu()
    started = time.time()
    (proc,) = worker.start(topic)
    samples: list[tuple[float, float, int]] = []
    say(f"draining {total:,} events with one worker; sampling its RSS")
    try:
        while True:
            done = worker.committed(topic, PARTITIONS)
            rss = rss_kb(descendants(proc.proc.pid)) / 1024
            samples.append((time.time() - started, rss, done))
            if done >= total:
                break
            if not proc.alive():
                raise RuntimeError(f"the worker exited:\n{proc.log_text()[-3000:]}")
            if len(samples) % 60 == 0:
                say(f"  {done:,} of {total:,} committed, RSS {rss:,.0f} MB")
            time.sleep(1.0)
    finally:
        measured = proc.stop()
    pg1, kafka1 = cluster.cpu()
    seconds = samples[-1][0]
    return {
        "events": total,
        "seconds": round(seconds, 1),
        "events_per_s": round(total / seconds) if seconds else 0,
        "peak_rss_mb": round(measured.peak_rss_mb, 1),
        "sampled_peak_rss_mb": round(max(s[1] for s in samples), 1),
        "rss_mb_at_25_50_75_100_percent": [
            round(_rss_at(samples, total * q), 1) for q in (0.25, 0.5, 0.75, 1.0)
        ],
        "cpu_worker_s": round(measured.cpu_s, 1),
        "cpu_pg_s": round(pg1 - pg0, 1),
        "cpu_kafka_s": round(kafka1 - kafka0, 1),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cores": os.cpu_count(),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
    }


def _rss_at(samples: list[tuple[float, float, int]], done: float) -> float:
    for _, rss, committed in samples:
        if committed >= done:
            return rss
    return samples[-1][1]


# ---- the curve --------------------------------------------------------------------------

_FILL = """
WITH g AS (
    SELECT i, overlay(uuid_send(gen_random_uuid())
                      placing substring(int8send($5::bigint + ($1::bigint - i) * 86) from 3 for 6)
                      from 1 for 6) AS raw,
           'r' || substr(md5(random()::text), 1, 12) || ':' || (i % 50) AS txn_id
    FROM generate_series($1::bigint, $2::bigint) AS i
), h AS (
    SELECT i, encode(set_byte(raw, 6, (get_byte(raw, 6) & 15) | 112), 'hex')::uuid AS event_id,
           txn_id, sha256(convert_to(txn_id || i, 'UTF8')) AS body_hash FROM g
), keys AS (
    INSERT INTO event_keys (event_id, body_hash, batch_id)
    SELECT event_id, body_hash, $3 + i / 2000 FROM h ORDER BY event_id
), ledger AS (
    INSERT INTO txn_ledger (txn_id, event_id, body_hash, src_topic, src_partition, src_offset,
                            batch_id)
    SELECT txn_id, event_id, body_hash, 'fill', (i % 12)::int, i, $3 + i / 2000 FROM h
    ORDER BY txn_id
)
INSERT INTO activity (event_id, txn_id, type, agent_id, request_id, occurred_at,
                      schema_version, payload, body_hash, src_topic, src_partition,
                      src_offset, batch_id, ingested_at, ingested_on)
SELECT event_id, txn_id, 'agent.step', 'a' || (i % 997), 'q' || (i / 7), $4::timestamptz, 1,
       '{}', body_hash, 'fill', (i % 12)::int, i, $3 + i / 2000, $4::timestamptz,
       ($4::timestamptz AT TIME ZONE 'UTC')::date
FROM h
"""

_KEY_INDEXES = """
SELECT s.indexrelname AS name, pg_relation_size(s.indexrelid) AS bytes,
       s.idx_blks_read AS misses, s.idx_blks_hit AS hits
FROM pg_statio_user_indexes AS s
WHERE s.indexrelname IN ('event_keys_pkey', 'txn_ledger_pkey')
"""


async def _fill(dsn: str, start: int, stop: int) -> float:
    """Store events ``start .. stop-1`` (compact), 1 M per past day; returns seconds."""
    from ackline.sinks.admin.partitions import ensure_partitions

    conn = await asyncpg.connect(dsn)
    began = time.monotonic()
    try:
        today = await conn.fetchval("SELECT date_trunc('day', now())")
        for first in range(start, stop, FILL_CHUNK):
            last = min(first + FILL_CHUNK, stop) - 1
            day = today - timedelta(days=1 + first // FILL_CHUNK)
            noon = day + timedelta(hours=12)
            await ensure_partitions(conn, "day", 0, at=noon)
            end_ms = int((day + timedelta(days=1)).timestamp() * 1000)
            await conn.execute(_FILL, first, last, FILL_BATCH, noon, end_ms)
            say(f"  stored {last + 1:,} events ({time.monotonic() - began:,.0f} s)")
        await conn.execute("VACUUM ANALYZE")
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()
    return time.monotonic() - began


async def _key_indexes(dsn: str) -> dict[str, dict[str, int]]:
    conn = await asyncpg.connect(dsn)
    try:
        return {
            str(r["name"]): {"bytes": int(r["bytes"]), "misses": int(r["misses"]),
                             "hits": int(r["hits"])}
            for r in await conn.fetch(_KEY_INDEXES)
        }  # fmt: skip
    finally:
        await conn.close()


def _curve(
    args: argparse.Namespace, state_dir: Path, logs: Path, run_id: str, bootstrap: str, dsn: str
) -> list[dict[str, Any]]:
    levels = [int(x) for x in args.levels.split(",")]
    if levels[0] != 0 or levels != sorted(levels):
        raise SystemExit("--levels must be ascending and start at 0")
    host, port = dsn.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)
    env = Env(bootstrap, host, int(port), state_dir, logs, run_id)
    data = prepare(bootstrap, args.events, state_dir / "data", say)
    topics = []
    for n, level in enumerate(levels):
        topic = f"bench-curve-{run_id}-{n}"
        ensure_topic_patiently(bootstrap, topic, PARTITIONS)
        say(f"producing {args.drain:,} events for the drain at {level:,} stored (untimed)")
        sent = replay(
            bootstrap,
            _first(copies_from(data.capture, 100 + n), args.drain),
            topic,
            Pace("max"),
            source_partitions=range(PARTITIONS),
        )
        say(sent.render())
        topics.append(topic)
    worker = Ackline("curve", env)
    worker.reset()
    cluster = Cluster(state_dir)
    stored = 0
    lines: list[dict[str, Any]] = []
    for level, topic in zip(levels, topics, strict=True):
        fill_s = 0.0
        if level > stored:
            say(f"storing {level - stored:,} compact events (to {level:,})")
            fill_s = asyncio.run(_fill(worker.dsn, stored, level))
        before = asyncio.run(_key_indexes(worker.dsn))
        worker.group = f"bench-curve-{run_id}-{level}"
        line = _drain_level(worker, cluster, topic, args.drain, level)
        after = asyncio.run(_key_indexes(worker.dsn))
        line["fill_s"] = round(fill_s, 1)
        line["key_indexes"] = {
            name: {
                "mb": round(after[name]["bytes"] / 1e6, 1),
                "block_reads_missing_buffers": round(
                    (after[name]["misses"] - before[name]["misses"])
                    / max(
                        1,
                        after[name]["misses"] + after[name]["hits"]
                        - before[name]["misses"] - before[name]["hits"],
                    ),
                    3,
                ),
            }
            for name in after
        }  # fmt: skip
        say(json.dumps(line))
        lines.append(line)
        stored = level + args.drain
    base = lines[0]["events_per_s"]
    summary: dict[str, Any] = {
        "curve": [(ln["stored_before"], ln["events_per_s"]) for ln in lines],
        "drain": args.drain,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cores": os.cpu_count(),
    }
    pg_base = lines[0]["pg_cpu_us_per_event"]
    for ln in lines[1:]:
        millions = ln["stored_before"] // 1_000_000
        summary[f"ratio_at_{millions}m"] = round(ln["events_per_s"] / base, 3) if base else 0.0
        summary[f"pg_cpu_per_event_ratio_at_{millions}m"] = (
            round(ln["pg_cpu_us_per_event"] / pg_base, 3) if pg_base else 0.0
        )
    return [*lines, summary]


def _drain_level(
    worker: Ackline, cluster: Cluster, topic: str, drain: int, level: int
) -> dict[str, Any]:
    pg0, _ = cluster.cpu()
    base = worker.committed(topic, PARTITIONS)
    started = time.time()
    (proc,) = worker.start(topic)
    samples: list[tuple[float, int]] = []
    peak = 0.0
    say(f"draining {drain:,} events with {level:,} stored")
    try:
        while True:
            done = worker.committed(topic, PARTITIONS) - base
            peak = max(peak, rss_kb(descendants(proc.proc.pid)) / 1024)
            samples.append((time.time(), done))
            if done >= drain:
                break
            if not proc.alive():
                raise RuntimeError(f"the worker exited:\n{proc.log_text()[-3000:]}")
            time.sleep(1.0)
    finally:
        measured = proc.stop()
    pg1, _ = cluster.cpu()
    lo = next(s for s in samples if s[1] >= 0.1 * drain)
    hi = next(s for s in samples if s[1] >= 0.9 * drain)
    rate = (hi[1] - lo[1]) / (hi[0] - lo[0]) if hi[0] > lo[0] else 0.0
    return {
        "stored_before": level,
        "events": drain,
        "events_per_s": round(rate),
        "seconds": round(samples[-1][0] - started, 1),
        "cpu_worker_s": round(measured.cpu_s, 1),
        "cpu_pg_s": round(pg1 - pg0, 1),
        # CPU per event moves less than the rate when other work shares the machine
        "pg_cpu_us_per_event": round(1e6 * (pg1 - pg0) / drain, 1),
        "worker_cpu_us_per_event": round(1e6 * measured.cpu_s / drain, 1),
        "peak_rss_mb": round(max(peak, measured.peak_rss_mb), 1),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
    }


def copies_from(path: Path, copy: int) -> Iterator[CapturedRecord]:
    """The capture's events once, as copy number ``copy`` (fresh ids)."""
    with CaptureReader(path) as reader:
        for rec in reader:
            yield replace(rec, value=copy_value(rec.value or b"{}", copy))


def _first(records: Iterator[CapturedRecord], count: int) -> Iterator[CapturedRecord]:
    for n, rec in enumerate(records):
        if n >= count:
            return
        yield rec


if __name__ == "__main__":
    sys.exit(main())
