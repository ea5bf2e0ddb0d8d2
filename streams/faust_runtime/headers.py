"""aiokafka decoding header keys that are not UTF-8, instead of stalling for good.

Kafka header keys are any bytes on the wire (a Go client or ``kcat -H`` can send one that
is not UTF-8). aiokafka 0.14 decodes them strictly: ``getmany()`` then raises
UnicodeDecodeError on every fetch of that partition, and the records of other partitions
drained in the same call are consumed but never returned. faust's fetcher dies on the
first one and the worker crash-loops on the same record.

:func:`install_lenient_headers` leaves normal decoding alone (aiokafka's C reader, no cost
per record). When a fetched chunk raises UnicodeDecodeError, that chunk is decoded again,
from the first record not yet handed out, by aiokafka's pure-Python reader with header
keys decoded as ``surrogateescape``: ``key.encode("utf-8", "surrogateescape")`` gives the
bytes back, which the dead-letter producer does (:mod:`ackline.streams.deadletter`).

It patches aiokafka's private ``fetcher.MemoryRecords`` (to keep each chunk's bytes) and
``PartitionRecords._unpack_records`` (to resume after the error), proven on aiokafka 0.14.0
only: :func:`problems` names what is missing on another version, and the install refuses
(the worker would otherwise crash-loop on such a record).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from aiokafka.consumer import fetcher
from aiokafka.record import default_records, memory_records

from ackline.streams.errors import StreamError

log = logging.getLogger(__name__)

_NEEDED = (
    (fetcher, "MemoryRecords"),
    (fetcher, "PartitionRecords"),
    (getattr(fetcher, "PartitionRecords", None), "_unpack_records"),
    (memory_records, "_MemoryRecordsPy"),
    (default_records, "_DefaultRecordBatchPy"),
)
_FAST_RECORDS: Any = getattr(fetcher, "MemoryRecords", None)  # aiokafka's, C when built
_PY_RECORDS: Any = getattr(memory_records, "_MemoryRecordsPy", None)
_PY_BATCH: Any = getattr(default_records, "_DefaultRecordBatchPy", object)
_installed = False


class HeadersPatchError(StreamError):
    """The installed aiokafka lacks what the lenient header decoding patches."""


def problems() -> list[str]:
    """Why :func:`install_lenient_headers` cannot patch the installed aiokafka ([]: it can)."""
    return [f"aiokafka has no {name}" for owner, name in _NEEDED if not hasattr(owner, name)]


def install_lenient_headers() -> None:
    """Make aiokafka's fetcher survive header keys that are not UTF-8 (idempotent; call it
    before the faust app creates its consumer). Raises HeadersPatchError on an aiokafka it
    cannot patch."""
    global _installed
    if _installed:
        return
    missing = problems()
    if missing:
        raise HeadersPatchError(
            f"cannot make aiokafka survive non-UTF-8 header keys: {'; '.join(missing)} "
            "(the faust runtime is proven on aiokafka 0.14)"
        )
    fetcher.MemoryRecords = _KeepRaw
    fetcher.PartitionRecords._unpack_records = _lenient_unpack(
        fetcher.PartitionRecords._unpack_records
    )
    _installed = True


class _LenientBytes(bytes):
    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return bytes.decode(self, encoding, "surrogateescape")


class _LenientBuffer(bytearray):
    def __getitem__(self, item: Any) -> Any:  # slices decode leniently, ints as usual
        got = bytearray.__getitem__(self, item)
        return _LenientBytes(got) if isinstance(item, slice) else got


class _LenientBatch(_PY_BATCH):  # type: ignore[misc]
    """aiokafka's pure-Python record batch, over a buffer whose slices decode leniently."""

    _buffer: bytearray

    def __init__(self, buffer: bytes | bytearray | memoryview) -> None:
        super().__init__(buffer)
        self._buffer = _LenientBuffer(self._buffer)

    def _maybe_uncompress(self) -> None:
        super()._maybe_uncompress()  # may replace _buffer with a plain bytearray
        if not isinstance(self._buffer, _LenientBuffer):
            self._buffer = _LenientBuffer(self._buffer)


class _KeepRaw:
    """aiokafka's MemoryRecords, plus the chunk's bytes for a lenient second pass."""

    __slots__ = ("_records", "raw")

    def __init__(self, data: bytes) -> None:
        self._records = _FAST_RECORDS(data)
        self.raw = data

    def size_in_bytes(self) -> int:
        return int(self._records.size_in_bytes())

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        return self._records.next_batch()


class _LenientFrom:
    """The batches of a chunk that end after ``position``, decoded leniently."""

    def __init__(self, data: bytes, position: int) -> None:
        self._records = _PY_RECORDS(data)
        self._position = position

    def size_in_bytes(self) -> int:
        return int(self._records.size_in_bytes())

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        while True:
            raw = self._records._next_slice
            batch = self._records.next_batch()
            if batch is None or raw is None:
                return batch
            if batch.next_offset <= self._position:
                continue  # handed out in the first pass: replaying it would move
                # next_fetch_offset backwards
            if batch.magic < 2 or batch.is_control_batch:
                return batch
            return _LenientBatch(raw)


def _lenient_unpack(original: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
    """``PartitionRecords._unpack_records`` that, on a UnicodeDecodeError, decodes the
    rest of the chunk again leniently, from the first record not handed out yet."""

    def _unpack_records(self: Any) -> Iterator[Any]:
        try:
            yield from original(self)
        except UnicodeDecodeError as exc:
            records = self._records
            if not isinstance(records, _KeepRaw):
                raise
            log.warning(
                "%s: a header key at or after offset %d is not UTF-8 (%r): decoding it "
                "with surrogate escapes",
                self._tp,
                self.next_fetch_offset,
                exc.object[exc.start : exc.end + 8],
            )
            # aiokafka's loop skips the records below next_fetch_offset itself.
            self._records = _LenientFrom(records.raw, self.next_fetch_offset)
            yield from original(self)

    return _unpack_records
