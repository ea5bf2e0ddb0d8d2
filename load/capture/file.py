"""The capture file: a topic range as framed, compressed, checksummed records.

Pure (file I/O only, no Kafka). :mod:`ackline.load.capture.topics` fills a file from a topic and
:mod:`ackline.load.capture.replay` sends one back. Layout, all integers big-endian::

    magic    b"ACKCAP1\\n"                                            8 bytes
    header   b"H" u32 length, u32 crc32(json), json (utf-8)          what and whence
    block*   b"B" u32 length, u32 crc32(data), u32 records, data     zlib of records
    trailer  b"E" u64 records, u64 blocks, u32 crc32(the 16 bytes), b"ACKEND\\n"

A block's data is zlib-compressed; decompressed it is a run of records, each
``u32 length, u32 crc32(body), body`` where the body is::

    i32 partition, i64 offset, i8 timestamp type, i64 timestamp (ms),
    i32 key length (-1: null), key, i32 value length (-1: null), value,
    u16 header count, then per header: u16 name length, name (utf-8),
    i32 value length (-1: null), value

The trailer has a fixed size, so a reader checks it first: a file cut anywhere (a
capture that did not finish, a partial copy) has no valid trailer and is refused
before a single record is replayed. A flipped bit fails a CRC (block, record or
header), and a block or record count that disagrees with the trailer is reported.
Files are written to ``<path>.partial`` and renamed when the trailer is written.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final

from ackline.load.errors import LoadError

MAGIC: Final = b"ACKCAP1\n"
TRAILER_END: Final = b"ACKEND\n"
FORMAT_VERSION: Final = 1
BLOCK_BYTES: Final = 1 << 20
"""Uncompressed bytes per block before it is flushed."""

_FRAME = struct.Struct(">cII")  # kind, length, crc
_BLOCK = struct.Struct(">cIII")  # kind, length, crc, records
_TRAILER = struct.Struct(">cQQI")  # kind, records, blocks, crc
_TRAILER_SIZE: Final = _TRAILER.size + len(TRAILER_END)
_RECORD = struct.Struct(">II")  # length, crc
_FIXED = struct.Struct(">iqbq")  # partition, offset, timestamp type, timestamp
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")

Header = tuple[str, bytes | None]


class CaptureFormatError(LoadError):
    """A capture file is not one, or is truncated or corrupt; the message says which."""


@dataclass(frozen=True, slots=True)
class CapturedRecord:
    """One Kafka record as captured: coordinates, timestamp, key, value, headers."""

    partition: int
    offset: int
    timestamp_type: int
    """confluent-kafka's TIMESTAMP_* constant: 1 CreateTime, 2 LogAppendTime."""
    timestamp: int
    """Milliseconds since the epoch."""
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True)
class CaptureHeader:
    """What a capture holds; ``ranges`` maps partition to [first offset, end offset)."""

    topic: str
    created_at: str
    ranges: dict[int, tuple[int, int]]
    selection: dict[str, Any] = field(default_factory=dict)
    """How the range was chosen (offsets or time window), for the record."""

    def to_json(self) -> bytes:
        data = {
            "format": "ackline-capture",
            "version": FORMAT_VERSION,
            "topic": self.topic,
            "created_at": self.created_at,
            "ranges": {str(p): list(r) for p, r in sorted(self.ranges.items())},
            "selection": self.selection,
        }
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> CaptureHeader:
        try:
            data = json.loads(raw)
            if data.get("format") != "ackline-capture":
                raise CaptureFormatError("the header does not describe an ackline capture")
            if data.get("version") != FORMAT_VERSION:
                raise CaptureFormatError(f"unsupported capture version {data.get('version')!r}")
            ranges = {int(p): (int(r[0]), int(r[1])) for p, r in data["ranges"].items()}
            return cls(str(data["topic"]), str(data["created_at"]), ranges, data["selection"])
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise CaptureFormatError(f"the header is not valid: {exc}") from exc


# --- encoding (pure) ----------------------------------------------------------------------


def _optional(raw: bytes | None) -> bytes:
    return _I32.pack(-1) if raw is None else _I32.pack(len(raw)) + raw


def encode_record(rec: CapturedRecord) -> bytes:
    """The framed record: length, CRC, body."""
    parts = [
        _FIXED.pack(rec.partition, rec.offset, rec.timestamp_type, rec.timestamp),
        _optional(rec.key),
        _optional(rec.value),
        _U16.pack(len(rec.headers)),
    ]
    for name, value in rec.headers:
        encoded = name.encode()
        parts.append(_U16.pack(len(encoded)) + encoded)
        parts.append(_optional(value))
    body = b"".join(parts)
    return _RECORD.pack(len(body), zlib.crc32(body)) + body


class _Cursor:
    """Reads fields of one record body; any overrun is a CaptureFormatError."""

    def __init__(self, body: bytes, where: str) -> None:
        self.body, self.pos, self.where = body, 0, where

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.body):
            raise CaptureFormatError(f"{self.where}: a field runs past the record's end")
        out = self.body[self.pos : self.pos + n]
        self.pos += n
        return out

    def optional(self) -> bytes | None:
        (n,) = _I32.unpack(self.take(4))
        return None if n == -1 else self.take(n)


def decode_record(body: bytes, where: str) -> CapturedRecord:
    """A record body (without its length and CRC) back to a CapturedRecord."""
    cur = _Cursor(body, where)
    partition, offset, ts_type, ts = _FIXED.unpack(cur.take(_FIXED.size))
    key = cur.optional()
    value = cur.optional()
    (count,) = _U16.unpack(cur.take(2))
    headers: list[Header] = []
    for _ in range(count):
        (n,) = _U16.unpack(cur.take(2))
        try:
            name = cur.take(n).decode()
        except UnicodeDecodeError as exc:
            raise CaptureFormatError(f"{where}: a header name is not UTF-8") from exc
        headers.append((name, cur.optional()))
    if cur.pos != len(body):
        raise CaptureFormatError(f"{where}: {len(body) - cur.pos} bytes left after the record")
    return CapturedRecord(partition, offset, ts_type, ts, key, value, tuple(headers))


def split_records(data: bytes, first: int) -> Iterator[CapturedRecord]:
    """The records of one decompressed block; ``first`` numbers them for messages."""
    pos, n = 0, first
    while pos < len(data):
        where = f"record {n}"
        if pos + _RECORD.size > len(data):
            raise CaptureFormatError(f"{where}: its length is cut off")
        length, crc = _RECORD.unpack_from(data, pos)
        pos += _RECORD.size
        body = data[pos : pos + length]
        if len(body) != length:
            raise CaptureFormatError(f"{where}: {length} bytes announced, {len(body)} present")
        if zlib.crc32(body) != crc:
            raise CaptureFormatError(f"{where}: CRC mismatch (the file is corrupt)")
        pos += length
        n += 1
        yield decode_record(body, where)


# --- writing --------------------------------------------------------------------------------


class CaptureWriter:
    """Writes a capture to ``<path>.partial``; :meth:`close` adds the trailer and renames.

    Leaving the ``with`` block by an exception discards the partial file.
    """

    def __init__(self, path: Path, header: CaptureHeader, level: int = 1) -> None:
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.records = 0
        self.blocks = 0
        self.bytes_in = 0
        self._level = level
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._pending_records = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[bytes] | None = self.partial.open("wb")
        raw = header.to_json()
        self._fh.write(MAGIC + _FRAME.pack(b"H", len(raw), zlib.crc32(raw)) + raw)

    def write(self, rec: CapturedRecord) -> None:
        framed = encode_record(rec)
        self._pending.append(framed)
        self._pending_bytes += len(framed)
        self._pending_records += 1
        self.records += 1
        self.bytes_in += len(rec.value or b"") + len(rec.key or b"")
        if self._pending_bytes >= BLOCK_BYTES:
            self._flush_block()

    def _flush_block(self) -> None:
        if not self._pending or self._fh is None:
            return
        data = zlib.compress(b"".join(self._pending), self._level)
        self._fh.write(_BLOCK.pack(b"B", len(data), zlib.crc32(data), self._pending_records))
        self._fh.write(data)
        self.blocks += 1
        self._pending, self._pending_bytes, self._pending_records = [], 0, 0

    def close(self) -> None:
        """Flush, write the trailer, fsync and rename to the final path."""
        if self._fh is None:
            return
        self._flush_block()
        counts = struct.pack(">QQ", self.records, self.blocks)
        self._fh.write(
            _TRAILER.pack(b"E", self.records, self.blocks, zlib.crc32(counts)) + TRAILER_END
        )
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        self.partial.replace(self.path)

    def discard(self) -> None:
        """Remove the partial file, dropping what is still buffered. Bounded even when a
        write is stuck (a stop request while the disk or pipe does not drain): the
        buffer is flushed into /dev/null, never waited on."""
        fh, self._fh = self._fh, None
        self.partial.unlink(missing_ok=True)
        if fh is None:
            return
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, fh.fileno())
            finally:
                os.close(devnull)
        with contextlib.suppress(OSError, ValueError):
            fh.close()

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


# --- reading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trailer:
    records: int
    blocks: int


class CaptureReader:
    """Opens and checks a capture (magic, trailer, header) before any record is read.

    Iterate it for the records, in file order. Every check failure is a
    CaptureFormatError naming the file and what is wrong.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._fh: IO[bytes] = self.path.open("rb")
        except FileNotFoundError as exc:
            raise CaptureFormatError(f"{self.path}: no such capture file") from exc
        except OSError as exc:
            raise self._unreadable(exc) from exc
        try:
            self.size = os.fstat(self._fh.fileno()).st_size
            self.trailer = self._read_trailer()
            self.header = self._read_header()
        except OSError as exc:
            self._fh.close()
            raise self._unreadable(exc) from exc
        except BaseException:
            self._fh.close()
            raise

    def _fail(self, problem: str) -> CaptureFormatError:
        return CaptureFormatError(f"{self.path}: {problem}")

    def _unreadable(self, exc: OSError) -> CaptureFormatError:
        """A read the system refused (EIO from /proc/self/mem, a directory, a lost
        mount) went up as an OSError without a file name: a traceback."""
        why = os.strerror(exc.errno).lower() if exc.errno is not None else str(exc)
        return self._fail(f"cannot read it ({why}): give a readable capture file")

    def _read_trailer(self) -> Trailer:
        magic = self._fh.read(len(MAGIC))
        if magic != MAGIC:
            raise self._fail("not an ackline capture file (bad magic)")
        if self.size < len(MAGIC) + _FRAME.size + _TRAILER_SIZE:
            raise self._fail("truncated: too short to hold a header and a trailer")
        self._fh.seek(self.size - _TRAILER_SIZE)
        raw = self._fh.read(_TRAILER_SIZE)
        kind, records, blocks, crc = _TRAILER.unpack(raw[: _TRAILER.size])
        end = raw[_TRAILER.size :]
        if kind != b"E" or end != TRAILER_END:
            raise self._fail(
                "truncated or incomplete: no trailer at the end of the file (the capture "
                "did not finish, or the file was cut)"
            )
        if zlib.crc32(struct.pack(">QQ", records, blocks)) != crc:
            raise self._fail("corrupt trailer (CRC mismatch)")
        self._fh.seek(len(MAGIC))
        return Trailer(records, blocks)

    def _read_header(self) -> CaptureHeader:
        head = self._fh.read(_FRAME.size)
        kind, length, crc = _FRAME.unpack(head)
        if kind != b"H" or len(MAGIC) + _FRAME.size + length > self.size - _TRAILER_SIZE:
            raise self._fail("corrupt header frame")
        raw = self._fh.read(length)
        if zlib.crc32(raw) != crc:
            raise self._fail("corrupt header (CRC mismatch)")
        header = CaptureHeader.from_json(raw)
        self._first_block = self._fh.tell()
        return header

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Every failure while reading blocks named with the file (a record's own message
        does not know it) and as a CaptureFormatError."""
        try:
            yield
        except CaptureFormatError as exc:
            if str(exc).startswith(str(self.path)):
                raise
            raise self._fail(str(exc)) from exc
        except OSError as exc:
            raise self._unreadable(exc) from exc

    def _blocks(self) -> Iterator[tuple[int, int, bytes]]:
        """Each block's file position, record count and decompressed data, in file order,
        its frame and CRC checked."""
        self._fh.seek(self._first_block)
        end = self.size - _TRAILER_SIZE
        while self._fh.tell() < end:
            at = self._fh.tell()
            head = self._fh.read(_BLOCK.size)
            if len(head) < _BLOCK.size or at + _BLOCK.size > end:
                raise self._fail(f"truncated block frame at byte {at}")
            kind, length, crc, count = _BLOCK.unpack(head)
            if kind != b"B" or at + _BLOCK.size + length > end:
                raise self._fail(f"corrupt block frame at byte {at}")
            data = self._fh.read(length)
            if zlib.crc32(data) != crc:
                raise self._fail(f"corrupt block at byte {at} (CRC mismatch)")
            try:
                plain = zlib.decompress(data)
            except zlib.error as exc:
                raise self._fail(f"corrupt block at byte {at}: {exc}") from exc
            yield at, count, plain

    def largest_record(self) -> int:
        """The largest record body in bytes (key, value, headers and a few dozen bytes of
        framing): what a target topic must accept, known before a record is sent. A
        pass over the blocks that reads record lengths only; iterating checks the rest."""
        largest = 0
        with self._reading():
            for _, _, plain in self._blocks():
                pos = 0
                while pos + _RECORD.size <= len(plain):
                    length, _ = _RECORD.unpack_from(plain, pos)
                    largest = max(largest, length)
                    pos += _RECORD.size + length
        return largest

    def __iter__(self) -> Iterator[CapturedRecord]:
        records = blocks = 0
        with self._reading():
            for at, count, plain in self._blocks():
                before = records
                for rec in split_records(plain, records):
                    records += 1
                    yield rec
                if records - before != count:
                    raise self._fail(f"block at byte {at} holds {records - before} of {count}")
                blocks += 1
        if (records, blocks) != (self.trailer.records, self.trailer.blocks):
            raise self._fail(
                f"{records} records in {blocks} blocks, the trailer says "
                f"{self.trailer.records} in {self.trailer.blocks}"
            )

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> CaptureReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = [
    "CaptureFormatError",
    "CaptureHeader",
    "CaptureReader",
    "CaptureWriter",
    "CapturedRecord",
    "decode_record",
    "encode_record",
]
