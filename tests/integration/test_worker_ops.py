"""A worker as an operator starts it (issue 18): /metrics, /healthz and /readyz served
by default on the documented port, one start-up line saying what it is and where, and
librdkafka's own lines through the log setup, de-duplicated."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from ackline.settings import DEFAULT_METRICS_PORT
from tests.integration.harness import Services, wait_until


def _env(services: Services, dsn: str, topic: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACKLINE_")}
    env.update(
        {
            "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
            "ACKLINE_DATABASE_URL": dsn,
            "ACKLINE_TOPIC": topic,
            "ACKLINE_GROUP_ID": f"g-{topic}",
            "ACKLINE_DLQ_TOPIC": f"{topic}.dlq",
            "ACKLINE_WORKER_ID": "w-start",
            "ACKLINE_LOG_FORMAT": "json",
            **extra,
        }
    )
    return env


def _lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for raw in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(raw))
        except ValueError:
            out.append({"raw": raw})
    return out


def _start_line(path: Path) -> dict[str, Any] | None:
    for line in _lines(path):
        if str(line.get("msg", "")).startswith("worker w-start starting"):
            return line
    return None


def _spawn(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "ackline", "run"],
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def test_metrics_by_default_and_one_start_line(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    host_port = dsn.rpartition("@")[2].partition("/")[0]
    database = dsn.rpartition("/")[2]
    # the worker's own DSN carries a password (the local stack trusts the role, so it is
    # accepted and ignored): it must not reach the log
    ingest = f"postgresql://ackline_ingest:s3cret-pw@{host_port}/{database}"
    env = _env(services, dsn, topic, ACKLINE_DATABASE_INGEST_URL=ingest)
    assert "ACKLINE_METRICS_PORT" not in env
    log = tmp_path / "worker.log"
    proc = _spawn(env, log)
    try:
        wait_until(lambda: _start_line(log) is not None, 60, "the start-up line")
        line = _start_line(log)
        assert line is not None
        assert line["worker_id"] == "w-start" and line["group_id"] == f"g-{topic}"
        assert line["topics"] == [topic] and line["runtime"] == "confluent"
        assert line["database"] == f"{host_port}/{database}"
        address = str(line["metrics"])
        assert address.startswith("http://127.0.0.1:") and address.endswith("/metrics")
        moved = any("metrics port" in str(x.get("msg", "")) for x in _lines(log))
        assert moved or address == f"http://127.0.0.1:{DEFAULT_METRICS_PORT}/metrics"
        with urllib.request.urlopen(address, timeout=5) as resp:
            assert resp.status == 200 and b"ackline_ingested_rows_total" in resp.read()
        health = address.replace("/metrics", "/healthz")
        with urllib.request.urlopen(health, timeout=5) as resp:
            assert resp.status == 200
    finally:
        proc.terminate()
        status = proc.wait(60)
    text = log.read_text(errors="replace")
    assert "s3cret-pw" not in text
    starts = [x for x in _lines(log) if "starting:" in str(x.get("msg", ""))]
    assert len(starts) == 1
    assert status == 0, text[-2000:]


def test_metrics_port_zero_turns_the_endpoints_off(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    proc = _spawn(_env(services, dsn, topic, ACKLINE_METRICS_PORT="0"), log)
    try:
        wait_until(lambda: _start_line(log) is not None, 60, "the start-up line")
        line = _start_line(log)
        assert line is not None and line["metrics"] == "off (ACKLINE_METRICS_PORT=0)"
    finally:
        proc.terminate()
        assert proc.wait(60) == 0, log.read_text(errors="replace")[-2000:]


def test_librdkafka_lines_go_through_the_log_setup_once(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Kafka down: the worker ends with one error line; librdkafka's connect failures
    (many per second) show as log lines of ackline.kafka, each shape once, never as raw
    ``%3|...|FAIL|`` lines on stderr."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    env = _env(
        services,
        dsn,
        topic,
        ACKLINE_KAFKA_BOOTSTRAP=f"127.0.0.1:{closed}",
        ACKLINE_METRICS_PORT="0",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "ackline", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    stderr = proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in stderr, stderr[-3000:]
    raw = [line for line in stderr.splitlines() if line.startswith("%")]
    assert raw == [], raw[:5]
    bridged = [
        json.loads(line)
        for line in stderr.splitlines()
        if line.startswith("{") and '"ackline.kafka"' in line
    ]
    assert bridged, stderr[-3000:]
    messages = [b["msg"] for b in bridged]
    shapes = {"".join("#" if c.isdigit() else c for c in m) for m in messages}
    assert len(shapes) == len(messages), messages
    assert stderr.splitlines()[-1].startswith("ackline: error: "), stderr[-1000:]
