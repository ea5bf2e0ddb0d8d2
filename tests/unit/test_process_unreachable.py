"""`ackline process` with PostgreSQL unreachable says so and stops, as `tail` and
`dispatch` do: an operator's probe found `process runs --until-caught-up` retrying for
ever, ACKLINE_RETRY_MAX_SECONDS or not, with WARNING lines naming neither a setting nor
a fix. Nothing listens on the port (127.0.0.1 only); no service is started."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ackline.dev.ports import pick_free_port


@pytest.mark.parametrize("mode", [["--until-caught-up"], []])
def test_process_stops_with_one_line_when_postgresql_is_not_there(mode: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("ACKLINE_")}
    env.update(
        ACKLINE_DATABASE_URL=f"postgresql://op@127.0.0.1:{pick_free_port()}/ackline",
        ACKLINE_METRICS_PORT="0",
        ACKLINE_RETRY_MAX_SECONDS="5",
    )
    done = subprocess.run(
        [sys.executable, "-m", "ackline", "process", "runs", *mode],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "cannot connect to PostgreSQL at 127.0.0.1" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
