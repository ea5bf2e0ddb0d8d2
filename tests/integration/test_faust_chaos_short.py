"""The short chaos run of `make test` (test_chaos_short.py), on the faust runtime.

Same harness (load.chaos through `ackline chaos`), same minimums and the same checks,
with every worker started as `ackline run --runtime faust`: SIGKILLs (some at armed
injection points), a zombie that must be fenced, a broker restart, a PostgreSQL restart
and writer backends terminated at COMMIT, on a stack of its own. The seed is random and
printed: a failure is reproduced with `ackline chaos --runtime faust --seed N` and the
same options.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ackline.dev import stack
from tests.integration.test_chaos_short import MINIMUM

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_short_chaos_run_on_faust_is_exactly_once() -> None:
    state = Path(tempfile.mkdtemp(prefix="ackline-chaos-faust-", dir="/tmp"))
    state.chmod(0o755)  # PostgreSQL runs as an unprivileged user when we are root
    seed = random.SystemRandom().randrange(1, 1 << 31)
    argv = [sys.executable, "-m", "ackline", "chaos", "--runtime", "faust", "--seed", str(seed)]
    argv += ["--events", "100000", "--workers", "3", "--partitions", "12"]
    argv += ["--batch-max-events", "500", "--state-dir", str(state)]
    for name, value in MINIMUM.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACKLINE_")}
    try:
        proc = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=560, check=False
        )
    finally:
        stack.down(state)  # normally stopped by the run itself; not if it was killed
        shutil.rmtree(state, ignore_errors=True)
    output = proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines, output
    verdict = json.loads(lines[-1])
    assert verdict["runtime"] == "faust", output
    assert proc.returncode == 0 and verdict["ok"] is True, output
    assert verdict["seed"] == seed and verdict["events"] >= 100_000
    assert verdict["lost"] == 0 and verdict["duplicated"] == 0, output
    assert verdict["conflicts_quarantined"] == verdict["conflicts_expected"] > 0
    assert verdict["rejected"] == verdict["rejects_expected"] > 0
    assert verdict["fenced_batches"] >= 1 and verdict["max_kafka_ahead_of_db"] == 0
    for name, value in MINIMUM.items():
        assert verdict[name] >= value, output
