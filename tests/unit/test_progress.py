"""The progress bar off a terminal (ackline.core.progress): a line per tenth, and not
silent for long. (Not the worker's progress line: test_progress_line.py.)"""

from __future__ import annotations

import io

import pytest

from ackline.core import progress
from ackline.core.progress import Progress


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(progress.time, "monotonic", c)
    return c


def test_a_slow_job_off_a_terminal_prints_a_line_at_least_every_quiet_bound(
    clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job moving by less than a tenth printed nothing between its tenths: a replay at
    20/s of 5,312 records was silent for 26 s, and 10 % of a long one much longer."""
    err = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", err)
    bar = Progress("replay", 1000, unit="records")
    bar.update(1)
    clock.now += 31  # past the 30 s bound (QUIET_AT_MOST_S)
    bar.update(2)
    clock.now += 1
    bar.update(3)  # within the bound and the same tenth: no line
    lines = err.getvalue().splitlines()
    assert [ln.split()[2] for ln in lines] == ["1/1,000", "2/1,000"], lines


def test_no_rate_before_a_second(clock: _Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first line of a capture said 1,000 records at 53,490,233/s: a count over a few
    microseconds. No rate is shown before a second has passed."""
    err = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", err)
    bar = Progress("capture", 5360, unit="records")
    clock.now += 0.00002
    bar.update(1000)
    clock.now += 2
    bar.update(2000)
    first, second = err.getvalue().splitlines()
    assert first.endswith("-/s"), first
    assert second.endswith("1,000/s"), second
