"""The Java producer of examples/java-producer, against the real broker and a real worker.

It writes envelopes in transactions with the reference Kafka client (not librdkafka), then
resends one request's records, the same bytes, from a new instance. What it wrote must
pass a standard validator of the exported JSON Schema, and ackline must store each event
once and count every resent record as a duplicate. A commit that really times out (the
broker frozen) must end the instance without an abort, and a resend be ingested once.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from ackline.dev.kafka import ensure_jars
from ackline.schemas.decode import Row, decode
from ackline.streams.producer import Delivery
from tests.integration.harness import Services, Worker, wait_until
from tests.integration.producing import (
    ROOT,
    committed_values,
    ingested,
    json_schema_validator,
    last_offsets,
    wait_past,
)
from tests.integration.test_aio_producer import frozen_broker

pytestmark = pytest.mark.integration

RUN = ROOT / "examples" / "java-producer" / "run.sh"
# The test-only main of examples/java-producer/src/test: one request held before its commit.
DRILL = "ackline.example.CommitTimeoutDrill"
GAVE_UP = "commit timed out 5 times, giving up"  # the example's line after the last attempt
EXIT_OUTCOME_UNKNOWN = 3  # ActivityProducerExample.EXIT_OUTCOME_UNKNOWN


def test_java_producer_is_ingested_exactly_once(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    env = {**os.environ, "KAFKA_LIBS": str(ensure_jars())}
    tag = uuid.uuid4().hex[:8]
    proc = subprocess.run(
        [str(RUN), services.bootstrap, topic, f"java-{tag}", tag],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    originals = [x for x in lines if not x["resend"]]
    resent = [x for x in lines if x["resend"]]
    assert len(originals) == 14 and len(resent) == 7

    values = committed_values(services.bootstrap, topic)
    assert len(values) == len(lines)
    validator = json_schema_validator()
    for value in values:
        errors = [e.message for e in validator.iter_errors(json.loads(value))]
        assert errors == [], value
        assert isinstance(decode(value), Row)
    # The same bytes: each resent record is byte-equal to an original.
    assert len(set(values)) == len(originals)
    types = {json.loads(v)["type"] for v in values}
    assert len(types) == 7
    # Time-ordered ids (UUIDv7), as the Python SDK makes them.
    assert {uuid.UUID(json.loads(v)["event_id"]).version for v in values} == {7}

    worker = Worker(services, dsn, topic, tmp_path)
    deliveries = [Delivery(x["partition"], x["offset"]) for x in lines]
    wait_past(dsn, worker, topic, last_offsets(deliveries))
    got = ingested(dsn)
    assert got.event_ids == {uuid.UUID(x["event_id"]) for x in originals}
    assert (got.inserted, got.duplicates) == (len(originals), len(resent))
    assert (got.conflicts, got.rejects) == (0, 0)
    assert worker.stop() == 0


def test_a_commit_that_times_out_is_not_aborted(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """The last timed-out commit ends the instance, unaborted; a resend is ingested once.

    After a commitTransaction that timed out, Kafka's client allows only calling it again:
    an abortTransaction throws IllegalStateException and hides that the outcome is unknown
    (the example did that). The drill holds one request while the broker is frozen, then
    commits with max.block.ms of 2 s: five attempts time out. The process must say the
    outcome is unknown and exit with the example's status; the same bytes, resent from a
    new instance, must then be stored once, whatever the timed-out commit became.
    """
    env = {**os.environ, "KAFKA_LIBS": str(ensure_jars()), "EXAMPLE_MAIN": DRILL}
    tag = uuid.uuid4().hex[:8]
    argv = [str(RUN), services.bootstrap, topic, f"java-{tag}", tag]
    errors = tmp_path / "hold.err"
    with (
        errors.open("w") as err,
        subprocess.Popen(
            [*argv, "hold"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        ) as hold,
    ):
        try:
            assert hold.stdin is not None and hold.stdout is not None
            held = hold.stdout.readline()  # the request's records, sent once we answer
            assert held, errors.read_text()[-4000:]
            with frozen_broker(services):
                hold.stdin.write("commit\n")
                hold.stdin.flush()
                wait_until(lambda: GAVE_UP in errors.read_text(), 90, "the last commit to time out")
            # close() waits for the commit still in flight: the process ends once it settles.
            hold.wait(timeout=120)
            printed = hold.stdout.read()
        finally:
            if hold.poll() is None:
                hold.kill()
    stderr = errors.read_text()
    assert hold.returncode == EXIT_OUTCOME_UNKNOWN, stderr[-4000:]
    assert "commit outcome unknown" in stderr, stderr[-4000:]
    assert "abortTransaction" not in stderr, stderr[-4000:]
    assert printed == ""  # nothing reported as delivered

    resend = subprocess.run(
        [*argv, "resend"],
        env=env,
        input=held,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert resend.returncode == 0, resend.stderr[-4000:]
    records = json.loads(held)
    lines = [json.loads(line) for line in resend.stdout.splitlines()]
    assert [x["event_id"] for x in lines] == [r["event_id"] for r in records]
    assert all(x["resend"] for x in lines)

    # The timed-out commit may have completed: then the resend's records are copies.
    copies = len(committed_values(services.bootstrap, topic)) - len(records)
    assert copies in (0, len(records))
    worker = Worker(services, dsn, topic, tmp_path)
    deliveries = [Delivery(x["partition"], x["offset"]) for x in lines]
    wait_past(dsn, worker, topic, last_offsets(deliveries))
    got = ingested(dsn)
    assert got.event_ids == {uuid.UUID(r["event_id"]) for r in records}
    assert (got.inserted, got.duplicates) == (len(records), copies)
    assert (got.conflicts, got.rejects) == (0, 0)
    assert worker.stop() == 0


def test_the_validator_checks_formats() -> None:
    """The standard validator is not a rubber stamp: formats and bounds are enforced."""
    validator = json_schema_validator()
    good = {
        "event_id": str(uuid.uuid4()),
        "txn_id": "start:req-1",
        "type": "agent.started",
        "agent_id": "a-1",
        "request_id": "req-1",
        "occurred_at": "2026-11-30T12:00:00.123456Z",
        "schema_version": 1,
        "payload": {"run_id": "run-1", "model": "m"},
    }
    assert validator.is_valid(good)
    for bad in (
        {**good, "occurred_at": "yesterday"},
        {**good, "event_id": "not-a-uuid"},
        {**good, "txn_id": ""},
        {**good, "schema_version": 2},
        {**good, "payload": {"run_id": "run-1"}},
        {k: v for k, v in good.items() if k != "txn_id"},
    ):
        assert not validator.is_valid(bad), bad
