"""The short chaos runs of `make test` (tests/integration/test_chaos_short.py), judged by
their own tests; in one process (``TEST_WORKERS=0``) started in the background when the
session starts and judged by its last tests.

Each run produces at a fixed rate for ~100 s on a stack of its own (~140 s a run); started
with the first integration test, they overlap the rest of the suite instead of adding their
wall time to it. They run at a lower CPU priority, so that the tests with short timeouts
running beside them lose as little as can be of the cores they would have alone: nice 10
for the harness and everything it starts, and the same for each of their sessions (the
harness's, each broker's and each database's: with the kernel's autogroups a session
competes as one group whatever its nice value, ackline.dev._proc.nice_session). Disk I/O
is still shared. The chaos runs' outcome does not depend on timing, only their fault
counts, which the schedule ties to ingest progress. Their stacks' ports are chosen below
the kernel's ephemeral range (ackline.dev.ports): chosen inside it, one run's broker once
failed to bind its port while the suite's own connections churned. Under pytest-xdist
they start when their tests do (each xdist worker collects every test, and only one of
them runs the chaos group).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ackline.dev import _proc, stack

ROOT = Path(__file__).resolve().parents[2]
MODULE = "test_chaos_short"
RUNTIMES = ("confluent", "faust")
MINIMUM = {
    "kills": 10,
    "stops": 1,
    "broker_restarts": 1,
    "pg_restarts": 1,
    "commit_faults": 3,
    "processor_kills": 2,
}
NICE = 10  # a nice-10 group gets about a tenth of a core that a nice-0 one also wants
# a run that has not ended this long after its start has hung: ~450 s on a loaded 2-core
# host (the run then took 560 s and more while other work shared the cores: a fresh run)
RUN_LIMIT_S = 720.0


@dataclass
class Run:
    """One runtime's chaos run, started in the background."""

    proc: subprocess.Popen[bytes]
    state: Path
    seed: int
    stdout: Path
    stderr: Path
    started: float  # time.monotonic()

    def left_s(self) -> float:
        """How much longer the run may take before it counts as hung."""
        return max(0.0, self.started + RUN_LIMIT_S - time.monotonic())


def is_chaos_short(item: pytest.Item) -> bool:
    return bool(item.module.__name__.rsplit(".", 1)[-1] == MODULE)  # type: ignore[attr-defined]


def selected_runtimes(items: list[pytest.Item]) -> set[str]:
    """The runtimes whose chaos test this session runs."""
    return {
        item.callspec.params["runtime"]
        for item in items
        if is_chaos_short(item) and hasattr(item, "callspec")
    }


def _start(runtime: str, logs: Path) -> Run:
    state = Path(tempfile.mkdtemp(prefix=f"ackline-chaos-{runtime}-", dir="/tmp"))
    state.chmod(0o755)  # PostgreSQL runs as an unprivileged user when we are root
    seed = random.SystemRandom().randrange(1, 1 << 31)
    argv = ["nice", "-n", str(NICE), sys.executable, "-m", "ackline", "chaos"]
    argv += ["--runtime", runtime, "--seed", str(seed)]
    argv += ["--events", "100000", "--workers", "3", "--partitions", "12"]
    # production spread over the faults on any machine: unthrottled, the faust runtime once
    # drained everything before the harness reached its COMMIT faults (0 of 3 done); at
    # 1,500/s (67 s) the schedule's stalls and restarts (~70 s) outlasted it once workers
    # kept up with production (group commit), and the last COMMIT faults found no work
    argv += ["--batch-max-events", "500", "--produce-rate", "1000", "--state-dir", str(state)]
    if runtime == "confluent":  # one group of workers writing over one and two connections
        argv += ["--writer-connections", "1,2"]
    for name, value in MINIMUM.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACKLINE_")}
    # a crash of the interpreter (a signal such as SIGSEGV) leaves its Python stack in
    # stderr: CI once saw a run end with neither a verdict nor a word
    env["PYTHONFAULTHANDLER"] = "1"
    out, err = logs / f"{runtime}.out", logs / f"{runtime}.err"
    # Its own process group: on a timeout the harness *and* its workers are killed (a
    # killed harness alone left its workers running against a stopped stack). Output to
    # files, not pipes: the run not being read yet must never block on a full pipe.
    # `nice` execs the harness, so the pid is the harness's.
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=stdout, stderr=stderr, start_new_session=True
        )
    _proc.nice_session(proc.pid, NICE)  # the harness's session; its stacks do the same
    return Run(proc, state, seed, out, err, time.monotonic())


def end(run: Run) -> None:
    """Kill the run if it still runs; stop its stack and remove its state (idempotent)."""
    if run.proc.poll() is None:
        os.killpg(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
    try:
        stack.down(run.state)  # normally stopped by the run itself; not if it was killed
    finally:
        shutil.rmtree(run.state, ignore_errors=True)


@pytest.fixture(scope="session")
def chaos_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Run | Exception]]:
    """The selected runtimes' runs at once, each on a stack of its own (side by side they
    take the wall time of one: the two cores are far from busy at 1,000 events/s each).
    A run that could not start is its error, for its own test to fail with: a failing
    session fixture would fail every integration test."""
    logs = tmp_path_factory.mktemp("chaos-short")
    started: dict[str, Run | Exception] = {}
    try:
        for runtime in sorted(selected_runtimes(request.session.items)):
            try:
                started[runtime] = _start(runtime, logs)
            except Exception as exc:  # reported by the run's test
                started[runtime] = exc
        yield started
    finally:
        for run in started.values():
            if isinstance(run, Run):
                with contextlib.suppress(Exception):  # every run is ended
                    end(run)


@pytest.fixture(scope="session", autouse=True)
def _chaos_runs_start_with_the_session(request: pytest.FixtureRequest) -> None:
    """Start the short chaos runs with the first integration test (not under xdist)."""
    if "PYTEST_XDIST_WORKER" not in os.environ and selected_runtimes(request.session.items):
        request.getfixturevalue("chaos_runs")
