"""`ackline demo`: the whole product end to end on the local stack.

Steps: start the stack (unless ACKLINE_KAFKA_BOOTSTRAP and ACKLINE_DATABASE_URL point
elsewhere), migrate, produce realistic activity with every fault kind into a fresh topic,
run the pipeline until drained with an ingest progress bar, verify against the manifest,
print the human verdict and, as the last line, the verify JSON object; stop what it
started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time

import asyncpg

from ackline.clients import database_dsn, kafka_client_config
from ackline.core.errors import Terminated
from ackline.core.progress import Progress
from ackline.core.signals import run_stoppable
from ackline.load.produce import Knobs, produce
from ackline.load.verify import print_summary, verify
from ackline.runtime.confluent import run
from ackline.settings import Settings
from ackline.sinks.admin.migrate import migrate


async def _ingest_progress(dsn: str, group: str, total: int, stop: asyncio.Event) -> None:
    bar = Progress("ingest", total, unit="records")
    conn = await asyncpg.connect(dsn)
    try:
        while not stop.is_set():
            done = await conn.fetchval(
                "SELECT coalesce(sum(events), 0) FROM ingest_batches WHERE group_id = $1", group
            )
            bar.update(int(done))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await stop.wait()
        done = await conn.fetchval(
            "SELECT coalesce(sum(events), 0) FROM ingest_batches WHERE group_id = $1", group
        )
        bar.update(int(done))
        bar.close()
    finally:
        await conn.close()


async def _run_and_watch(settings: Settings, bootstrap: str, dsn: str, total: int) -> int:
    """The worker until drained, with a progress line. Stopped by SIGTERM or SIGINT, the
    worker stops cleanly and so does the demo: the stop is raised here (the CLI's exit
    143 or 130, the stack stopped on the way out), not a verification of half an ingest."""
    stop = asyncio.Event()
    signalled: list[int] = []
    watcher = asyncio.create_task(_ingest_progress(dsn, settings.group_id, total, stop))
    try:
        status = await run(settings, bootstrap, dsn, until_drained=True, on_signal=signalled.append)
    finally:
        stop.set()
        await watcher
    if signalled:
        raise KeyboardInterrupt() if signalled[0] == signal.SIGINT else Terminated()
    return status


def demo(settings: Settings, events: int, keep: bool) -> int:
    from ackline.dev import stack

    external = bool(settings.kafka_bootstrap and settings.database_url)
    was_running = external or all(
        service["running"] for service in stack.status(settings.state_dir).values()
    )
    logging.getLogger().setLevel(logging.WARNING)
    try:
        if external:
            bootstrap = str(settings.kafka_bootstrap)
            url = settings.database_url.get_secret_value() if settings.database_url else ""
            dsn = database_dsn(url, settings)
        else:
            print("== starting the local stack (Kafka 4 KRaft + PostgreSQL)", flush=True)
            info = stack.up(settings.state_dir)
            bootstrap, dsn = info.kafka_bootstrap, info.database_url
        print("== migrating", flush=True)
        run_stoppable(_migrate(dsn))
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_settings = settings.model_copy(
            update={
                "topic": f"demo-{stamp}",
                "group_id": f"demo-{stamp}",
                "dlq_topic": f"demo-{stamp}.dlq",
            }
        )
        manifest = settings.state_dir / "demo" / f"manifest-{stamp}.jsonl.gz"
        manifest.parent.mkdir(parents=True, exist_ok=True)
        print(f"== producing {events} events into {run_settings.topic}", flush=True)
        summary = produce(
            bootstrap,
            run_settings.topic,
            partitions=12,
            events=events,
            knobs=Knobs(),
            seed=int(time.time()) % 100_000,
            manifest_path=manifest,
            progress=True,
            client_conf=kafka_client_config(settings),
        )
        total = summary.committed_records
        print(f"== ingesting with `ackline run` (group {run_settings.group_id})", flush=True)
        run_stoppable(_run_and_watch(run_settings, bootstrap, dsn, total))
        print("== verifying against the manifest", flush=True)
        verdict = run_stoppable(verify(dsn, manifest, run_settings.group_id))
        print_summary(verdict)
        print(json.dumps(verdict.to_json()), flush=True)
        return 0 if verdict.ok else 1
    finally:
        if not was_running and not keep:
            print("== stopping the local stack", file=sys.stderr, flush=True)
            stack.down(settings.state_dir)


async def _migrate(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn)
    finally:
        await conn.close()
