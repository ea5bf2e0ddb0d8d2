"""A short chaos run in `make test`, once per runtime: the `make chaos` harness
(ackline.load.chaos.harness), scaled down.

100,000 events with the full fault mix, 3 workers on 12 partitions (on the default runtime
workers 0 and 2 write over one PostgreSQL connection, worker 1 over two), at least 10 SIGKILLs
(some at armed injection points), a zombie that must be fenced, a broker restart, a
PostgreSQL restart and writer backends terminated at COMMIT, and the `runs` processor
beside them killed twice (its rows recomputed from activity at the end), on a stack of its own (a
temporary state directory, never the shared one). The two runtimes' runs go side by side,
each on its own stack. The seed is random and printed: a
failure is reproduced with `ackline chaos --runtime R --seed N` and the same options.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ackline.dev import stack

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RUNTIMES = ("confluent", "faust")
MINIMUM = {
    "kills": 10,
    "stops": 1,
    "broker_restarts": 1,
    "pg_restarts": 1,
    "commit_faults": 3,
    "processor_kills": 2,
}


@dataclass
class _Run:
    """One runtime's chaos run, started in the background."""

    proc: subprocess.Popen[bytes]
    state: Path
    seed: int
    stdout: Path
    stderr: Path


def _start(runtime: str, logs: Path) -> _Run:
    state = Path(tempfile.mkdtemp(prefix=f"ackline-chaos-{runtime}-", dir="/tmp"))
    state.chmod(0o755)  # PostgreSQL runs as an unprivileged user when we are root
    seed = random.SystemRandom().randrange(1, 1 << 31)
    argv = [sys.executable, "-m", "ackline", "chaos", "--runtime", runtime, "--seed", str(seed)]
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
    out, err = logs / f"{runtime}.out", logs / f"{runtime}.err"
    # Its own process group: on a timeout the harness *and* its workers are killed (a
    # killed harness alone left its workers running against a stopped stack). Output to
    # files, not pipes: the run not being read yet must never block on a full pipe.
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=stdout, stderr=stderr, start_new_session=True
        )
    return _Run(proc, state, seed, out, err)


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, _Run]]:
    """The selected runtimes' runs at once, each on a stack of its own: they produce at a
    fixed rate for ~100 s, so side by side they take the wall time of one (the two cores
    are far from busy at 1,000 events/s each)."""
    selected = {
        item.callspec.params["runtime"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    }
    logs = tmp_path_factory.mktemp("chaos-short")
    started: dict[str, _Run] = {}
    try:
        for runtime in sorted(selected):
            started[runtime] = _start(runtime, logs)
        yield started
    finally:
        for run in started.values():
            if run.proc.poll() is None:
                os.killpg(run.proc.pid, signal.SIGKILL)
                run.proc.wait()
            stack.down(run.state)  # normally stopped by the run itself; not if it was killed
            shutil.rmtree(run.state, ignore_errors=True)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_short_chaos_run_is_exactly_once(runtime: str, runs: dict[str, _Run]) -> None:
    run = runs[runtime]
    seed = run.seed
    try:
        run.proc.wait(timeout=560)
    except subprocess.TimeoutExpired:
        os.killpg(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
        tail = run.stdout.read_text(errors="replace")[-5000:]
        pytest.fail(f"chaos run (seed {seed}) did not finish in 560 s:\n{tail}")
    finally:
        stack.down(run.state)
        shutil.rmtree(run.state, ignore_errors=True)
    proc = run.proc
    stdout = run.stdout.read_text(errors="replace")
    stderr = run.stderr.read_text(errors="replace")
    output = stdout + stderr[-3000:]
    lines = stdout.strip().splitlines()
    assert lines, output
    verdict = json.loads(lines[-1])
    assert verdict["runtime"] == runtime, output
    assert proc.returncode == 0 and verdict["ok"] is True, output
    assert verdict["seed"] == seed and verdict["events"] >= 100_000
    assert verdict["lost"] == 0 and verdict["duplicated"] == 0, output
    assert verdict["conflicts_quarantined"] == verdict["conflicts_expected"] > 0
    assert verdict["rejected"] == verdict["rejects_expected"] > 0
    assert verdict["fenced_batches"] >= 1 and verdict["max_kafka_ahead_of_db"] == 0
    for name, value in MINIMUM.items():
        assert verdict[name] >= value, output
    assert verdict["runs_mismatch"] == 0 and verdict["runs"] > 0, output
