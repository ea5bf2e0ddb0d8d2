"""Write records whose header keys are any bytes, as Go clients (sarama, franz-go) or
``kcat -H`` can: ``python -m tests.integration.hostile_producer`` reads a JSON spec on
stdin and prints where each record landed.

Neither Python client can send a header key that is not UTF-8 through its public API, so
this uses aiokafka's pure-Python batch builder (``AIOKAFKA_NO_EXTENSIONS=1``, set before
aiokafka is imported, which is why this runs in its own process) with a ``str`` whose
``encode()`` returns the raw key bytes.

Spec: ``{"bootstrap": ..., "topic": ..., "records": [{"partition": 0, "key": hex|null,
"value": hex|null, "headers": [[key hex, value hex|null], ...]}, ...]}``. Output: one JSON
list of ``[partition, offset]``, in the order of the records.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

os.environ["AIOKAFKA_NO_EXTENSIONS"] = "1"

from aiokafka import AIOKafkaProducer


class RawKey(str):
    """A header key whose wire bytes are given verbatim (the builder calls .encode())."""

    raw: bytes

    def __new__(cls, raw: bytes) -> RawKey:
        obj = super().__new__(cls, raw.decode("utf-8", "replace"))
        obj.raw = raw
        return obj

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


def _hex(text: str | None) -> bytes | None:
    return None if text is None else bytes.fromhex(text)


async def send(spec: dict[str, Any]) -> list[tuple[int, int]]:
    producer = AIOKafkaProducer(bootstrap_servers=spec["bootstrap"], acks="all")
    await producer.start()
    placed: list[tuple[int, int]] = []
    try:
        for rec in spec["records"]:
            batch = producer.create_batch()
            headers = [(RawKey(bytes.fromhex(k)), _hex(v)) for k, v in rec["headers"]]
            batch.append(
                key=_hex(rec.get("key")),
                value=_hex(rec.get("value")),
                timestamp=None,
                headers=headers,
            )
            future = await producer.send_batch(batch, spec["topic"], partition=rec["partition"])
            meta = await future
            placed.append((int(meta.partition), int(meta.offset)))
    finally:
        await producer.stop()
    return placed


if __name__ == "__main__":
    print(json.dumps(asyncio.run(send(json.load(sys.stdin)))))
