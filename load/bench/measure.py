"""What the bench measures about a process run: CPU seconds, peak RSS, rates, percentiles.

* :class:`Measured` starts a command, samples the resident memory of its process tree
  (and each process's kernel peak, VmHWM) every 0.2 s and reaps it with ``os.wait4``,
  whose rusage gives its exact CPU time.
* :func:`cpu_seconds_of` reads utime+stime (+ reaped children) of running processes from
  ``/proc``: the PostgreSQL cluster (its postmaster accumulates the CPU of exited
  backends) and the Kafka broker, before and after a run.
* :func:`steady_rate` and :func:`percentile` are pure.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()  # fields from 3 (state) on


def cpu_seconds_of(pids: Sequence[int], children: bool = True) -> float:
    """utime+stime of ``pids`` (plus cutime+cstime of their reaped children)."""
    total = 0
    for pid in pids:
        f = _stat_fields(pid)
        if f is None:
            continue
        total += int(f[11]) + int(f[12])  # utime, stime
        if children:
            total += int(f[13]) + int(f[14])  # cutime, cstime
    return total / _CLK_TCK


def descendants(pid: int) -> list[int]:
    """``pid`` and every live descendant (from /proc/*/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                kids = (task / "children").read_text().split()
                todo.extend(int(k) for k in kids)
        except OSError:
            continue
    return out


def hwm_kb(pid: int) -> int:
    """The kernel's peak RSS (VmHWM) of ``pid``'s current address space, 0 if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_kb(pids: Sequence[int]) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/statm").read_text().split()
        except OSError:
            continue
        total += int(fields[1]) * _PAGE_KB
    return total


@dataclass
class ProcessResult:
    returncode: int
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    """max(sampled peak VmHWM of any process of the tree, sampled RSS of the whole tree)."""


_LIVE: set[Measured] = set()


def kill_all() -> None:
    """SIGKILL the process group of every Measured not reaped yet (the bench is dying)."""
    for proc in list(_LIVE):
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.killpg(proc.proc.pid, signal.SIGKILL)
            proc.reap(5)


class Measured:
    """A started command whose CPU and memory are measured until it is reaped."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log: Path,
        cwd: Path | None = None,
    ) -> None:
        self.log_path = log
        self._log: IO[bytes] = log.open("ab")
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )
        self.peak_tree_kb = 0
        self.peak_hwm_kb = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        self.result: ProcessResult | None = None
        _LIVE.add(self)

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            tree = descendants(self.proc.pid)
            self.peak_tree_kb = max(self.peak_tree_kb, rss_kb(tree))
            self.peak_hwm_kb = max([self.peak_hwm_kb, *(hwm_kb(p) for p in tree)])

    def alive(self) -> bool:
        return self._try_reap() is None

    def _try_reap(self) -> ProcessResult | None:
        """Reap the process if it has ended (never through Popen, which would lose rusage)."""
        if self.result is None:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self._finish(status, usage)
        return self.result

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 60.0) -> ProcessResult:
        """SIGTERM (SIGKILL after ``timeout``), reap, and return the measurements."""
        if self.result is None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
        return self.reap(timeout)

    def reap(self, timeout: float = 600.0) -> ProcessResult:
        """Wait for the process to end by itself (SIGKILL after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while self._try_reap() is None:
            if time.monotonic() > deadline:
                os.killpg(self.proc.pid, signal.SIGKILL)
                _, status, usage = os.wait4(self.proc.pid, 0)
                self._finish(status, usage)
                break
            time.sleep(0.05)
        assert self.result is not None
        return self.result

    def _finish(self, status: int, usage: resource.struct_rusage) -> None:
        _LIVE.discard(self)
        self._stop.set()
        self._sampler.join()
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self._log.close()
        cpu = usage.ru_utime + usage.ru_stime
        # Not usage.ru_maxrss: Linux starts a forked child's maxrss at its parent's RSS
        # (kept across exec), so it reported the bench's own memory for small children.
        peak = max(self.peak_hwm_kb, self.peak_tree_kb) / 1024
        self.result = ProcessResult(
            self.proc.returncode, time.monotonic() - self.started, cpu, peak
        )


def steady_rate(commit_times: Sequence[float]) -> float:
    """Events per second after the first commit: (n - first batch) / (last - first).

    ``commit_times`` is one commit time (epoch seconds) per event, in any order. The
    events of the first commit are left out, so start-up (process start, group join,
    first fetch) does not count, whatever a system's batch or checkpoint size.
    """
    if len(commit_times) < 2:
        return 0.0
    ordered = sorted(commit_times)
    first, last = ordered[0], ordered[-1]
    if last <= first:
        return 0.0
    after = sum(1 for t in ordered if t > first)
    return after / (last - first)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))
    return ordered[rank]


__all__ = [
    "Measured",
    "ProcessResult",
    "cpu_seconds_of",
    "descendants",
    "kill_all",
    "percentile",
    "rss_kb",
    "steady_rate",
]
