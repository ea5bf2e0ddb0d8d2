"""A stop while the command's modules import (before its own handlers) ends it with 143
and nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def test_a_sigterm_while_the_command_starts_exits_143_and_says_nothing() -> None:
    """An operator's probe: SIGTERM 45-90 ms into `ackline status` ended it with a
    traceback and exit 1 (7 tries of 30: the handler imported a module in the middle of
    the start's own imports, and met it half made) or, once, was dropped and the command
    ran to its end. Every try here ends as a stop: 143, or the interpreter's own death by
    the signal when it lands before ackline's first line runs; never a traceback, never
    a finished command."""
    env = {**os.environ, "ACKLINE_CONFIG_FILE": "", "PYTHONDONTWRITEBYTECODE": "1"}
    seen = []
    for i in range(30):
        proc = subprocess.Popen(
            [sys.executable, "-m", "ackline", "config", "show"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        time.sleep(0.04 + (i % 10) * 0.012)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        seen.append((i, proc.returncode, err.decode(errors="replace")[-400:], len(out)))
    bad = [s for s in seen if s[1] not in (143, -signal.SIGTERM) or s[2] or s[3]]
    assert not bad, bad
