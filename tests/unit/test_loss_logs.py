"""What the workers logged around a loss (ackline.load.chaos.loss_logs): the lines picked."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from ackline.load.chaos import loss_logs
from ackline.load.chaos.loss_logs import context
from ackline.load.verify import LossWindow

BEFORE = datetime(2026, 12, 5, 7, 55, 0, tzinfo=UTC)
AFTER = BEFORE + timedelta(seconds=20)
WINDOW = LossWindow(5, BEFORE.isoformat(), AFTER.isoformat())


def _line(at: datetime, level: str, logger: str, msg: str, **extra: Any) -> str:
    return json.dumps(
        {
            "ts": at.isoformat(timespec="milliseconds"),
            "level": level,
            "logger": logger,
            "msg": msg,
            **extra,
        }
    )


def _batch(at: datetime, batch_id: int, *partitions: int) -> str:
    ranges = [
        {"topic": "t", "partition": p, "first_offset": 100, "next_offset": 181, "epoch": 7}
        for p in partitions
    ]
    return _line(
        at,
        "info",
        "ackline.batches",
        "batch committed",
        batch_id=batch_id,
        ranges=ranges,
        event="batch_committed",
    )


def test_the_window_keeps_lifecycle_lines_warnings_and_the_partitions_batches() -> None:
    w1 = [
        _line(BEFORE - timedelta(seconds=61), "info", "ackline.x", "too early"),
        _line(BEFORE - timedelta(seconds=59), "info", "ackline.x", "assigned (generation 4)"),
        _batch(BEFORE, 811, 5, 6),
        _batch(BEFORE + timedelta(seconds=1), 812, 6),  # another partition's batch
        _line(BEFORE + timedelta(seconds=2), "debug", "ackline.x", "chatter"),
        _line(BEFORE + timedelta(seconds=3), "info", "ackline.kafka", "librdkafka info"),
        _line(BEFORE + timedelta(seconds=4), "warning", "ackline.kafka", "broker down"),
        "Traceback (most recent call last):",  # a library's stderr: no time, left out
        '{"ts": "cut by a SIGKILL',
    ]
    w2 = [
        _line(BEFORE + timedelta(seconds=10), "warning", "ackline.y", "re-reading [(5, 100)]"),
        _line(AFTER + timedelta(seconds=29), "info", "ackline.y", "just after"),
        _line(AFTER + timedelta(seconds=31), "info", "ackline.y", "too late"),
    ]
    got = context([("w1-2", w1), ("w2-3", w2)], WINDOW)
    assert got == [
        "07:54:01.000 w1-2 INFO ackline.x: assigned (generation 4)",
        "07:55:00.000 w1-2 batch 811 committed on partition 5: [100, 181) epoch 7",
        "07:55:04.000 w1-2 WARNING ackline.kafka: broker down",
        "07:55:10.000 w2-3 WARNING ackline.y: re-reading [(5, 100)]",
        "07:55:49.000 w2-3 INFO ackline.y: just after",
    ]


def test_a_window_with_no_batch_on_a_side_is_open_there_and_the_lines_are_bounded() -> None:
    lines = [
        _line(BEFORE + timedelta(milliseconds=i), "info", "ackline.x", f"line {i}")
        for i in range(loss_logs.LIMIT + 40)
    ]
    got = context([("w", lines)], LossWindow(5, "", ""))
    head = loss_logs.LIMIT // 3
    assert len(got) == loss_logs.LIMIT + 1
    assert got[head - 1].endswith(f"line {head - 1}")
    assert got[head] == "... 40 lines left out ..."
    assert got[-1].endswith(f"line {loss_logs.LIMIT + 39}")


def test_a_long_message_is_cut() -> None:
    long = "x" * (loss_logs.MESSAGE_CHARS + 50)
    (got,) = context([("w", [_line(BEFORE, "error", "faust", long)])], WINDOW)
    assert got.endswith("x" * loss_logs.MESSAGE_CHARS + "...")
