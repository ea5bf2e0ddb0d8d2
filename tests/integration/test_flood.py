"""Issue 11 item 5: batches bounded by bytes, not only by count.

A flood of ~1 MiB poison records between valid events must drain exactly once (every
poison record a reject row and a dead-letter record) with the worker's memory bounded by
ACKLINE_BATCH_MAX_BYTES, whatever batch_max_events says. Before the byte bound, a batch of
up to batch_max_events such records was held (twice: buffered and in flight) and sent as
one `bytea[]`: 1,100 of them took a worker to 2.1 GB, and past PostgreSQL's 1 GB message
limit a batch could never commit.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.integration.harness import Services, Worker
from tests.integration.windows import Item, Scenario, step, verify_ok, wait_drained

pytestmark = pytest.mark.integration

POISON = 300
POISON_BYTES = 900_000  # under the topic's 1 MiB record limit with headers and batch overhead


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def test_item_5_a_flood_of_large_poison_drains_with_bounded_memory(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    group = f"g-{topic}"
    rng = random.Random(5)
    sc = Scenario(services.bootstrap, topic, tmp_path / "flood.jsonl.gz")
    try:
        for chunk in range(POISON // 50):
            items = [Item.event(step(chunk * 1000 + i), partition=i % 3) for i in range(100)]
            blob = [
                Item.bad(rng.randbytes(POISON_BYTES), "not_utf8", partition=i % 3)
                for i in range(50)
            ]
            sc.send(items[:50] + blob + items[50:])
        manifest = sc.write()
    finally:
        sc.close()
    w = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="w",
        batch_max_events=2000,
        batch_max_bytes=16 * 1_048_576,
        max_message_bytes=2_000_000,
    )
    wait_drained(dsn, manifest, group, [w], timeout=240)
    peak = _peak_rss_mb(w.proc.pid)
    assert w.stop() == 0, w.log()[-3000:]
    verify_ok(dsn, manifest, group)
    # 270 MB of poison went through; with 16 MiB batches the worker holds a few batches
    # (150-250 MB measured; the same flood without a byte bound peaked at 767 MB).
    assert peak < 500, f"peak RSS {peak:.0f} MB"
