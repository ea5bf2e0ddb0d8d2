"""faust's record buffers, bounded by bytes as well as by records.

faust counts what it buffers: a topic channel's queue holds up to
``stream_buffer_maxsize`` events and ``noack_take`` gathers up to its ``max_`` before it
yields. With records near the message size limit that is hundreds of megabytes (a
flood of 900 kB records took a worker to 573 MB). The default runtime bounds its
batches and buffers by ``ACKLINE_BATCH_MAX_BYTES``; so do these two replacements:

- :class:`ByteBoundQueue`, the queue :class:`~.transport.AcklineApp` gives every channel
  (faust's ``App.FlowControlQueue``): full at ``max_bytes`` as well, so the fetcher's
  ``put`` waits for the agent (the conductor only forces a put into a queue not full);
- :func:`take_batches`, faust's ``noack_take`` closing a batch before the record that
  would take it past ``max_bytes``.

A record counts its key, value and headers, as a batch's records do
(:meth:`ackline.streams.assemble.Record.size`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from mode.utils.futures import notify
from mode.utils.queues import ThrowableQueue

from ackline.streams.headers import headers_size


def event_bytes(item: Any) -> int:
    """What a faust event (or anything else put in a channel: 0) counts against the
    byte bounds: its message's key, value and headers."""
    msg = getattr(item, "message", None)
    if msg is None:
        return 0
    headers = msg.headers
    extra = headers_size(list(headers.items()) if isinstance(headers, dict) else headers or [])
    return len(msg.value or b"") + len(msg.key or b"") + extra


class ByteBoundQueue(ThrowableQueue):  # type: ignore[type-arg]
    """faust's channel queue, full at ``max_bytes`` of records too (a record put while
    it is under holds it: at most ``max_bytes`` plus one record)."""

    def __init__(self, maxsize: int = 0, *, max_bytes: int, **kwargs: Any) -> None:
        super().__init__(maxsize, **kwargs)
        self.max_bytes = max_bytes
        self.bytes = 0
        self._sizes: deque[int] = deque()  # one per queued item, in queue order

    def full(self) -> bool:
        return bool(super().full()) or self.bytes >= self.max_bytes

    def _put(self, item: Any) -> None:
        n = event_bytes(item)
        super()._put(item)
        self._sizes.append(n)
        self.bytes += n

    def _get(self) -> Any:
        item = super()._get()
        self.bytes -= self._sizes.popleft()
        return item

    def clear(self) -> None:
        """Empty the queue (faust clears it at a revoke): its bytes with it."""
        super().clear()
        self._sizes.clear()
        self.bytes = 0


async def take_batches(
    stream: Any,
    max_events: int,
    max_bytes: int,
    within: float,
    flush: asyncio.Event | None = None,
) -> AsyncIterator[list[Any]]:
    """Batches of ``stream``'s events, nothing acked (the caller acks after the COMMIT).

    faust-streaming 0.15's ``Stream.noack_take`` with a byte bound: a batch is yielded
    at ``max_events`` events, or before the event that would take it past ``max_bytes``
    (an event larger than that is a batch of its own), or when ``within`` seconds pass
    with events gathered. While the caller holds a batch, no event is added: the next
    one waits in the stream's processor, and the channel queue behind it fills up to its
    own bound (:class:`ByteBoundQueue`). Setting ``flush`` yields what is gathered now
    (a revoke: faust waits for every event it handed out to be acked, those gathered here
    included, and ``within`` may be longer than the revoke may wait). An error in the
    processor crashes the stream, as faust's own take does: it must not end the passive
    drainer and leave the take waiting for ever.
    """
    batch: list[Any] = []
    size = 0
    full = flush if flush is not None else asyncio.Event()
    consumed = asyncio.Event()
    consuming: asyncio.Future[None] | None = None

    async def yield_batch() -> None:
        full.set()
        consumed.clear()
        await stream.wait(consumed)

    async def add(value: Any) -> Any:
        nonlocal consuming, size
        try:
            if consuming is not None:  # a batch yielded at the timeout is being written
                try:
                    await consuming
                finally:
                    consuming = None
            event = stream.current_event
            if event is None:
                raise RuntimeError("take_batches found no current event")
            n = event_bytes(event)
            if batch and size + n > max_bytes:
                await yield_batch()
            batch.append(event)
            size += n
            if len(batch) >= max_events or size >= max_bytes:
                await yield_batch()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await stream.crash(exc)
        return value

    stream.add_processor(add)
    stream._enable_passive(aiter(stream.channel))
    try:
        while not stream.should_stop:
            await stream.wait_for_stopped(full, timeout=within)
            if not batch:
                full.clear()  # a flush with nothing gathered
            else:
                consuming = stream.loop.create_future()
                try:
                    yield list(batch)
                finally:
                    batch.clear()
                    size = 0
                    notify(consuming)
                    full.clear()
                    consumed.set()
    finally:
        stream._processors.remove(add)
