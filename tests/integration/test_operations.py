"""Operating ackline against the real services: /healthz and /readyz of a running worker,
its JSON batch log lines, and the operator commands status, conflicts, rejects, doctor."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from confluent_kafka import KafkaError, Message

from ackline.cli import main
from ackline.schemas import Envelope, hash_envelope, new_envelope
from ackline.sinks.admin.grants import check_roles, expected, roles_migration
from ackline.sinks.admin.migrate import Migration, load_migrations
from ackline.streams.producer import ActivityProducer
from tests.integration.harness import Services, Worker, db, dsn_for, wait_until
from tests.integration.processing import EXAMPLE, ROOT, ackline

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
HOSTILE = b"\x1b[2J\xff{not json"


def step(i: int, thought: str = "plan", eid: uuid.UUID | None = None) -> Envelope:
    return new_envelope(
        "agent.step",
        txn_id=f"run-ops:{i}",
        agent_id="agent-ops",
        request_id="req-ops",
        payload={"run_id": "run-ops", "step": i, "thought": thought},
        occurred_at=T0,
        event_id=eid,
    )


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """main() installs its own log handler; put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


class Cli:
    """Runs `ackline` in this process with the settings of one test."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
        env: dict[str, str],
    ) -> None:
        self._capsys = capsys
        monkeypatch.setenv("ACKLINE_LOG_FORMAT", "text")
        for key, value in env.items():
            monkeypatch.setenv(key, value)

    def run(self, *argv: str) -> tuple[int, str]:
        self._capsys.readouterr()
        status = main(list(argv))
        return status, self._capsys.readouterr().out

    def json(self, *argv: str, expect: int = 0) -> Any:
        status, out = self.run(*argv, "--json")
        assert status == expect, out
        return json.loads(out)


def _env(services: Services, dsn: str, topic: str) -> dict[str, str]:
    return {
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": dsn,
        "ACKLINE_TOPIC": topic,
        "ACKLINE_GROUP_ID": f"g-{topic}",
        "ACKLINE_DLQ_TOPIC": f"{topic}.dlq",
    }


def _http(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def test_operating_a_running_worker(
    services: Services,
    dsn: str,
    topic: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    producer = ActivityProducer(services.bootstrap, topic, transactional_id=f"tx-{topic}")
    producer.start()
    e1, e2 = step(1), step(2)
    changed = step(2, thought="rewritten", eid=uuid.uuid4())  # same txn_id, new body
    last: dict[int, int] = {}

    def delivered(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        last[msg.partition() or 0] = max(last.get(msg.partition() or 0, -1), msg.offset() or 0)

    with producer.transaction():
        for env in (e1, e2, changed):
            producer.send(env, on_delivery=delivered)
        producer.send_bytes(b"agent-ops", HOSTILE, [], on_delivery=delivered)
    producer.close()

    worker = Worker(services, dsn, topic, tmp_path)
    cli = Cli(monkeypatch, capsys, _env(services, dsn, topic))

    def ready() -> bool:
        worker.ensure_alive()
        try:
            return _http(worker.metrics_port, "/readyz")[0] == 200
        except OSError:  # not listening yet
            return False

    wait_until(ready, 60, "/readyz to answer 200")
    assert _http(worker.metrics_port, "/healthz") == (200, {"status": "alive"})

    def caught_up() -> bool:
        worker.ensure_alive()
        parts = {p["partition"]: p for p in cli.json("status")["partitions"]}
        return all(
            parts[n]["db_next"] == offset + 1 and parts[n]["kafka_committed"] == offset + 1
            for n, offset in last.items()
        )

    wait_until(caught_up, 60, "status to show the DB and Kafka offsets past every record")
    status = cli.json("status")
    assert [p["partition"] for p in status["partitions"]] == [0, 1, 2]
    for p in status["partitions"]:
        assert p["owner"] == "w1" and p["owner_live"] is True and p["assigned"] == "w1"
        assert p["epoch"] >= 1
        # the commit marker after the last record takes an offset but is no lag: status
        # counts as /metrics does (issue 18; it used to say 1 per partition here)
        assert p["high"] - (p["db_next"] or 0) == (1 if p["partition"] in last else 0)
        assert p["lag"] == 0
    code, text = cli.run("status")
    assert code == 0
    assert "total lag 0" in text

    def metric_lag_zero() -> bool:  # the runtime counts from its position: markers skipped
        url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        gauges = [line for line in text.splitlines() if line.startswith("ackline_partition_lag{")]
        return len(gauges) == 3 and all(line.endswith(" 0.0") for line in gauges)

    wait_until(metric_lag_zero, 30, "the worker's lag gauge to reach 0")

    ready_body = _http(worker.metrics_port, "/readyz")[1]
    assert ready_body["ready"] is True
    assert ready_body["assigned_partitions"] == 3
    assert worker.stop() == 0, worker.log()[-3000:]

    lines = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    batches = [line for line in lines if line.get("event") == "batch_committed"]
    assert batches, worker.log()[-3000:]
    assert {r["topic"] for b in batches for r in b["ranges"]} == {topic}
    assert sum(b["inserted"] for b in batches) == 2
    assert sum(b["conflicts"]["ledger"] for b in batches) == 1
    assert all(isinstance(b["batch_id"], int) for b in batches)

    conflicts = cli.json("conflicts", "list")
    assert len(conflicts) == 1
    c = conflicts[0]
    assert c["layer"] == "ledger"
    assert c["stored_hash"] == hash_envelope(e2).hex()
    assert c["incoming_hash"] == hash_envelope(changed).hex()
    shown = cli.json("conflicts", "show", str(c["conflict_id"]))
    assert shown["incoming_body"]["payload"]["thought"] == "rewritten"
    assert shown["stored"]["event_id"] == str(e2.event_id)
    assert shown["stored"]["payload"]["thought"] == "plan"
    code, text = cli.run("conflicts", "show", str(c["conflict_id"]))
    assert code == 0
    assert "rewritten" in text
    assert hash_envelope(e2).hex() in text
    code, _ = cli.run("conflicts", "show", "999999")
    assert code == 2

    rejects = cli.json("rejects", "list", "--limit", "5")
    assert [r["reason"] for r in rejects] == ["not_utf8"]
    assert rejects[0]["value_bytes"] == len(HOSTILE)
    detail = cli.json("rejects", "show", str(rejects[0]["reject_id"]))
    assert detail["dlq_topic"] == f"{topic}.dlq"
    code, text = cli.run("rejects", "show", str(rejects[0]["reject_id"]))
    assert code == 0
    assert "\x1b" not in text  # the terminal escape is shown, not obeyed
    assert "\\x1b[2J\ufffd{not json" in text
    code, text = cli.run("rejects", "show", str(rejects[0]["reject_id"]), "--raw")
    assert "G1sySv97bm90IGpzb24=" in text  # base64 of HOSTILE

    report = cli.json("doctor")
    checks = {c["name"]: c["status"] for c in report["checks"]}
    assert report["ok"] is True, report
    for name in ("kafka", "postgresql", "migrations", "topic", "offsets", "retention"):
        assert checks[name] == "pass", report
    assert checks["append-only"] == "pass", report  # the worker's own role (the ingest DSN)
    assert checks["dead-letter topic"] == "pass"  # the worker made it
    assert checks["replication"] == "warn"  # one broker: replication factor 1
    assert checks["roles and grants"] in ("pass", "warn"), report


def test_doctor_fails_on_an_unmigrated_database_and_a_missing_topic(
    services: Services,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = f"t_empty_{uuid.uuid4().hex[:10]}"
    db(services.database_url, f'CREATE DATABASE "{name}"')
    try:
        env = _env(services, dsn_for(services.database_url, name), f"absent-{name}")
        cli = Cli(monkeypatch, capsys, env)
        report = cli.json("doctor", expect=1)
    finally:
        db(services.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["kafka"]["status"] == "pass"
    assert checks["migrations"]["status"] == "fail"
    assert "ackline migrate" in checks["migrations"]["detail"]
    assert checks["topic"]["status"] == "fail"


def test_doctor_does_not_pass_the_offsets_of_an_unmigrated_database(
    services: Services,
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With the topic there and the database never migrated, the offsets check said PASS
    ("DB offsets inside the log on 12 partitions"): there was no table to hold any (an
    operator's report). It is skipped now, saying why."""
    name = f"t_empty_{uuid.uuid4().hex[:10]}"
    db(services.database_url, f'CREATE DATABASE "{name}"')
    try:
        env = _env(services, dsn_for(services.database_url, name), topic)
        report = Cli(monkeypatch, capsys, env).json("doctor", expect=1)
    finally:
        db(services.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["topic"]["status"] == "pass", report
    assert checks["offsets"]["status"] == "skip", checks["offsets"]
    assert "not migrated" in checks["offsets"]["detail"]


def test_doctor_flags_offsets_past_the_log_and_unread_records(
    services: Services,
    dsn: str,
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    producer = ActivityProducer(services.bootstrap, topic, transactional_id=f"tx-{topic}")
    producer.start()
    with producer.transaction():
        producer.send(step(1))
    producer.close()
    cli = Cli(monkeypatch, capsys, _env(services, dsn, topic))
    report = cli.json("doctor")  # nothing consumed yet: lag, but fresh records
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["retention"]["status"] == "pass"
    assert "oldest unconsumed record" in checks["retention"]["detail"]

    async def recreated_topic() -> None:  # the DB remembers offsets the new log never had
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                "INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, epoch) "
                "VALUES ($1, $2, 0, 5000, 4)",
                f"g-{topic}",
                topic,
            )
        finally:
            await conn.close()

    asyncio.run(recreated_topic())
    report = cli.json("doctor", expect=1)
    offsets = next(c for c in report["checks"] if c["name"] == "offsets")
    assert offsets["status"] == "fail"
    assert "past the log end" in offsets["detail"]
    status = cli.json("status")
    assert status["partitions"][0]["db_next"] == 5000
    assert status["partitions"][0]["epoch"] == 4


def test_doctor_checks_grants_against_the_roles_migration(
    services: Services,
    dsn: str,
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cli = Cli(monkeypatch, capsys, _env(services, dsn, topic))
    roles_file = roles_migration(load_migrations())
    check = _check(cli.json("doctor"), "roles and grants")
    if roles_file is None:  # data-driven: no roles migration, nothing to compare with
        assert check["status"] == "warn"
        return
    assert check["status"] == "pass", check
    ingest = next(  # the role the file lets INSERT into activity
        p.role
        for p, granted in expected(roles_file.sql).privileges.items()
        if granted and (p.obj, p.privilege) == ("activity", "INSERT")
    )
    db(dsn, f'GRANT UPDATE ON activity TO "{ingest}"')  # breaks append-only by grants
    report = cli.json("doctor", expect=1)
    check = _check(report, "roles and grants")
    assert check["status"] == "fail"
    assert f"{ingest}: UPDATE on table activity is held" in check["detail"]
    assert "UPDATE on a column of activity" not in check["detail"], check  # said once
    worker = _check(report, "append-only")  # and the worker, connecting as it, may rewrite
    assert (worker["status"], "UPDATE" in worker["detail"]) == ("fail", True), worker
    db(dsn, f'REVOKE UPDATE ON activity FROM "{ingest}"')
    assert _check(cli.json("doctor"), "roles and grants")["status"] == "pass"
    # each grant below is one a worker needs, revoked in turn and then restored: a grant of
    # a later migration than the roles file (0016: without it the first batch with a reject
    # stops the worker; doctor read the roles file alone), a column's (0016: the worker
    # reads src_topic_id) and a function's (0015: the worker records its topic's ID; doctor
    # skipped both kinds and passed)
    for on, what in (
        ("topic_incarnations", "SELECT on table topic_incarnations"),
        ("rejects", "SELECT on column rejects.src_topic_id"),
        (
            "FUNCTION ackline_record_topic_id(text, text, text)",
            "EXECUTE on function ackline_record_topic_id(text, text, text)",
        ),
    ):
        privilege = what.split()[0] + (" (src_topic_id)" if "column" in what else "")
        db(dsn, f'REVOKE {privilege} ON {on} FROM "{ingest}"')
        check = _check(cli.json("doctor", expect=1), "roles and grants")
        assert check["status"] == "fail", check
        assert f"{ingest}: {what} is missing" in check["detail"], check
        db(dsn, f'GRANT {privilege} ON {on} TO "{ingest}"')
        assert _check(cli.json("doctor"), "roles and grants")["status"] == "pass"
    # a write to one column rewrites rows as the table's does, and has_table_privilege
    # does not see it: both checks passed
    db(dsn, f'GRANT UPDATE (payload) ON activity TO "{ingest}"')
    report = cli.json("doctor", expect=1)
    check = _check(report, "roles and grants")
    assert f"{ingest}: UPDATE on a column of activity is held" in check["detail"], check
    worker = _check(report, "append-only")
    assert (worker["status"], "UPDATE" in worker["detail"]) == ("fail", True), worker
    db(dsn, f'REVOKE UPDATE (payload) ON activity FROM "{ingest}"')
    # PUBLIC's EXECUTE of a SECURITY DEFINER function the migrations revoke (anyone could
    # drop partitions) was not read at all
    db(dsn, "GRANT EXECUTE ON FUNCTION ackline_drop_up_to() TO PUBLIC")
    check = _check(cli.json("doctor", expect=1), "roles and grants")
    assert "public: EXECUTE on function ackline_drop_up_to() is held" in check["detail"], check
    db(dsn, "REVOKE EXECUTE ON FUNCTION ackline_drop_up_to() FROM PUBLIC")
    assert _check(cli.json("doctor"), "roles and grants")["status"] == "pass"


def test_a_function_signature_postgresql_cannot_read_is_not_checked_alone(dsn: str) -> None:
    """PostgreSQL 15's to_regprocedure raises on a signature that names its arguments:
    read in the one query with every other privilege, it failed the whole check
    (doctor said PostgreSQL could not be queried). It is left out and named; a function
    that does not exist is still a missing grant."""

    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            file = Migration(
                99,
                "roles",
                "GRANT EXECUTE ON FUNCTION ackline_drop_up_to(p_x text) TO ackline_ingest;"
                "GRANT EXECUTE ON FUNCTION no_such_function() TO ackline_ingest;"
                "GRANT SELECT ON activity TO ackline_ingest;",
            )
            report = await check_roles(conn, file, True)
        finally:
            await conn.close()
        assert report.unchecked == ["ackline_drop_up_to(p_x text)"]
        assert [(p.said, held) for p, held in report.wrong if p.kind == "function"] == [
            ("EXECUTE on function no_such_function()", False)
        ]

    asyncio.run(go())


def test_doctor_takes_a_processors_grants_on_its_own_table(
    services: Services,
    dsn: str,
    topic: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/processors.md followed (operator probe): `ackline processors setup
    daily_tool_calls` grants ackline_processor SELECT, INSERT, UPDATE on the processor's own
    table, as the guide says it should, and doctor then failed for good ("0010_roles.sql
    disagrees: ackline_processor: INSERT on table daily_tool_calls is held"). A table no
    migration creates is not the roles migration's to judge: its grants are information,
    and a write on a migration's table that the migrations do not give still fails."""
    dist = tmp_path / "ackline_example_daily-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ackline-example-daily\n")
    (dist / "entry_points.txt").write_text(
        "[ackline.processors]\ndaily_tool_calls = daily_tool_calls:PROCESSOR\n"
    )
    path = {"PYTHONPATH": f"{tmp_path}:{ROOT}:{EXAMPLE}"}
    setup = ackline(dsn, "processors", "setup", "daily_tool_calls", **path)
    assert setup.code == 0, setup.err
    cli = Cli(monkeypatch, capsys, _env(services, dsn, topic))
    check = _check(cli.json("doctor"), "roles and grants")
    assert check["status"] == "pass", check
    assert "ackline_processor: INSERT, UPDATE on daily_tool_calls" in check["detail"], check

    db(dsn, "GRANT UPDATE ON feed_cursors, run_facts TO ackline_processor")
    check = _check(cli.json("doctor", expect=1), "roles and grants")
    assert check["status"] == "fail"
    assert "ackline_processor: UPDATE on table run_facts is held" in check["detail"], check
    assert "feed_cursors" not in check["detail"]  # the migration grants that one


def _check(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["name"] == name)


def test_a_group_without_db_offsets_is_not_called_healthy(
    services: Services,
    dsn: str,
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A mistyped --group-id showed every partition as `-` with the whole log as lag, and
    doctor passed "DB offsets inside the log" for a group PostgreSQL never heard of."""
    db(
        dsn,
        "INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, epoch) "
        "VALUES ($1, $2, 0, 0, 1)",
        f"g-{topic}",
        topic,
    )
    cli = Cli(monkeypatch, capsys, _env(services, dsn, topic))
    offsets = _check(cli.json("doctor", "--group-id", "nosuch"), "offsets")
    assert offsets["status"] == "warn", offsets
    assert "no DB offsets for group nosuch" in offsets["detail"]
    assert f"groups with offsets for it: g-{topic}" in offsets["detail"]
    code, text = cli.run("status", "--group-id", "nosuch")
    assert code == 0, text
    assert "no DB offsets for group nosuch" in text
    assert f"g-{topic}" in text
    assert _check(cli.json("doctor"), "offsets")["status"] == "pass"  # the group ingesting
    code, text = cli.run("status")
    assert "no DB offsets" not in text
