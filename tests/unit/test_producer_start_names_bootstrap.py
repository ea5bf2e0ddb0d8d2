"""An SDK producer that cannot start names the address it tried (operator probe): with
the bootstrap of a stack that was not there (docs/producing.md's 127.0.0.1:9092 against
`ackline dev up`'s random ports), start() waited and failed with "cannot initialise
transactions: _TIMED_OUT", which did not say where it had looked."""

from __future__ import annotations

import asyncio
import socket

import pytest

from ackline.streams.aio_producer import AsyncActivityProducer
from ackline.streams.errors import TransientProduceError
from ackline.streams.producer import ActivityProducer


def _nothing_listening() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_the_sync_producer_names_its_bootstrap() -> None:
    bootstrap = _nothing_listening()
    producer = ActivityProducer(bootstrap, "t", "tx-start-1")
    with pytest.raises(TransientProduceError) as failed:
        producer.start(timeout=1.5)
    assert f"cannot initialise transactions with {bootstrap}: " in str(failed.value)


def test_the_asyncio_producer_names_its_bootstrap() -> None:
    bootstrap = _nothing_listening()

    async def start() -> None:
        await AsyncActivityProducer(bootstrap, "t", "tx-start-2").start(timeout=1.5)

    with pytest.raises(TransientProduceError) as failed:
        asyncio.run(start())
    assert f"cannot initialise transactions with {bootstrap}: " in str(failed.value)
