"""The chaos producer's pace (ackline.load.chaos.pacing): time parked is not made up."""

from __future__ import annotations

from pathlib import Path

import pytest

from ackline.load.chaos.pacing import TOP_UP_RATE, Pacer


class _Clock:
    """A clock that moves only when the pacer sleeps; the pause ends at ``until``."""

    def __init__(self, pause: Path, until: float) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self._pause, self._until = pause, until

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.now >= self._until:
            self._pause.unlink(missing_ok=True)


def test_production_resumes_at_its_rate_after_a_pause(tmp_path: Path) -> None:
    pause, paused = tmp_path / "pause", tmp_path / "paused"
    clock = _Clock(pause, until=30.0)
    pacer = Pacer(100.0, pause, paused, clock=clock.time, sleep=clock.sleep)
    pacer(100)  # one second's worth sent at once: wait for the schedule
    assert clock.now == 1.0
    pause.touch()
    pacer(200)  # on schedule at 2 s, then parked until 30 s
    assert clock.now >= 30.0 and not paused.exists()
    resumed = clock.now
    clock.slept.clear()
    pacer(300)  # the next second's worth takes a second again: no burst to catch up
    assert clock.now - resumed == pytest.approx(1.0), clock.slept


def test_parked_is_said_while_parked(tmp_path: Path) -> None:
    pause, paused = tmp_path / "pause", tmp_path / "paused"
    seen: list[bool] = []

    def sleep(seconds: float) -> None:
        seen.append(paused.exists())
        pause.unlink()

    pacer = Pacer(0.0, pause, paused, clock=lambda: 0.0, sleep=sleep)
    pause.touch()
    pacer(10)
    assert seen == [True] and not paused.exists()


def test_unthrottled_never_sleeps_without_a_pause(tmp_path: Path) -> None:
    slept: list[float] = []
    pacer = Pacer(0.0, tmp_path / "p", tmp_path / "q", clock=lambda: 0.0, sleep=slept.append)
    pacer(1_000_000)
    assert slept == []


def test_a_top_up_trickles_from_the_plans_end(tmp_path: Path) -> None:
    """Past its plan (production held open by the harness, ackline.load.chaos.topup) the
    producer goes at TOP_UP_RATE counted from the plan's end: an unthrottled plan that
    took 50 s is not followed by a burst, and a slow one is not held to its own rate."""
    clock = _Clock(tmp_path / "pause", until=0.0)
    pacer = Pacer(0.0, tmp_path / "pause", tmp_path / "paused", clock.time, clock.sleep, 100)
    clock.now = 50.0
    pacer(100)  # the plan, unthrottled
    assert clock.slept == []
    pacer(100 + int(TOP_UP_RATE))  # a second's worth of top-up
    assert clock.now == pytest.approx(51.0)
    slow = Pacer(1.0, tmp_path / "pause", tmp_path / "paused", clock.time, clock.sleep, 10)
    slow(10)  # ten seconds of plan at 1/s
    start = clock.now
    slow(10 + int(TOP_UP_RATE))
    assert clock.now - start == pytest.approx(1.0)
