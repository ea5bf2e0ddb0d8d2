"""Hostile input through the real pipeline: 10,000+ generated records, one worker, the
real broker and database. Every record must end as exactly one of: a row, a counted
duplicate, a quarantined conflict, or a reject with a reason - and the worker must stay
up and stop cleanly.

Records are drawn with hypothesis (tests/integration/hostile.py): random bytes, deep
nesting, huge strings, NaN/Infinity and overflowing numbers, duplicate keys, wrong types,
unicode edge cases (lone surrogates escaped and raw, NUL escapes, overlong UTF-8, BOM),
oversize values, absent and garbled headers (non-UTF-8 values, huge keys, NUL), and a
share of valid events with redeliveries, producer retries and conflicts. Each record's
expected fate is known twice: by the generator's intent (independent), and exactly, by
the pure decoder and classifier applied in partition order. The database must agree with
both, coordinate by coordinate. FUZZ_SEED=<int> replays a run (the seed is in failures).
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from ackline.schemas import Limits
from ackline.streams.producer import ActivityProducer
from tests.integration.harness import Services, Worker, db, wait_until
from tests.integration.hostile import SPEC, Builder, Record, predict

TARGET = 10_000
CHUNK = 50
LIMITS = Limits(max_bytes=4096, max_depth=16)


def generate(fuzz_seed: int) -> list[Record]:
    """At least TARGET records from hypothesis-drawn specs, built in draw order."""
    specs: list[tuple[str, object]] = []

    @seed(fuzz_seed)
    @settings(
        max_examples=TARGET // CHUNK + 10,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(SPEC, min_size=CHUNK, max_size=CHUNK))
    def draw(chunk: list[tuple[str, object]]) -> None:
        specs.extend(chunk)

    while len(specs) < TARGET:
        draw()
    builder = Builder(LIMITS)
    return [builder.build(spec) for spec in specs]


def produce_all(services: Services, topic: str, records: list[Record]) -> list[tuple[int, int]]:
    """Send every record in transactions of 1,000; return each one's (partition, offset)."""
    placed: list[tuple[int, int] | None] = [None] * len(records)
    errors: list[KafkaError] = []

    def hook(i: int) -> Callable[[KafkaError | None, Message], None]:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(err)
            else:
                placed[i] = (msg.partition() or 0, msg.offset() or 0)

        return on_delivery

    producer = ActivityProducer(services.bootstrap, topic, transactional_id=f"fuzz-{topic}")
    producer.start()
    try:
        for start in range(0, len(records), 1_000):
            with producer.transaction():
                for i in range(start, min(start + 1_000, len(records))):
                    r = records[i]
                    producer.send_bytes(r.key, r.value, r.headers, hook(i))
    finally:
        producer.close()
    assert not errors, errors[:3]
    assert all(p is not None for p in placed)
    return [p for p in placed if p is not None]


def _outcomes(dsn: str) -> dict[tuple[int, int], str]:
    """Each stored coordinate's fate, as the database records it (a coordinate may
    appear in more than one table only if something is wrong: then it is listed twice)."""
    found: list[tuple[tuple[int, int], str]] = []
    for r in db(dsn, "SELECT src_partition AS p, src_offset AS o FROM activity"):
        found.append(((r["p"], r["o"]), "insert"))
    for r in db(dsn, "SELECT src_partition AS p, src_offset AS o, layer FROM conflicts"):
        found.append(((r["p"], r["o"]), f"conflict:{r['layer']}"))
    for r in db(dsn, "SELECT src_partition AS p, src_offset AS o, reason FROM rejects"):
        found.append(((r["p"], r["o"]), f"reject:{r['reason']}"))
    counts = Counter(coord for coord, _ in found)
    twice = [c for c, n in counts.items() if n > 1]
    assert not twice, f"coordinates in more than one table: {twice[:5]}"
    return dict(found)


def _dlq_records(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"fz-{topic}"})
    try:
        meta = consumer.list_topics(topic, timeout=10)
        total = 0
        for p in meta.topics[topic].partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += high - low
        return total
    finally:
        consumer.close()


def test_hostile_records_each_end_exactly_once(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    fuzz_seed = int(os.environ.get("FUZZ_SEED") or random.randrange(2**32))
    why = f"(FUZZ_SEED={fuzz_seed})"
    started = time.monotonic()
    records = generate(fuzz_seed)
    generated = time.monotonic()
    kinds = Counter(r.kind for r in records)
    assert len(records) >= TARGET
    for kind in ("valid", "redeliver", "retry", "conflict_ledger", "conflict_pk", "random_bytes"):
        assert kinds[kind] >= 100, (kind, kinds, why)
    assert len(kinds) == 17, kinds

    coords = produce_all(services, topic, records)
    expected = predict([(p, o, r.value) for (p, o), r in zip(coords, records, strict=True)], LIMITS)
    last: dict[int, int] = {}
    for p, o in coords:
        last[p] = max(last.get(p, -1), o)

    worker = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="fuzz",
        max_message_bytes=LIMITS.max_bytes,
        max_json_depth=LIMITS.max_depth,
        batch_max_events=1_000,
    )
    group = f"g-{topic}"

    def caught_up() -> bool:
        worker.ensure_alive()  # no crash, ever
        rows = db(
            dsn, "SELECT partition, next_offset FROM consumer_offsets WHERE group_id = $1", group
        )
        done = {r["partition"]: r["next_offset"] or 0 for r in rows}
        return all(done.get(p, 0) > o for p, o in last.items())  # no stuck partition

    wait_until(caught_up, 120, f"every partition past its last offset {why}")
    ingested = time.monotonic()
    assert worker.stop() == 0, worker.log()[-3000:]

    actual = _outcomes(dsn)
    batches = db(
        dsn,
        "SELECT sum(events) AS events, sum(inserted) AS inserted, "
        "sum(duplicates_ledger) AS dl, sum(duplicates_pk) AS dp, "
        "sum(conflicts_ledger) AS cl, sum(conflicts_pk) AS cp, sum(rejects) AS rj "
        "FROM ingest_batches",
    )[0]
    fates = Counter(actual.values())
    duplicates = [c for c in coords if c not in actual]

    # Exact accounting: every committed record is counted once, in one place.
    assert batches["events"] == len(records), why
    assert batches["inserted"] == fates["insert"], why
    assert (
        batches["cl"] == fates["conflict:ledger"] and batches["cp"] == fates["conflict:primary_key"]
    )
    assert batches["rj"] == sum(n for f, n in fates.items() if f.startswith("reject:")), why
    assert batches["dl"] + batches["dp"] == len(duplicates), why
    assert set(actual) <= set(coords), why
    ledger = {
        (r["p"], r["o"])
        for r in db(dsn, "SELECT src_partition AS p, src_offset AS o FROM txn_ledger")
    }
    assert ledger == {c for c, f in actual.items() if f == "insert"}, why

    # Coordinate by coordinate: the pure model's fate, and the generator's intent.
    wrong: list[tuple[object, ...]] = []
    for coord, record in zip(coords, records, strict=True):
        fate = actual.get(coord, "duplicate")
        if fate != expected[coord]:
            wrong.append((coord, record.kind, "model", expected[coord], fate))
        if ("duplicate:ledger" if fate == "duplicate" else fate) not in record.intent:
            wrong.append((coord, record.kind, "intent", sorted(record.intent)[:3], fate))
    assert not wrong, f"{len(wrong)} records ended elsewhere {why}: {wrong[:10]}"

    # Every reject went to the dead-letter topic once (no crash: no repeats), with a place.
    rejects = db(dsn, "SELECT dlq_partition, dlq_offset FROM rejects")
    assert len({(r["dlq_partition"], r["dlq_offset"]) for r in rejects}) == len(rejects)
    assert _dlq_records(services.bootstrap, f"{topic}.dlq") == len(rejects), why
    # A real mix reached the database.
    for fate in ("insert", "conflict:ledger", "conflict:primary_key", "reject:too_large"):
        assert fates[fate] > 0, (fate, fates)
    assert len(duplicates) > 0 and len({f for f in fates if f.startswith("reject:")}) == 10, fates
    print(
        f"fuzz {why}: {len(records)} records, generated in {generated - started:.1f}s, "
        f"ingested in {ingested - generated:.1f}s; fates {dict(fates)}, duplicates "
        f"{len(duplicates)}"
    )
