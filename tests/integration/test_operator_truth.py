"""The operator commands tell the truth (issue 18, "Telling the truth"):

* `verify` judges its own manifest's events, whatever else the topic holds;
* `status` computes lag as /metrics does (transaction markers are not lag) and marks an
  owner that is no longer in the consumer group;
* `config show` shows the local stack's endpoints when they are the ones in use;
* a transaction held open upstream is not lag: the worker's gauge, /readyz, `status` and
  `doctor` measure against the last stable offset, as a read_committed reader reads.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from ackline.load.produce import Knobs
from ackline.schemas import new_envelope
from ackline.streams.producer import prepare
from tests.integration.harness import Services, Worker, db, wait_until
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


def _readyz(worker: Worker) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{worker.metrics_port}/readyz", timeout=5
        ) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def _lags(worker: Worker, topic: str) -> dict[int, float]:
    """``ackline_partition_lag`` per partition of ``topic``, as /metrics shows it now."""
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found: dict[int, float] = {}
    for line in text.splitlines():
        m = re.match(r"ackline_partition_lag\{(.*)\} (\S+)$", line)
        if m and f'topic="{topic}"' in m.group(1):
            part = re.search(r'partition="(\d+)"', m.group(1))
            assert part is not None, line
            found[int(part.group(1))] = float(m.group(2))
    return found


def _doctor_lag(services: Services, dsn: str, topic: str) -> int:
    """The lag `ackline doctor` reports in its offsets check (its exit status is not this
    test's business: other checks may warn on a test database)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACKLINE_")}
    env.update(
        ACKLINE_KAFKA_BOOTSTRAP=services.bootstrap,
        ACKLINE_DATABASE_URL=dsn,
        ACKLINE_TOPIC=topic,
        ACKLINE_GROUP_ID=f"g-{topic}",
        ACKLINE_DLQ_TOPIC=f"{topic}.dlq",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "ackline", "doctor", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    found = re.search(r"lag (\d+)", checks["offsets"]["detail"])
    assert found is not None, checks["offsets"]
    return int(found.group(1))


def _next_offset(dsn: str, topic: str, partition: int) -> int | None:
    rows = db(
        dsn,
        "SELECT next_offset FROM consumer_offsets WHERE group_id = $1 AND topic = $2 "
        "AND partition = $3",
        f"g-{topic}",
        topic,
        partition,
    )
    return None if not rows or rows[0]["next_offset"] is None else int(rows[0]["next_offset"])


def _tx_producer(services: Services, topic: str) -> Producer:
    """A plain transactional producer, its transactions initialised."""
    producer = Producer(
        {"bootstrap.servers": services.bootstrap, "transactional.id": f"tx-{topic}"}
    )
    producer.init_transactions(30)
    return producer


def _send_step(producer: Producer, topic: str, i: int) -> None:
    """Step ``i`` of one agent run, to partition 0 of ``topic``."""
    env = new_envelope(
        "agent.step",
        txn_id=f"run-open:{i}",
        agent_id="agent-open",
        request_id="open",
        payload={"run_id": "run-open", "step": i, "thought": "plan"},
        occurred_at=datetime(2026, 11, 1, 12, 0, tzinfo=UTC),
    )
    out = prepare(env)
    producer.produce(topic, out.value, out.key, partition=0, headers=list(out.headers))


@pytest.mark.parametrize("tail", ["commit", "abort"])
@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_an_idle_transactional_partition_read_to_its_end_is_not_lag(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str, tail: str
) -> None:
    """A transactional producer commits offsets 0-2 (its commit marker at 3) and, for
    ``abort``, aborts two more records (4-5, the abort marker at 6); then nothing more.
    Once the worker has written 0-2 it is caught up: the markers and aborted records are
    nothing a read_committed reader is given. Its lag gauge, `status` and `doctor` say 0,
    and /readyz stays 200 past its commit-age bound. (The faust runtime counted from the
    DB offset to the last stable offset: lag 1, or 4, for ever, and /readyz 503 once the
    last commit was older than the bound.)"""
    producer = _tx_producer(services, topic)
    producer.begin_transaction()
    for i in range(3):
        _send_step(producer, topic, i)
    producer.commit_transaction(30)
    if tail == "abort":
        producer.begin_transaction()
        for i in range(3, 5):
            _send_step(producer, topic, i)
        producer.flush(30)
        producer.abort_transaction(30)
    bound = 3.0
    worker = Worker(services, dsn, topic, tmp_path, runtime=runtime, ready_max_commit_age_s=bound)
    wait_until(lambda: _next_offset(dsn, topic, 0) == 3, 90, "offsets 0-2 ingested")

    def caught_up() -> bool:
        worker.ensure_alive()
        return _lags(worker, topic).get(0) == 0 and _readyz(worker)[0] == 200

    # past the bound and two lag reports (every 5 s)
    wait_until(caught_up, bound + 12, "lag 0 and ready on the idle partition")
    held_until = time.monotonic() + bound + 2
    while time.monotonic() < held_until:
        code, body = _readyz(worker)
        assert code == 200, body
        assert _lags(worker, topic).get(0) == 0
        time.sleep(0.5)
    assert _status(services, dsn, topic)["total_lag"] == 0
    assert _doctor_lag(services, dsn, topic) == 0
    assert worker.stop() == 0, worker.log()[-3000:]


def test_an_open_upstream_transaction_is_not_lag(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """A plain transactional producer sends a record to a drained partition and holds its
    transaction open past the commit-age bound of /readyz: the worker is not behind (no
    read_committed reader can read that record yet), so /readyz stays 200 and its lag
    gauge 0, and `status` and `doctor` say 0 too. Once committed, the record is ingested.
    (The gauge counted up to the high watermark: lag 1 and /readyz 503 after the bound.)"""
    producer = _tx_producer(services, topic)

    def send(i: int) -> None:
        _send_step(producer, topic, i)

    producer.begin_transaction()
    for i in range(3):
        send(i)
    producer.commit_transaction(30)  # offsets 0-2, the commit marker at 3
    bound = 3.0
    worker = Worker(services, dsn, topic, tmp_path, ready_max_commit_age_s=bound)

    def drained() -> bool:
        worker.ensure_alive()
        try:
            ready = _readyz(worker)[0] == 200
            return ready and _next_offset(dsn, topic, 0) == 3 and _lags(worker, topic).get(0) == 0
        except OSError:  # not listening yet
            return False

    wait_until(drained, 90, "the worker to ingest offsets 0-2 and report lag 0, ready")

    producer.begin_transaction()
    send(3)  # offset 4, held open
    producer.flush(30)
    # past the bound, and past two lag reports (every 5 s) and statistics (every 1 s)
    held_until = time.monotonic() + bound + 12
    while time.monotonic() < held_until:
        worker.ensure_alive()
        code, body = _readyz(worker)
        assert code == 200, body
        lags = _lags(worker, topic)
        assert lags.get(0) == 0, lags
        time.sleep(0.5)
    assert _status(services, dsn, topic)["total_lag"] == 0
    assert _doctor_lag(services, dsn, topic) == 0
    code, body = _readyz(worker)
    assert code == 200, body

    producer.commit_transaction(30)
    wait_until(lambda: _next_offset(dsn, topic, 0) == 5, 60, "the committed record ingested")
    wait_until(lambda: _lags(worker, topic).get(0) == 0, 30, "lag 0 again")
    assert _readyz(worker)[0] == 200
    assert worker.stop() == 0, worker.log()[-3000:]
