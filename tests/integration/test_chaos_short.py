"""A short chaos run in `make test`, once per runtime: the `make chaos` harness
(ackline.load.chaos.harness), scaled down.

100,000 events with the full fault mix, 3 workers on 12 partitions (on the default runtime
workers 0 and 2 write over one PostgreSQL connection, worker 1 over two), at least 10 SIGKILLs
(some at armed injection points), a zombie that must be fenced, a broker restart, a
PostgreSQL restart and writer backends terminated at COMMIT, and the `runs` processor
beside them killed twice (its rows recomputed from activity at the end), on a stack of its own (a
temporary state directory, never the shared one). The two runtimes' runs go side by side,
each on its own stack, started in the background with the session and judged at its end
(tests/integration/chaos_runs.py says why). The seed is random and printed: a failure is
reproduced with `ackline chaos --runtime R --seed N` and the same options.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess

import pytest

from tests.integration.chaos_runs import MINIMUM, RUN_LIMIT_S, RUNTIMES, Run, end

pytestmark = pytest.mark.integration


@pytest.mark.timeout(800)  # past RUN_LIMIT_S: the test says why a run hung
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_short_chaos_run_is_exactly_once(
    runtime: str, chaos_runs: dict[str, Run | Exception]
) -> None:
    run = chaos_runs[runtime]
    if not isinstance(run, Run):
        pytest.fail(f"the {runtime} chaos run did not start: {run!r}")
    seed = run.seed
    try:
        run.proc.wait(timeout=run.left_s())
    except subprocess.TimeoutExpired:
        # SIGABRT first: the harness's faulthandler writes where each thread is to stderr
        os.kill(run.proc.pid, signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.proc.wait(timeout=2)
        with contextlib.suppress(ProcessLookupError):  # the group may be gone with it
            os.killpg(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
        tail = run.stdout.read_text(errors="replace")[-4000:]
        err = run.stderr.read_text(errors="replace")[-6000:]
        pytest.fail(
            f"chaos run (seed {seed}) did not finish in {RUN_LIMIT_S:g} s:\n{tail}\n"
            f"--- stderr:\n{err}"
        )
    finally:
        end(run)
    proc = run.proc
    stdout = run.stdout.read_text(errors="replace")
    stderr = run.stderr.read_text(errors="replace")
    output = stdout + stderr[-3000:]
    lines = stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("{"):
        # ended before its verdict: how it ended is all there is to go on (CI's stack is gone)
        pytest.fail(
            f"chaos run (seed {seed}) exited {_status(proc.returncode)} without a verdict"
            f"\n--- stdout:\n{stdout[-4000:]}\n"
            f"--- stderr:\n{stderr[-6000:]}"
        )
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


def _status(code: int) -> str:
    """An exit status as a reader wants it: a signal named (Popen gives -N for it)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:  # a real-time signal has no name
            return f"killed by signal {-code}"
    return f"with status {code}"
