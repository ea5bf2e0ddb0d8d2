"""A small progress bar on stderr for long work (no dependency).

On a terminal it redraws one line; elsewhere it prints a line every ~10% (and at least
every :data:`QUIET_AT_MOST_S` while it is updated, moving or not) so logs stay short but
a slow or stalled job is not silent. No rate is shown before a second has passed (the
first line of a capture said 53,490,233/s).
"""

from __future__ import annotations

import sys
import time

QUIET_AT_MOST_S = 30.0
"""Off a terminal, the longest an updated job goes without a line."""

RATE_AFTER_S = 1.0
"""No rate before this much time: a count over microseconds is noise."""


class Progress:
    def __init__(self, label: str, total: int, unit: str = "items", width: int = 30) -> None:
        self.label, self.total, self.unit, self.width = label, max(total, 0), unit, width
        self.done = 0
        self._start = time.monotonic()
        self._tty = sys.stderr.isatty()
        self._last_decile = -1
        self._last_draw = 0.0

    def update(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if self._tty:
            if now - self._last_draw >= 0.1 or done >= self.total:
                self._last_draw = now
                sys.stderr.write("\r" + self._line(now))
                sys.stderr.flush()
            return
        decile = (10 * done // self.total) if self.total else 10
        if decile != self._last_decile or now - self._last_draw >= QUIET_AT_MOST_S:
            self._last_decile = decile
            self._last_draw = now
            sys.stderr.write(self._line(now) + "\n")
            sys.stderr.flush()

    def advance(self, n: int = 1) -> None:
        self.update(self.done + n)

    def close(self) -> None:
        if self._tty:
            sys.stderr.write("\r" + self._line(time.monotonic()) + "\n")
            sys.stderr.flush()

    def _line(self, now: float) -> str:
        frac = min(self.done / self.total, 1.0) if self.total else 1.0
        filled = int(frac * self.width)
        elapsed = now - self._start
        rate = f"{self.done / elapsed:>10,.0f}/s" if elapsed >= RATE_AFTER_S else f"{'-':>10}/s"
        return (
            f"{self.label:<8} [{'#' * filled}{'.' * (self.width - filled)}] "
            f"{self.done:>10,}/{self.total:,} {self.unit} {rate}"
        )
