"""`make bench-backlog`: one `ackline run` drains a 10 M-event backlog; peak RSS sampled.

The backlog is the bench's 1 M generated events (:mod:`ackline.load.bench.data`) written ten
times into one fresh 12-partition topic, each copy with fresh ids (``event_id`` from
UUID5 of the original and the copy number, ``txn_id`` suffixed ``~c<copy>``), so every
one of the 10 M is a new event, with realistic bodies. Producing is untimed; then a
single worker with default settings drains the topic while the bench samples its
resident memory every 0.2 s (and reads the kernel's peak, ``ru_maxrss``, at the end).
Writes ``load/bench/backlog.json``; the headline of ``make bench`` picks it up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from ackline.load.bench.common import PARTITIONS, ROOT, Cluster, ensure_stack, say
from ackline.load.bench.data import ensure_topic_patiently, prepare
from ackline.load.bench.measure import descendants, kill_all, rss_kb
from ackline.load.bench.systems import Ackline, Env
from ackline.load.capture.file import CapturedRecord, CaptureReader
from ackline.load.capture.replay import Pace, replay

RESULT = Path(__file__).resolve().parent / "backlog.json"


def copy_value(value: bytes, copy: int) -> bytes:
    """The event with new ids for copy ``copy`` (copy 0 is the original)."""
    if copy == 0:
        return value
    event = json.loads(value)
    event["event_id"] = str(uuid.uuid5(uuid.UUID(event["event_id"]), f"copy-{copy}"))
    event["txn_id"] = f"{event['txn_id']}~c{copy}"
    return json.dumps(event, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def copies(path: Path, count: int) -> Iterator[CapturedRecord]:
    for copy in range(count):
        with CaptureReader(path) as reader:
            for rec in reader:
                yield replace(rec, value=copy_value(rec.value or b"{}", copy))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ackline.load.bench.backlog", description=__doc__)
    p.add_argument("--copies", type=int, default=10, help="copies of the 1 M events")
    p.add_argument("--events", type=int, default=1_000_000, help="events per copy")
    args = p.parse_args(argv)
    state_dir = ROOT / ".ackline" / "bench"
    run_id = uuid.uuid4().hex[:8]
    logs = state_dir / "logs" / f"backlog-{run_id}"
    logs.mkdir(parents=True, exist_ok=True)
    info, started_here = ensure_stack(state_dir)
    try:
        result = _run(args, state_dir, logs, run_id, info.kafka_bootstrap, info.database_url)
    finally:
        kill_all()
        if started_here:
            from ackline.dev import stack

            stack.down(state_dir)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)
    return 0 if result["peak_rss_mb"] <= 300 else 1


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


if __name__ == "__main__":
    sys.exit(main())
