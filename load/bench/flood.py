"""The flood phase: ~1,100 records of about 1 MiB, valid and poison mixed, drained by one
worker with default settings while its memory is sampled.

It exercises the byte bound on batches (``ACKLINE_BATCH_MAX_BYTES``, 8 MiB by default): at
the default ``batch_max_events`` of 2,000 a batch of such records would be 2 GB, so only the
byte bound keeps the worker's memory flat. The records, by kind (:data:`MIX`, in this order,
repeated; partitions round-robin):

* ``valid``: a ``tool.result`` event carrying a ~1 MB ``output`` (900,000-1,040,000 bytes,
  under the 1 MiB ``ACKLINE_MAX_MESSAGE_BYTES``), stored as a row;
* ``too_large``: the same shape at 1 MiB + 1 to 1.1 MB, rejected before parsing;
* ``schema_invalid``: a ~1 MB event whose ``ok`` is the string ``"true"`` (the payload models
  are strict), rejected after parsing and validation;
* ``not_utf8``: ~1 MB of random bytes.

Every poison record becomes a ``rejects`` row and a dead letter. The generation is pure and
seeded (:func:`flood_records`); the topic allows 2 MB records.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from confluent_kafka import Consumer, TopicPartition

from ackline.load.bench.common import (
    PARTITIONS,
    BenchError,
    Cluster,
    Phase,
    fill,
    load_avg,
    say,
    settle_disk,
    stop_all,
    wait_for,
)
from ackline.load.bench.data import ensure_topic_patiently
from ackline.load.bench.systems import Ackline, Env, query, run_sql
from ackline.load.capture.file import CapturedRecord
from ackline.load.capture.replay import Pace, replay

FLOOD_RECORDS: Final = 1_100
SEED: Final = 1_048_576
MIX: Final = (
    ("valid", 5),
    ("too_large", 2),
    ("schema_invalid", 2),
    ("not_utf8", 2),
)
"""Kinds per round of 11 records: 500 valid and 600 poison in 1,100."""
MAX_MESSAGE_BYTES: Final = 1_048_576
"""The worker's default ``ACKLINE_MAX_MESSAGE_BYTES``: larger is too_large."""
TOPIC_MAX_BYTES: Final = 2_097_152
"""The flood topic's ``max.message.bytes`` (and the producer's): room for too_large."""
_NAMESPACE: Final = uuid.UUID("6f1d7a52-0c1e-4f59-9d4e-1b2f3c4d5e6f")
_LINE: Final = "2024-05-01T09:00:00Z INFO export chunk ok; "


@dataclass(frozen=True)
class FloodRecord:
    index: int
    kind: str
    partition: int
    value: bytes


def kinds(count: int) -> list[str]:
    """The kind of each of ``count`` records: :data:`MIX` repeated."""
    cycle = [kind for kind, n in MIX for _ in range(n)]
    return [cycle[i % len(cycle)] for i in range(count)]


def _event(index: int, size: int, ok: object) -> bytes:
    """A tool.result event of exactly ``size`` bytes (ASCII JSON)."""
    obj = {
        "event_id": str(uuid.uuid5(_NAMESPACE, f"flood-{index}")),
        "txn_id": f"flood-{index}",
        "type": "tool.result",
        "agent_id": f"agent-{index % 7}",
        "request_id": f"req-flood-{index // 11}",
        "occurred_at": "2024-05-01T09:00:00.000000Z",
        "schema_version": 1,
        "payload": {
            "run_id": f"run-flood-{index // 11}",
            "call_id": f"call_{index:012x}",
            "ok": ok,
            "output": "",
            "duration_ms": 100 + index,
        },
    }
    bare = len(json.dumps(obj, separators=(",", ":")).encode())
    need = max(0, size - bare)
    obj["payload"]["output"] = (_LINE * (need // len(_LINE) + 1))[:need]  # type: ignore[index]
    return json.dumps(obj, separators=(",", ":")).encode()


def flood_value(index: int, kind: str, rng: random.Random) -> bytes:
    """One record's bytes (sizes drawn from ``rng``)."""
    if kind == "valid":
        return _event(index, rng.randint(900_000, 1_040_000), True)
    if kind == "too_large":
        return _event(index, rng.randint(MAX_MESSAGE_BYTES + 1, 1_100_000), True)
    if kind == "schema_invalid":
        return _event(index, rng.randint(900_000, 1_040_000), "true")
    if kind == "not_utf8":
        return b"\xff" + rng.randbytes(rng.randint(900_000, 1_040_000))
    raise ValueError(f"unknown flood kind {kind!r}")


def flood_records(
    count: int = FLOOD_RECORDS, partitions: int = 12, seed: int = SEED
) -> Iterator[FloodRecord]:
    """The flood, one record at a time (never all of it in memory)."""
    rng = random.Random(seed)
    for index, kind in enumerate(kinds(count)):
        yield FloodRecord(index, kind, index % partitions, flood_value(index, kind, rng))


def as_captured(records: Iterator[FloodRecord]) -> Iterator[CapturedRecord]:
    """The records as replay() sends them (to their partition, a fresh CreateTime)."""
    for rec in records:
        yield CapturedRecord(rec.partition, rec.index, 1, 0, None, rec.value)


def topic_records(bootstrap: str, topic: str) -> int:
    """Records in ``topic``: the sum of its partitions' high watermarks (log start 0)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-flood-watermarks"})
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        )
    finally:
        consumer.close()


def expected(count: int = FLOOD_RECORDS) -> dict[str, int]:
    """How many of each kind the flood holds."""
    out: dict[str, int] = {}
    for kind in kinds(count):
        out[kind] = out.get(kind, 0) + 1
    return out


def drain(env: Env, cluster: Cluster, count: int = FLOOD_RECORDS) -> Phase:
    """Produce the flood (untimed) into a fresh topic, then one default worker drains it.

    Done when every record is a row or a reject; the phase reports the worker's peak RSS
    (kernel VmHWM and the sampled RSS of its process tree, every 0.2 s), the rows, rejects
    and dead letters against what the flood holds, and the drain's MB/s.
    """
    topic = f"bench-flood-{env.run_id}"
    ensure_topic_patiently(
        env.bootstrap, topic, PARTITIONS, {"max.message.bytes": str(TOPIC_MAX_BYTES)}
    )
    say(f"flood: producing {count:,} records of ~1 MiB into {topic} (untimed)")
    sent = replay(
        env.bootstrap,
        as_captured(flood_records(count, PARTITIONS)),
        topic,
        Pace("max"),
        source_partitions=range(PARTITIONS),
        conf={"message.max.bytes": TOPIC_MAX_BYTES},
    )
    say(sent.render())
    held = topic_records(env.bootstrap, topic)
    if held != count:  # seen once under heavy load: all acknowledged, one never in the log
        raise BenchError(
            f"flood: the broker holds {held:,} of the {count:,} records the producer had "
            f"acknowledged in {topic}"
        )
    want = expected(count)
    worker = Ackline("flood", env)
    worker.reset()
    settle_disk(env)
    cpu0 = cluster.cpu()
    started = time.time()
    worker.start(topic)
    counts = "SELECT (SELECT count(*) FROM activity) AS rows, (SELECT count(*) FROM rejects) AS rj"

    progress = [0]

    def done() -> bool:
        row = run_sql(lambda: query(worker.dsn, counts))[0]
        progress[0] = int(row["rows"]) + int(row["rj"])
        return progress[0] >= count

    try:
        finished = wait_for(
            done,
            worker,
            timeout=900,
            what=f"{count:,} rows and rejects",
            stall_after=120.0,
            progress=lambda: progress[0],
            stall_records=1,
        )
    finally:
        results = stop_all(worker)
    if not finished:
        raise BenchError(f"flood: stalled at {progress[0]:,} of {count:,} rows and rejects")
    wall = time.time() - started
    row = run_sql(lambda: query(worker.dsn, counts))[0]
    reasons = {
        str(r["reason"]): int(r["n"])
        for r in run_sql(
            lambda: query(worker.dsn, "SELECT reason, count(*) AS n FROM rejects GROUP BY 1")
        )
    }
    phase = Phase(events=count)
    fill(phase, results, cpu0, cluster)
    phase.wall_s = wall
    phase.events_per_s = count / wall if wall > 0 else 0.0
    poison = count - want.get("valid", 0)
    phase.notes.update(
        {
            "megabytes": round(sent.bytes / 1e6, 1),
            "mb_per_s": round(sent.bytes / 1e6 / wall, 1) if wall > 0 else None,
            "rows": int(row["rows"]),
            "rows_expected": want.get("valid", 0),
            "rejects": int(row["rj"]),
            "rejects_expected": poison,
            "reasons": reasons,
            "batch_max_bytes": 8 * 1_048_576,
            "load_avg_1m": load_avg(),
        }
    )
    if int(row["rows"]) != want.get("valid", 0) or int(row["rj"]) != poison:
        raise BenchError(f"flood: rows/rejects {row['rows']}/{row['rj']}, expected {want}")
    say(f"flood: drained in {wall:,.0f} s, worker peak RSS {phase.peak_rss_mb:,.0f} MB")
    return phase


__all__ = [
    "FLOOD_RECORDS",
    "MIX",
    "TOPIC_MAX_BYTES",
    "FloodRecord",
    "as_captured",
    "drain",
    "expected",
    "flood_records",
    "flood_value",
    "kinds",
]
