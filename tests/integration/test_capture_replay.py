"""`ackline capture` / `ackline replay` against the real broker: round trip and bad input."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from ackline.load.capture.file import CapturedRecord, CaptureReader
from ackline.load.capture.replay import Pace, replay
from ackline.load.capture.topics import EmptyRangeError, RangeSpec, capture, open_range
from ackline.streams.admin import delete_topic, delete_topics, ensure_topic, partition_count
from ackline.streams.errors import KafkaUnavailableError, TopicError
from tests.integration.harness import Services

# An hour ago, on a whole second: recent enough that the broker's retention (7 days by default)
# keeps the records. A fixed date in the past let the retention check, every 5 minutes, delete
# them between two captures of one test.
T0 = (int(time.time()) - 3600) * 1000


def _fill(services: Services, topic: str, n: int) -> None:
    """``n`` records over 3 partitions, 1 s apart in CreateTime, with keys and headers."""
    producer = Producer({"bootstrap.servers": services.bootstrap, "enable.idempotence": True})
    for i in range(n):
        producer.produce(
            topic,
            key=f"agent-{i % 4}".encode(),
            value=b'{"i": %d}' % i,
            partition=i % 3,
            timestamp=T0 + i * 1000,
            headers=[("content-type", b"application/json"), ("seq", str(i).encode())],
        )
    assert producer.flush(30) == 0


def _read(path: Path) -> list[CapturedRecord]:
    with CaptureReader(path) as reader:
        return list(reader)


@pytest.fixture
def target(services: Services) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:12]}"
    ensure_topic(services.bootstrap, name, partitions=3)
    yield name
    with contextlib.suppress(TopicError):
        delete_topic(services.bootstrap, name)


def _cli(services: Services, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": services.database_url,
    }
    return subprocess.run(
        [sys.executable, "-m", "ackline", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_capture_then_replay_round_trips_through_the_cli(
    services: Services, topic: str, target: str, tmp_path: Path
) -> None:
    _fill(services, topic, 60)
    first = tmp_path / "first.ackcap"
    done = _cli(services, "capture", topic, str(first))
    assert done.returncode == 0, done.stderr
    assert "captured 60 records" in done.stdout
    assert "capture" in done.stderr  # the progress bar
    original = _read(first)
    assert len(original) == 60

    done = _cli(services, "replay", str(first), "--to", target, "--keep-timestamps")
    assert done.returncode == 0, done.stderr
    assert "replayed 60 records" in done.stdout and "as captured" in done.stdout
    again = tmp_path / "again.ackcap"
    capture(services.bootstrap, target, again, RangeSpec())
    copy = _read(again)

    def content(recs: list[CapturedRecord]) -> list[tuple[object, ...]]:
        return sorted((r.partition, r.timestamp, r.key, r.value, r.headers) for r in recs)

    assert content(copy) == content(original)
    for p in range(3):  # order within each partition is kept
        assert [r.value for r in copy if r.partition == p] == [
            r.value for r in original if r.partition == p
        ]


def test_ranges_by_offsets_and_by_time(services: Services, topic: str, tmp_path: Path) -> None:
    _fill(services, topic, 30)  # 10 per partition, offsets 0..9
    by_offset = capture(
        services.bootstrap,
        topic,
        tmp_path / "o.ackcap",
        RangeSpec(start_offset=2, end_offset=5, partitions=(1,)),
    )
    recs = _read(by_offset.path)
    assert [(r.partition, r.offset) for r in recs] == [(1, 2), (1, 3), (1, 4)]

    window = RangeSpec(since_ms=T0 + 10_000, until_ms=T0 + 20_000)  # records 10..19
    by_time = capture(services.bootstrap, topic, tmp_path / "t.ackcap", window)
    assert sorted(r.timestamp for r in _read(by_time.path)) == [
        T0 + i * 1000 for i in range(10, 20)
    ]


def test_replay_paces_a_live_range_at_a_fixed_rate(
    services: Services, topic: str, target: str
) -> None:
    _fill(services, topic, 40)
    ranges, records = open_range(services.bootstrap, topic, RangeSpec())
    summary = replay(
        services.bootstrap, records, target, Pace.parse("100/s"), source_partitions=ranges
    )
    assert summary.records == 40
    assert 0.35 <= summary.seconds < 5  # 40 records at 100/s: the 40th is due at 0.39 s


def test_a_paced_replay_tells_its_progress_every_half_second(
    services: Services, topic: str, target: str
) -> None:
    """Progress was told every 1,000 records only: at 20/s the bar stood at 0 for 50 s (an
    operator's probe saw 0/5,312 for 8 s with 145 records sent). A paced replay tells it
    at least every PROGRESS_EVERY_S too."""
    _fill(services, topic, 30)
    ranges, records = open_range(services.bootstrap, topic, RangeSpec())
    told: list[int] = []
    summary = replay(
        services.bootstrap,
        records,
        target,
        Pace.parse("20/s"),
        source_partitions=ranges,
        on_progress=told.append,
    )
    assert summary.records == 30
    # 1.5 s of sending: two half-second marks at least before the final count
    assert len([n for n in told if 0 < n < 30]) >= 2, told


def test_a_warm_start_sends_its_records_acknowledged_before_the_pace_starts(
    services: Services, topic: str, target: str
) -> None:
    """The warm records are on the broker when ``on_warm`` runs, and the timed ones are
    created only after it returned (the bench's latency phase relies on both)."""
    _fill(services, topic, 30)
    ranges, records = open_range(services.bootstrap, topic, RangeSpec())
    seen: list[int] = []
    warm_done: list[float] = []

    def on_warm() -> None:
        _, warmed = open_range(services.bootstrap, target, RangeSpec())
        seen.append(sum(1 for _ in warmed))
        warm_done.append(time.time())

    summary = replay(
        services.bootstrap,
        records,
        target,
        Pace.parse("100/s"),
        source_partitions=ranges,
        warm=10,
        on_warm=on_warm,
    )
    assert seen == [10]
    assert summary.records == 20  # the paced ones
    assert 0.15 <= summary.seconds < 5  # 20 records at 100/s: the 20th is due at 0.19 s
    _, landed = open_range(services.bootstrap, target, RangeSpec())
    stamps = sorted(r.timestamp for r in landed)
    assert len(stamps) == 30
    assert all(ts / 1000 >= warm_done[0] - 0.001 for ts in stamps[10:])


def test_bad_input_gets_a_clear_error(
    services: Services, topic: str, target: str, tmp_path: Path
) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    done = _cli(services, "capture", missing, str(tmp_path / "m.ackcap"))
    assert done.returncode == 2
    assert f"topic {missing} does not exist" in done.stderr

    with pytest.raises(EmptyRangeError, match="holds no records"):
        capture(services.bootstrap, topic, tmp_path / "empty.ackcap", RangeSpec())
    done = _cli(services, "capture", topic, str(tmp_path / "e.ackcap"), "--since", "2030-01-01")
    assert done.returncode == 2 and "holds no records" in done.stderr
    assert not (tmp_path / "e.ackcap").exists()

    _fill(services, topic, 9)
    whole = capture(services.bootstrap, topic, tmp_path / "w.ackcap", RangeSpec()).path
    done = _cli(services, "replay", str(whole), "--to", missing)
    assert done.returncode == 2 and f"target topic {missing} does not exist" in done.stderr

    raw = whole.read_bytes()
    (tmp_path / "cut.ackcap").write_bytes(raw[: len(raw) - 10])
    done = _cli(services, "replay", str(tmp_path / "cut.ackcap"), "--to", target)
    assert done.returncode == 2 and "truncated" in done.stderr
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0x10
    (tmp_path / "bad.ackcap").write_bytes(bytes(flipped))
    done = _cli(services, "replay", str(tmp_path / "bad.ackcap"), "--to", target)
    assert done.returncode == 2 and "corrupt" in done.stderr

    done = _cli(services, "replay", "--to", target)
    assert done.returncode == 2 and "capture file or --from-topic" in done.stderr


def test_an_unreachable_broker_times_out_with_a_clear_message(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(KafkaUnavailableError, match=f"cannot reach Kafka at {dead}"):
        capture(dead, "any", tmp_path / "x.ackcap", RangeSpec(), timeout=2)
    with pytest.raises(KafkaUnavailableError, match=f"cannot reach Kafka at {dead}"):
        replay(dead, [], "any", Pace.parse("max"), timeout=2)


BIG = 1_100_000
"""Over 1 MiB, above the broker's default ``max.message.bytes`` (1048588)."""


def _fill_with_a_big_record(services: Services, topic: str) -> None:
    """Small records around one of ``BIG`` random (incompressible) bytes."""
    _fill(services, topic, 9)
    producer = Producer({"bootstrap.servers": services.bootstrap, "message.max.bytes": 2 * BIG})
    producer.produce(topic, key=b"big", value=os.urandom(BIG), partition=1)
    assert producer.flush(30) == 0


def _values(services: Services, topic: str) -> list[bytes | None]:
    _, records = open_range(services.bootstrap, topic, RangeSpec())
    return sorted((r.value for r in records), key=lambda v: (len(v or b""), v))


def test_create_topic_makes_room_for_every_record_of_the_source(
    services: Services, tmp_path: Path
) -> None:
    """The source holds a record over 1 MiB (its topic allows it): ``--create-topic``
    made the target with the broker default, which refused it mid-replay."""
    source = f"t-{uuid.uuid4().hex[:12]}"
    ensure_topic(services.bootstrap, source, 3, {"max.message.bytes": str(2 * BIG)})
    made = [source]
    try:
        _fill_with_a_big_record(services, source)
        expected = _values(services, source)
        whole = tmp_path / "big.ackcap"
        assert _cli(services, "capture", source, str(whole), "--quiet").returncode == 0
        for how in ([str(whole)], ["--from-topic", source]):
            made.append(new := f"t-{uuid.uuid4().hex[:12]}")
            done = _cli(services, "replay", *how, "--to", new, "--create-topic", "--quiet")
            assert done.returncode == 0, done.stderr
            assert "replayed 10 records" in done.stdout
            assert _values(services, new) == expected

        made.append(small := f"t-{uuid.uuid4().hex[:12]}")
        ensure_topic(services.bootstrap, small, 3)  # the broker default: too small
        done = _cli(services, "replay", str(whole), "--to", small, "--quiet")
        assert done.returncode == 2
        assert "max.message.bytes" in done.stderr and small in done.stderr, done.stderr
        assert partition_count(services.bootstrap, small) == 3
        with pytest.raises(EmptyRangeError):  # refused before a record was written
            open_range(services.bootstrap, small, RangeSpec())
        done = _cli(services, "replay", "--from-topic", source, "--to", small, "--quiet")
        assert done.returncode == 2  # a live range's largest record is known only when met
        assert f"raise topic {small}'s max.message.bytes" in done.stderr, done.stderr
        assert "records were already written" in done.stderr
    finally:
        with contextlib.suppress(TopicError):
            delete_topics(services.bootstrap, made)
