"""The worker processes of a chaos run: start, SIGKILL, SIGSTOP/SIGCONT, reap, scrape.

Each slot runs one `ackline run` process at a time; each process is an *incarnation*
with its own worker id (``w<slot>-<n>``), log file and metrics port, so its logs and
``/metrics`` can be read after the fact. The pool never sleeps to synchronize: callers
poll conditions (a log line, a metric, a DB row).
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ackline.dev.ports import pick_free_port

FENCED_LINE = "fenced and rolled back"
FENCED_METRIC = "ackline_fenced_batches_total"
STOP_MARGIN_S = 15.0
REAP_WAIT_S = 30.0
"""How long the pool waits for a SIGKILLed worker to be gone."""


def proc_state(pid: int) -> str:
    """The kernel's ``State`` of ``pid`` and where it sleeps (``wchan``), for a message."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip() or "-"
    except OSError as exc:
        return f"/proc unreadable: {exc}"
    state = next(
        (ln.split(":", 1)[1].strip() for ln in status.splitlines() if ln.startswith("State:")), "?"
    )
    return f"state {state}, wchan {wchan}"


@dataclass
class Incarnation:
    slot: int
    number: int
    worker_id: str
    arm: str
    log_path: Path
    metrics_port: int
    proc: subprocess.Popen[bytes]
    log_file: IO[bytes]
    fenced_scraped: float = 0.0
    killed: bool = False
    """SIGKILLed by the harness (not by its own armed point)."""
    stopped: bool = False
    """SIGSTOPped now."""
    ended: bool = False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def fenced_lines(self) -> int:
        return self.log().count(FENCED_LINE)

    def fenced(self) -> int:
        """Fenced batches of this incarnation: its last scrape, or its log when higher."""
        return max(int(self.fenced_scraped), self.fenced_lines())

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Ended:
    """A process that ended by itself: an armed kill point, or a crash."""

    incarnation: Incarnation
    returncode: int
    armed_kill: bool


@dataclass
class WorkerPool:
    run_dir: Path
    env: dict[str, str]
    """ACKLINE_* settings shared by every worker (bootstrap, DSN, topic, group, ...)."""
    slots: int
    stop_wait_s: float = 30.0
    """The workers' ACKLINE_SHUTDOWN_WAIT_S: a worker SIGTERMed gets this long (and a
    margin) to finish its batch and leave the group before it is SIGKILLed."""
    incarnations: list[Incarnation] = field(default_factory=list)
    _current: dict[int, Incarnation] = field(default_factory=dict)
    command: tuple[str, ...] = ("run",)
    """The `ackline` subcommand each slot runs (``("process", "runs")`` for processors)."""
    prefix: str = "w"
    """Incarnation ids are ``<prefix><slot>-<n>`` (their ACKLINE_WORKER_ID)."""
    slot_env: dict[int, dict[str, str]] = field(default_factory=dict)
    """Settings of one slot over ``env`` (`make chaos-infra`: each slot's own proxies)."""

    def start(self, slot: int, arm: str = "", stall_seconds: float = 3600.0) -> Incarnation:
        """Start slot's next incarnation, armed with ``arm`` (ACKLINE_FAULTS) if given."""
        number = sum(1 for i in self.incarnations if i.slot == slot) + 1
        worker_id = f"{self.prefix}{slot}-{number}"
        log_path = self.run_dir / "logs" / f"{worker_id}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        port = pick_free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACKLINE_")}
        env.update(self.env)
        env.update(self.slot_env.get(slot, {}))
        env.update(
            {
                "ACKLINE_SHUTDOWN_WAIT_S": str(self.stop_wait_s),
                "ACKLINE_WORKER_ID": worker_id,
                "ACKLINE_METRICS_PORT": str(port),
                "ACKLINE_FAULTS": arm,
                "ACKLINE_FAULT_STALL_SECONDS": str(stall_seconds),
                "ACKLINE_LOG_FORMAT": "json",
            }
        )
        log_file = log_path.open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "ackline", *self.command],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        inc = Incarnation(slot, number, worker_id, arm, log_path, port, proc, log_file)
        self.incarnations.append(inc)
        self._current[slot] = inc
        return inc

    def current(self, slot: int) -> Incarnation | None:
        inc = self._current.get(slot)
        return inc if inc is not None and inc.alive() else None

    def live(self) -> list[Incarnation]:
        return [i for i in self._current.values() if i.alive() and not i.stopped]

    def pick(self, slot: int) -> Incarnation | None:
        """The live, running worker of ``slot``, else of the next slot that has one."""
        for k in range(self.slots):
            inc = self.current((slot + k) % self.slots)
            if inc is not None and not inc.stopped:
                return inc
        return None

    def kill(self, inc: Incarnation) -> None:
        """Scrape its metrics (the fenced count dies with it), then SIGKILL and reap
        (:func:`_sigkill`)."""
        self.scrape(inc)
        _sigkill(inc)
        self._end(inc)

    @property
    def stop_timeout(self) -> float:
        """How long a SIGTERMed worker may take: its shutdown wait plus a margin for
        leaving the group and closing its clients."""
        return self.stop_wait_s + STOP_MARGIN_S

    def terminate(self, inc: Incarnation, timeout: float | None = None) -> int:
        """SIGTERM (SIGCONT first if stopped), wait; SIGKILL if it does not exit within
        ``timeout`` (default :attr:`stop_timeout`)."""
        self.scrape(inc)
        if inc.stopped:
            self.cont(inc)
        if inc.alive():
            inc.proc.terminate()
        try:
            code = inc.proc.wait(self.stop_timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            code = _sigkill(inc)
        self._end(inc)
        return code

    def stop(self, inc: Incarnation) -> None:
        self.scrape(inc)
        inc.proc.send_signal(signal.SIGSTOP)
        inc.stopped = True

    def cont(self, inc: Incarnation) -> None:
        inc.proc.send_signal(signal.SIGCONT)
        inc.stopped = False

    def reap(self) -> list[Ended]:
        """Processes that ended by themselves since the last call (armed kills, crashes)."""
        ended = []
        for inc in list(self._current.values()):
            if inc.ended or inc.alive():
                continue
            code = inc.proc.returncode
            self._end(inc)
            armed = code == -signal.SIGKILL and "fired: kill" in inc.log()
            ended.append(Ended(inc, code, armed))
        return ended

    def _end(self, inc: Incarnation) -> None:
        if not inc.ended:
            inc.ended = True
            inc.log_file.close()

    def scrape(self, inc: Incarnation) -> None:
        """Read the fenced-batch counter from the worker's /metrics (best effort)."""
        if inc.stopped or not inc.alive():
            return
        value = scrape_metric(inc.metrics_port, FENCED_METRIC)
        if value is not None:
            inc.fenced_scraped = max(inc.fenced_scraped, value)

    def scrape_all(self) -> None:
        for inc in self.live():
            self.scrape(inc)

    def shutdown(self, timeout: float | None = None) -> list[int]:
        """SIGTERM every live worker at once (SIGCONT first if stopped), wait for all;
        their exit statuses (SIGKILL after ``timeout``, default :attr:`stop_timeout`).

        Also what a chaos run does when it is itself stopped (SIGTERM, Ctrl-C): no worker
        outlives the harness.
        """
        if timeout is None:
            timeout = self.stop_timeout
        running = [i for i in self._current.values() if not i.ended]
        for inc in running:
            self.scrape(inc)
            if inc.stopped:
                self.cont(inc)
            if inc.alive():
                inc.proc.terminate()
        codes = []
        deadline = time.monotonic() + timeout
        for inc in running:
            try:
                codes.append(inc.proc.wait(max(deadline - time.monotonic(), 1.0)))
            except subprocess.TimeoutExpired:
                codes.append(_sigkill(inc))
            self._end(inc)
        return codes


def _sigkill(inc: Incarnation) -> int:
    """SIGKILL ``inc`` and reap it; its exit status (-SIGKILL when it is not gone yet).

    A process SIGKILLed runs no more code, but one with a thread in uninterruptible sleep
    (a write the host's disk has not finished) is not gone until that ends. Not reaped
    within :data:`REAP_WAIT_S`, the run says so on stderr, with the kernel's state of it,
    and goes on (it stays a zombie until the harness exits; nothing counts it again): this
    wait raised out of the run before, which then ended without its verdict."""
    inc.killed = True
    inc.proc.kill()
    try:
        return inc.proc.wait(REAP_WAIT_S)
    except subprocess.TimeoutExpired:
        print(
            f"chaos: {inc.worker_id} (pid {inc.proc.pid}) not gone {REAP_WAIT_S:g} s after "
            f"SIGKILL ({proc_state(inc.proc.pid)}); going on",
            file=sys.stderr,
            flush=True,
        )
        return -signal.SIGKILL


def production_failed(log: Path, lines: int = 15) -> str:
    """Why a chaos run stops when its producer child failed: the log's path and its last
    ``lines`` lines, for the run's own output is all a CI run keeps (its state directory
    goes with its stack)."""
    try:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        tail = [f"(cannot read it: {exc})"]
    return f"production failed: see {log}; its last lines:\n" + "\n".join(tail)


def scrape_metric(port: int, name: str, timeout: float = 2.0) -> float | None:
    """The sum of a metric's samples on 127.0.0.1:port/metrics, None if unreachable."""
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return metric_total(resp.read().decode(), name)
    # HTTPException: a worker killed between its headers and its body (IncompleteRead)
    # or its port taken by something else (BadStatusLine); neither is an OSError.
    # ValueError: a body that is not UTF-8, or a sample that is not a number.
    except (OSError, urllib.error.URLError, http.client.HTTPException, ValueError):
        return None


def metric_total(text: str, name: str) -> float:
    """The sum of metric ``name``'s samples in a Prometheus text exposition (ValueError
    for a sample that is not a number). Pure."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] == name:
                total += float(value)
    return total


def wait_for(
    condition: Callable[[], bool], timeout: float, tick: Callable[[], None] | None = None
) -> bool:
    """Poll ``condition()`` every 0.2 s (running ``tick()`` between polls) until it holds;
    False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if tick is not None:
            tick()
        time.sleep(0.2)
    return condition()
