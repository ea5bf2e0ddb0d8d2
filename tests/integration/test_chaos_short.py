"""A short chaos run in `make test`, once per runtime: the `make chaos` harness
(ackline.load.chaos.harness), scaled down.

100,000 events with the full fault mix, 3 workers on 12 partitions (on the default runtime
workers 0 and 2 write over one PostgreSQL connection, worker 1 over two), at least 10 SIGKILLs
(some at armed injection points), a zombie that must be fenced, a broker restart, a
PostgreSQL restart and writer backends terminated at COMMIT, and the `runs` processor
beside them killed twice (its rows recomputed from activity at the end), on a stack of its own (a
temporary state directory, never the shared one). The seed is random and printed: a
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
from pathlib import Path

import pytest

from ackline.dev import stack

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MINIMUM = {
    "kills": 10,
    "stops": 1,
    "broker_restarts": 1,
    "pg_restarts": 1,
    "commit_faults": 3,
    "processor_kills": 2,
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_short_chaos_run_is_exactly_once(runtime: str) -> None:
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
    # Its own process group: on a timeout the harness *and* its workers are killed (a
    # killed harness alone left its workers running against a stopped stack).
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=560)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"chaos run (seed {seed}) did not finish in 560 s:\n{stdout[-5000:]}")
    finally:
        stack.down(state)  # normally stopped by the run itself; not if it was killed
        shutil.rmtree(state, ignore_errors=True)
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
