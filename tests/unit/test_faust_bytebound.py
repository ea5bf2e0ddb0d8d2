"""The faust runtime's channel queue is bounded by bytes as well as records
(``ackline.streams.faust_runtime.bytebound``)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from mode.utils.queues import FlowControlEvent

from ackline.streams.faust_runtime.bytebound import ByteBoundQueue, event_bytes


def _event(size: int, headers: list[tuple[str, bytes]] | None = None) -> SimpleNamespace:
    return SimpleNamespace(message=SimpleNamespace(key=b"k", value=b"x" * size, headers=headers))


def test_an_event_counts_its_key_value_and_headers() -> None:
    assert event_bytes(_event(10)) == 11
    assert event_bytes(_event(10, [("h", b"abc")])) > 15
    assert event_bytes(object()) == 0  # not an event: counts nothing


def test_the_queue_is_full_at_its_bytes_and_a_put_waits_for_a_get() -> None:
    async def go() -> None:
        q = ByteBoundQueue(
            1_000, max_bytes=2_000, flow_control=FlowControlEvent(initially_suspended=False)
        )
        q.put_nowait(_event(1_500))
        assert not q.full()
        q.put_nowait(_event(1_500))  # under the bound when put: at most one record past it
        assert q.full() and q.bytes == 3_002
        put = asyncio.ensure_future(q.put(_event(10)))
        await asyncio.sleep(0.01)
        assert not put.done()
        q.get_nowait()
        await asyncio.sleep(0.01)
        assert put.done() and q.qsize() == 2 and q.bytes == 1_512
        q.clear()
        assert q.bytes == 0 and q.qsize() == 0 and not q.full()

    asyncio.run(go())
