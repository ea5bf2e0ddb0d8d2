"""The side-by-side run's close(): every part is stopped even when one before it fails."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from ackline.load.chaos.sidebyside import _SideBySideRun


class _Part:
    """A part of the run whose stop is recorded, and fails when told to."""

    def __init__(self, name: str, stopped: list[str], fails: bool = False) -> None:
        self.name, self.stopped, self.fails = name, stopped, fails

    def _done(self) -> None:
        self.stopped.append(self.name)
        if self.fails:
            raise RuntimeError(f"{self.name} would not stop")

    stop = shutdown = close = _done


def test_a_part_that_fails_to_stop_does_not_leave_the_others_running(tmp_path: Path) -> None:
    """close() stopped at its first error: a copier that raised left Kafka Connect's JVM,
    the ackline workers and both connections running past the stack's stop."""
    run = _SideBySideRun(None, tmp_path, None, 1, 1, 0.0, 1.0, io.StringIO())
    stopped: list[str] = []
    parts: dict[str, Any] = {
        "copier": _Part("copier", stopped, fails=True),
        "connect": _Part("connect", stopped),
        "pool": _Part("pool", stopped),
        "a_pg": _Part("a_pg", stopped),
        "c_pg": _Part("c_pg", stopped, fails=True),
    }
    for name, part in parts.items():
        setattr(run, name, part)
    with pytest.raises(RuntimeError, match="copier would not stop") as raised:
        run.close()
    assert stopped == ["copier", "connect", "pool", "a_pg", "c_pg"]
    assert "c_pg would not stop" in "".join(raised.value.__notes__)
