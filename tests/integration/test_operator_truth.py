"""The operator commands tell the truth (issue 18, "Telling the truth"):

* `verify` judges its own manifest's events, whatever else the topic holds;
* `status` computes lag as /metrics does (transaction markers are not lag) and marks an
  owner that is no longer in the consumer group;
* `config show` shows the local stack's endpoints when they are the ones in use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ackline.load.produce import Knobs
from tests.integration.harness import Services, Worker, wait_until
from tests.integration.windows import produce_mix, verify_ok, wait_drained

ROOT = Path(__file__).resolve().parents[2]
CLEAN = Knobs(
    redeliver=0.02, retry=0.02, conflict_ledger=0.0, conflict_pk=0.0, poison=0.0, abort=0.05
)


def ackline_json(*argv: str, env: dict[str, str]) -> Any:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ACKLINE_")}
    full.update(env)
    proc = subprocess.run(
        [sys.executable, "-m", "ackline", *argv],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_verify_judges_only_its_own_manifest(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Two produce runs into one topic, one group ingests both: each manifest verifies
    exact on its own, and the other run's rows are reported, not counted against it."""
    first = produce_mix(services, topic, tmp_path / "a", 1500, seed=11, knobs=CLEAN)
    second = produce_mix(services, topic, tmp_path / "b", 1500, seed=12, knobs=CLEAN)
    group = f"g-{topic}"
    worker = Worker(services, dsn, topic, tmp_path, batch_max_events=300)
    wait_drained(dsn, second, group, [worker])
    wait_drained(dsn, first, group, [worker])
    for manifest in (first, second):
        verdict = verify_ok(dsn, manifest, group)
        assert verdict.beyond_rows >= 1500, verdict.to_json()
    worker.stop()


def _status(services: Services, dsn: str, topic: str) -> dict[str, Any]:
    env = {
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": dsn,
        "ACKLINE_TOPIC": topic,
        "ACKLINE_GROUP_ID": f"g-{topic}",
    }
    result: dict[str, Any] = ackline_json("status", "--json", env=env)
    return result


def test_status_lag_skips_markers_and_marks_owners_not_in_the_group(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    manifest = produce_mix(services, topic, tmp_path, 600, seed=5, knobs=CLEAN)
    worker = Worker(services, dsn, topic, tmp_path, name="w-live")
    wait_drained(dsn, manifest, f"g-{topic}", [worker])

    def live_and_settled() -> bool:
        shown = _status(services, dsn, topic)
        parts = shown["partitions"]
        return shown["total_lag"] == 0 and all(
            p["owner"] == "w-live" and p["owner_live"] and p["assigned"] == "w-live" for p in parts
        )

    # drained: every partition ends with a commit marker, which is not lag
    wait_until(live_and_settled, 60, "status: lag 0 and the live owner")
    assert worker.stop() == 0
    shown = _status(services, dsn, topic)
    assert shown["total_lag"] == 0
    for p in shown["partitions"]:
        assert p["owner"] == "w-live" and p["owner_live"] is False and p["assigned"] is None


def test_config_show_names_the_dev_stack_in_use(services: Services) -> None:
    shown = ackline_json(
        "config", "show", "--json", env={"ACKLINE_STATE_DIR": str(services.state_dir)}
    )
    assert shown["kafka_bootstrap"]["value"] == services.bootstrap
    assert shown["kafka_bootstrap"]["source"].startswith("dev stack")
    url = shown["database_url"]["value"]
    assert url.rpartition("@")[2] == services.database_url.rpartition("@")[2]
    assert shown["database_url"]["source"].startswith("dev stack")
