"""Readiness rules, the HTTP endpoints on a real loopback socket, and JSON log lines."""

from __future__ import annotations

import io
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from ackline.core.errors import SettingsError
from ackline.core.logs import (
    BATCH_LOGGER,
    JsonFormatter,
    configure_logging,
    resolve_format,
)
from ackline.core.metrics import Metrics
from ackline.runtime.health import ReadyLimits, Snapshot, readiness, snapshot
from ackline.runtime.httpserver import StatusServer
from ackline.sinks.ingest.batch import Batch, PartitionRange
from ackline.sinks.ingest.writer import WriteResult
from ackline.streams.committed import batch_fields, log_committed

LIMITS = ReadyLimits(max_commit_age_s=60, db_check_interval_s=5)
NOW = 1_000_000.0


def snap(**changes: Any) -> Snapshot:
    base: dict[str, Any] = {
        "assigned": 3,
        "lag": 0.0,
        "last_commit": NOW - 10,
        "started": NOW - 100,
        "db_up": True,
        "db_checked": NOW - 1,
    }
    base.update(changes)
    return Snapshot(**base)


def test_ready_when_assigned_db_up_and_caught_up() -> None:
    assert readiness(snap(), NOW, LIMITS) == []


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"assigned": 0}, "no partitions assigned"),
        ({"db_checked": 0.0}, "not checked yet"),
        ({"db_up": False}, "unreachable"),
        ({"db_checked": NOW - 16}, "last checked 16s ago"),
        ({"lag": 5.0, "last_commit": NOW - 61}, "no commit for 61s"),
        ({"lag": 5.0, "last_commit": 0.0, "started": NOW - 61}, "no commit for 61s"),
        # an operator found a worker on a deleted topic ready (librdkafka kept its
        # assignment): nothing to ingest is not ready
        ({"topic_missing": True}, "no such topic now (deleted?)"),
    ],
)
def test_not_ready_reasons(changes: dict[str, Any], reason: str) -> None:
    reasons = readiness(snap(**changes), NOW, LIMITS)
    assert len(reasons) == 1
    assert reason in reasons[0]


def test_a_worker_waiting_to_join_says_so_alone() -> None:
    """During the start-up wait for PostgreSQL the other reasons are its consequences (no
    partitions: it stays out of the group on purpose; no check yet: the wait is one)."""
    reasons = readiness(snap(assigned=0, db_checked=0.0, waiting_to_join=True), NOW, LIMITS)
    assert reasons == [
        "starting: waiting for PostgreSQL before joining the consumer group (the worker's "
        "WARNING lines say why it waits)"
    ]
    m = Metrics()
    m.waiting_to_join.set(1)
    assert snapshot(m, NOW).waiting_to_join


def test_an_old_commit_is_fine_without_lag_and_a_fresh_worker_gets_a_grace_period() -> None:
    assert readiness(snap(lag=0.0, last_commit=NOW - 10_000), NOW, LIMITS) == []
    assert readiness(snap(lag=9.0, last_commit=0.0, started=NOW - 5), NOW, LIMITS) == []


def test_snapshot_reads_the_runtime_gauges() -> None:
    m = Metrics()
    m.assigned.set(2)
    m.lag.labels("t", "0").set(4)
    m.lag.labels("t", "1").set(6)
    m.last_commit.set(123.0)
    m.db_up.set(1)
    m.db_checked.set(456.0)
    s = snapshot(m, started=7.0)
    assert s == Snapshot(2, 10.0, 123.0, 7.0, True, 456.0)


@pytest.fixture
def served() -> Iterator[tuple[Metrics, StatusServer]]:
    metrics = Metrics()
    server = StatusServer(metrics, LIMITS, started=time.time())
    server.start("127.0.0.1", 0)
    try:
        yield metrics, server
    finally:
        server.close()


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def test_endpoints_over_http(served: tuple[Metrics, StatusServer]) -> None:
    metrics, server = served
    status, body = _get(server.port, "/healthz")
    assert status == 200
    status, body = _get(server.port, "/readyz")
    assert status == 503
    reasons = json.loads(body)["reasons"]
    assert "no partitions assigned" in reasons
    assert "PostgreSQL not checked yet" in reasons
    metrics.assigned.set(1)
    metrics.db_up.set(1)
    metrics.db_checked.set(time.time())
    status, body = _get(server.port, "/readyz")
    assert status == 200, body
    assert json.loads(body)["ready"] is True
    metrics.ingested.inc(5)
    status, body = _get(server.port, "/metrics")
    assert status == 200
    assert b"ackline_ingested_rows_total 5.0" in body
    assert _get(server.port, "/nope")[0] == 404


def _result() -> tuple[Batch, WriteResult]:
    batch = Batch(ranges=(PartitionRange("t", 0, 10, 15, 3), PartitionRange("t", 2, 7, 8, 1)))
    result = WriteResult(
        batch_id=42,
        events=6,
        inserted=4,
        duplicates={"ledger": 1, "primary_key": 0},
        conflicts={"ledger": 0, "primary_key": 1},
        rejects={},
    )
    return batch, result


def test_batch_fields_carry_id_ranges_and_counts() -> None:
    batch, result = _result()
    fields = batch_fields(batch, result, 0.0123456)
    assert fields["batch_id"] == 42
    assert fields["ranges"][0] == {
        "topic": "t",
        "partition": 0,
        "first_offset": 10,
        "next_offset": 15,
        "epoch": 3,
    }
    assert (fields["events"], fields["inserted"], fields["seconds"]) == (6, 4, 0.0123)
    assert fields["conflicts"] == {"ledger": 0, "primary_key": 1}


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    batches_level = logging.getLogger(BATCH_LOGGER).level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    logging.getLogger(BATCH_LOGGER).setLevel(batches_level)


def test_json_mode_logs_one_structured_line_per_batch(restore_logging: None) -> None:
    out = io.StringIO()
    assert configure_logging("json", stream=out) == "json"
    batch, result = _result()
    log_committed(batch, result, 0.5)
    logging.getLogger("ackline.x").warning("plain %s", "message")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert first["level"] == "info"
    assert first["logger"] == BATCH_LOGGER
    assert first["batch_id"] == 42
    assert first["ranges"][1]["partition"] == 2
    assert first["msg"] == "batch 42 committed: t[0]@10..14, t[2]@7..7"
    assert lines[1]["msg"] == "plain message"


def test_text_mode_keeps_batch_lines_for_verbose(restore_logging: None) -> None:
    out = io.StringIO()
    assert configure_logging("text", stream=out) == "text"
    batch, result = _result()
    log_committed(batch, result, 0.5)
    assert out.getvalue() == ""
    configure_logging("text", verbose=True, stream=out)
    log_committed(batch, result, 0.5)
    assert "batch 42 committed" in out.getvalue()


def test_auto_is_text_on_a_terminal_and_json_elsewhere() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert resolve_format("auto", Tty()) == "text"
    assert resolve_format("auto", io.StringIO()) == "json"
    assert resolve_format("text", io.StringIO()) == "text"


def test_json_formatter_keeps_exceptions() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, "f", 1, "failed", None, exc_info=sys.exc_info()
        )
    line = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in line["exc"]


def test_a_port_in_use_is_a_settings_error(served: tuple[Metrics, StatusServer]) -> None:
    _, server = served
    other = StatusServer(Metrics(), LIMITS, started=time.time())
    with pytest.raises(SettingsError, match="ACKLINE_METRICS_PORT"):
        other.start("127.0.0.1", server.port)


def test_a_worker_idle_past_the_bound_is_ready_when_records_come() -> None:
    """A worker caught up and idle for longer than ready_max_commit_age_s (nothing to
    commit) was not ready the moment new records made it behind: 'lag 2127 but no commit
    for 63s' on the first look. The bound counts from when its lag reports first saw it
    behind; a stall is still seen on the first look, however long nothing asked."""
    m = Metrics()
    m.assigned.set(2)
    m.lag.labels("t", "0").set(0)
    m.note_behind(NOW - 30)
    assert snapshot(m, started=NOW - 10_000).behind_since == 0.0
    m.lag.labels("t", "0").set(2127)
    m.note_behind(NOW - 5)
    m.note_behind(NOW)  # still behind: the clock runs from the first report that saw it
    assert snapshot(m, started=NOW - 10_000).behind_since == NOW - 5
    idle = {"lag": 2127.0, "last_commit": NOW - 10_000, "behind_since": NOW - 5}
    assert readiness(snap(**idle), NOW, LIMITS) == []
    stalled = {**idle, "behind_since": NOW - 3_600}
    assert "no commit for 100s" in readiness(snap(**stalled), NOW, LIMITS)[0]  # from start
    m.assigned.set(0)  # out of the group: its lag gauges go; the clock stays
    m.lag.remove("t", "0")
    m.note_behind(NOW + 1)
    assert snapshot(m, started=NOW - 10_000).behind_since == NOW - 5
    m.assigned.set(2)
    m.lag.labels("t", "0").set(0)
    m.note_behind(NOW + 2)  # caught up while owning partitions: stopped
    assert snapshot(m, started=NOW - 10_000).behind_since == 0.0


def test_a_worker_out_of_the_group_says_why() -> None:
    """A worker that left the group because PostgreSQL does not answer it said only 'no
    partitions assigned' on /readyz: the operator had to find the ERROR line."""
    m = Metrics()
    m.db_up.set(1)
    m.db_checked.set(NOW)
    m.out_of_group.set(1)
    reasons = readiness(snapshot(m, started=NOW - 100), NOW, LIMITS)
    assert reasons and "left the consumer group" in reasons[0]
    assert "ACKLINE_DB_LEAVE_AFTER_S" in reasons[0]
