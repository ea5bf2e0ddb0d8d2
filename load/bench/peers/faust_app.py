"""Peer (e): a naive faust-streaming agent, one asyncpg INSERT per event.

This is the way tutorials write it: for each event from the stream, one INSERT,
awaited, with no batching, no ON CONFLICT and no dead letters. Run by the bench in the
peers' own virtualenv; settings come from the environment the bench sets.

Its throughput setting: an agent awaiting one INSERT per event is bound by round trips, and
faust's documented way to overlap them is the agent's ``concurrency``: that many actors
(here :data:`CONCURRENCY`, each with its own connection) take events from the same stream
in no particular order. The code per event stays the naive one.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import datetime
from typing import Any

import asyncpg
import faust

CONCURRENCY = 4
INSERT = (
    "INSERT INTO {table} (event_id, txn_id, type, agent_id, request_id, occurred_at, "
    "schema_version, payload) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
)


def build() -> Any:
    env = os.environ
    app = faust.App(
        env["BENCH_GROUP"],
        broker=f"kafka://{env['BENCH_BOOTSTRAP']}",
        value_serializer="json",
        web_enabled=False,
        topic_partitions=int(env.get("BENCH_PARTITIONS", "12")),
        consumer_auto_offset_reset="earliest",
    )
    topic = app.topic(env["BENCH_TOPIC"], value_serializer="json")
    insert = INSERT.format(table=env["BENCH_TABLE"])

    async def ingest(stream: Any) -> None:
        conn = await asyncpg.connect(env["BENCH_DSN"])
        async for event in stream:
            await conn.execute(
                insert,
                uuid.UUID(event["event_id"]),
                event["txn_id"],
                event["type"],
                event["agent_id"],
                event["request_id"],
                datetime.fromisoformat(event["occurred_at"].replace("Z", "+00:00")),
                event["schema_version"],
                json.dumps(event["payload"]),
            )

    app.agent(topic, name="ingest", concurrency=CONCURRENCY)(ingest)
    return app


if __name__ == "__main__":
    build().main()
