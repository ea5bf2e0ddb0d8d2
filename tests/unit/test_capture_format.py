"""The capture file format: round trip, and every way a file can be cut or damaged."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackline.load.capture import file as cap
from ackline.load.capture.file import (
    CapturedRecord,
    CaptureFormatError,
    CaptureHeader,
    CaptureReader,
    CaptureWriter,
)
from ackline.load.capture.replay import Pace, Pacer

HEADER = CaptureHeader("agent-activity", "2024-05-01T09:00:00Z", {0: (0, 10), 3: (5, 9)})


def _records(n: int) -> list[CapturedRecord]:
    return [
        CapturedRecord(
            partition=i % 4,
            offset=1000 + i,
            timestamp_type=1,
            timestamp=1_714_554_000_000 + i,
            key=None if i % 7 == 0 else f"agent-{i % 5}".encode(),
            value=None if i % 11 == 0 else (b'{"n":%d}' % i) * (1 + i % 50),
            headers=(("content-type", b"application/json"), ("empty", None))[: i % 3],
        )
        for i in range(n)
    ]


def _write(path: Path, records: list[CapturedRecord]) -> Path:
    with CaptureWriter(path, HEADER) as writer:
        for rec in records:
            writer.write(rec)
    return path


def _read(path: Path) -> list[CapturedRecord]:
    with CaptureReader(path) as reader:
        return list(reader)


def test_round_trip_keeps_every_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cap, "BLOCK_BYTES", 2_000)  # many blocks
    records = _records(500)
    path = _write(tmp_path / "r.ackcap", records)
    with CaptureReader(path) as reader:
        assert reader.header == HEADER
        assert reader.trailer.records == 500 and reader.trailer.blocks > 10
        assert list(reader) == records
    assert not (tmp_path / "r.ackcap.partial").exists()


def test_an_empty_capture_round_trips(tmp_path: Path) -> None:
    assert _read(_write(tmp_path / "e.ackcap", [])) == []


def test_the_largest_record_is_found_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replay sizes its target from it: never below the real key + value + headers."""
    monkeypatch.setattr(cap, "BLOCK_BYTES", 2_000)
    records = _records(300)
    path = _write(tmp_path / "l.ackcap", records)
    with CaptureReader(path) as reader:
        largest = reader.largest_record()
        assert list(reader) == records  # the scan leaves the reader at the first block
    sizes = [len(cap.encode_record(r)) - 8 for r in records]  # less the length and CRC
    assert largest == max(sizes)
    assert largest >= max(len(r.value or b"") + len(r.key or b"") for r in records)
    with CaptureReader(_write(tmp_path / "e.ackcap", [])) as empty:
        assert empty.largest_record() == 0


@settings(max_examples=50, deadline=None)
@given(
    st.integers(-1, 2**31 - 1),
    st.integers(0, 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.none() | st.binary(max_size=64),
    st.none() | st.binary(max_size=256),
    st.lists(st.tuples(st.text(max_size=20), st.none() | st.binary(max_size=20)), max_size=4),
)
def test_record_encoding_round_trips(
    partition: int,
    offset: int,
    ts: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]],
) -> None:
    rec = CapturedRecord(partition, offset, 1, ts, key, value, tuple(headers))
    framed = cap.encode_record(rec)
    assert list(cap.split_records(framed, 0)) == [rec]


def test_a_file_cut_anywhere_is_refused_before_any_record(tmp_path: Path) -> None:
    whole = _write(tmp_path / "w.ackcap", _records(300)).read_bytes()
    for cut in (len(whole) - 1, len(whole) - 5, len(whole) // 2, 40, 9):
        path = tmp_path / f"cut{cut}.ackcap"
        path.write_bytes(whole[:cut])
        with pytest.raises(CaptureFormatError, match="truncated"):
            CaptureReader(path)


def test_a_flipped_bit_in_a_block_fails_its_crc(tmp_path: Path) -> None:
    raw = bytearray(_write(tmp_path / "f.ackcap", _records(300)).read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path = tmp_path / "flipped.ackcap"
    path.write_bytes(bytes(raw))
    with pytest.raises(CaptureFormatError, match="CRC mismatch"):
        _read(path)


def test_a_corrupt_record_inside_a_valid_block_fails_its_own_crc(tmp_path: Path) -> None:
    """Re-compress a damaged record with a fresh block CRC: the record CRC still catches it."""
    good = cap.encode_record(_records(2)[1])
    bad = bytearray(good)
    bad[-1] ^= 0x40
    data = zlib.compress(bytes(bad))
    path = tmp_path / "rec.ackcap"
    raw = HEADER.to_json()
    counts = struct.pack(">QQ", 1, 1)
    path.write_bytes(
        cap.MAGIC
        + struct.pack(">cII", b"H", len(raw), zlib.crc32(raw))
        + raw
        + struct.pack(">cIII", b"B", len(data), zlib.crc32(data), 1)
        + data
        + struct.pack(">cQQI", b"E", 1, 1, zlib.crc32(counts))
        + cap.TRAILER_END
    )
    with pytest.raises(CaptureFormatError, match="record 0: CRC mismatch"):
        _read(path)


def test_a_trailer_that_disagrees_with_the_blocks_is_reported(tmp_path: Path) -> None:
    raw = _write(tmp_path / "t.ackcap", _records(50)).read_bytes()
    size = struct.calcsize(">cQQI") + len(cap.TRAILER_END)
    counts = struct.pack(">QQ", 51, 1)
    forged = struct.pack(">cQQI", b"E", 51, 1, zlib.crc32(counts)) + cap.TRAILER_END
    path = tmp_path / "forged.ackcap"
    path.write_bytes(raw[:-size] + forged)
    with pytest.raises(CaptureFormatError, match="the trailer says 51"):
        _read(path)


def test_a_damaged_trailer_or_header_is_named(tmp_path: Path) -> None:
    raw = bytearray(_write(tmp_path / "h.ackcap", _records(5)).read_bytes())
    trailer = bytearray(raw)
    trailer[-len(cap.TRAILER_END) - 1] ^= 0xFF  # inside the trailer's CRC
    (tmp_path / "trailer.ackcap").write_bytes(bytes(trailer))
    with pytest.raises(CaptureFormatError, match="corrupt trailer"):
        CaptureReader(tmp_path / "trailer.ackcap")
    header = bytearray(raw)
    header[len(cap.MAGIC) + 12] ^= 0x20  # inside the header JSON
    (tmp_path / "header.ackcap").write_bytes(bytes(header))
    with pytest.raises(CaptureFormatError, match="corrupt header"):
        CaptureReader(tmp_path / "header.ackcap")


def test_other_files_are_not_captures(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"not": "a capture"}')
    with pytest.raises(CaptureFormatError, match="not an ackline capture"):
        CaptureReader(tmp_path / "x.json")
    with pytest.raises(CaptureFormatError, match="no such capture file"):
        CaptureReader(tmp_path / "missing.ackcap")


def test_a_failed_capture_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "failed.ackcap"
    with pytest.raises(RuntimeError), CaptureWriter(path, HEADER) as writer:
        writer.write(_records(1)[0])
        raise RuntimeError("broker went away")
    assert not path.exists() and not (tmp_path / "failed.ackcap.partial").exists()


@pytest.mark.parametrize(
    ("text", "mode", "value"),
    [
        ("original", "original", 1.0),
        ("2x", "speed", 2.0),
        ("0.5x", "speed", 0.5),
        ("5000/s", "rate", 5000.0),
        ("max", "max", 1.0),
    ],
)
def test_pace_parses(text: str, mode: str, value: float) -> None:
    pace = Pace.parse(text)
    assert (pace.mode, pace.value) == (mode, value)


@pytest.mark.parametrize(
    "text",
    [
        *("fast-ish", "0x", "-3/s", "x2", ""),
        pytest.param("9" * 400 + "x", id="overflowing-factor"),
        pytest.param("9" * 400 + "/s", id="overflowing-rate"),
    ],
)
def test_bad_paces_are_refused(text: str) -> None:
    """The last two were taken as an infinite speed or rate (the digits overflow)."""
    with pytest.raises(cap.LoadError):
        Pace.parse(text)


def test_pacer_schedules() -> None:
    now = [100.0]
    original = Pacer(Pace.parse("original"), clock=lambda: now[0])
    assert original.due(0, 5_000) == 100.0
    assert original.due(1, 6_500) == 101.5
    assert Pacer(Pace.parse("2x"), clock=lambda: now[0]).due(0, 0) == 100.0
    double = Pacer(Pace.parse("2x"), clock=lambda: now[0])
    double.due(0, 0)
    assert double.due(1, 3_000) == 101.5
    rate = Pacer(Pace.parse("1000/s"), clock=lambda: now[0])
    assert [rate.due(i, 0) for i in (0, 1, 500)] == [100.0, 100.001, 100.5]
    fastest = Pacer(Pace.parse("max"), clock=lambda: now[0])
    assert fastest.due(0, 0) == fastest.due(10**6, 10**9) == 100.0
