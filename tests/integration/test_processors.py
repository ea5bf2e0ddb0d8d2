"""Stream processors against a real PostgreSQL (docs/processors.md).

* a processor SIGKILLed between its effects and its COMMIT (fault point
  ``processor_before_commit``): at the kill, every processor's effects are exactly those
  of the events before its cursor; restarted, it finishes exactly once;
* two copies of one processor at once: the second blocks on the cursor row, loses the
  compare-and-set, and applies nothing twice (a deterministic race, then two processes
  following while batches stream in), with a processor that is NOT idempotent;
* a rolling deploy that widens a processor's filter: the newest instance takes over, an
  old one still running cannot pass the new type's events over (it stops, its batch
  rolled back), and the new one applies every one of them;
* a processor added after 100k events backfills to the same table as one that followed
  them from the start (the events are COPYed into ``activity`` as ingest batches, one
  transaction each with its ``ingest_batches`` row: see ``processing.py``);
* the ``runs`` projection with a run's events out of order and repeated, through the real
  ingest writer, in batches of 2 and in one batch: the same rows, equal to their
  recomputation from ``activity``;
* a processor that raises stops at that event, says so, and resumes there once fixed;
  pause/resume, lag and errors on /metrics, SIGTERM within the shutdown wait (and ingest
  goes on while a processor holds its transaction open);
* the processor role: reads the feed, writes only processor tables and its own cursors;
* the worked example (``examples/daily_tool_calls``), found by its entry point.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from ackline.core.signals import Stopping
from ackline.dev.ports import pick_free_port
from ackline.dev.toxiproxy import ToxiproxyServer
from ackline.load.chaos.runs_check import check_runs, check_runs_at
from ackline.roles import PROCESSOR, with_user
from ackline.schemas import Envelope, new_envelope
from ackline.schemas.decode import Row, decode
from ackline.sinks.admin.partitions import apply_retention, ensure_partitions
from ackline.sinks.connection import Database
from ackline.sinks.feed.changefeed import Changefeed, Reader, connector, saved_cursor
from ackline.sinks.feed.follow import follow
from ackline.sinks.feed.processors.contract import ProcessorBatch
from ackline.sinks.feed.processors.control import (
    Superseded,
    record_failure,
    reset,
    set_paused,
    take_over,
)
from ackline.sinks.feed.processors.metrics import ProcessorMetrics
from ackline.sinks.feed.processors.runner import Outcome, ProcessorRunner, Report, run_all
from ackline.sinks.feed.processors.runs import RUNS
from ackline.sinks.feed.processors.runs_fold import RunRow, rows
from ackline.sinks.feed.types import ALL, START, Cursor, FeedBatch, FeedEvent
from ackline.sinks.ingest.batch import Batch, Coord, Incoming, PartitionRange
from ackline.sinks.ingest.offsets import claim
from ackline.sinks.ingest.writer import BatchWriter
from ackline.streams.producer import serialize
from tests.integration.harness import PointGate, db, next_utc_midnight, relay_postgresql
from tests.integration.processing import (
    EXAMPLE,
    ROOT,
    Ev,
    Process,
    ackline,
    copy_ingest,
    scrape,
    synthetic_runs,
)
from tests.support.processors import JOURNAL, SETUP_SQL, TYPED_V1, TYPED_V2, Journal, Picky

RUN_COLUMNS = ", ".join(RunRow.__dataclass_fields__)
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


# --- helpers ---------------------------------------------------------------------------


def run(coro: Awaitable[Any]) -> Any:
    async def wrap() -> Any:
        return await coro

    return asyncio.run(wrap())


async def with_conn(dsn: str, action: Callable[[asyncpg.Connection], Awaitable[Any]]) -> Any:
    conn = await asyncpg.connect(dsn)
    try:
        return await action(conn)
    finally:
        await conn.close()


def write(dsn: str, events: list[Ev], chunk: int = 2000) -> int:
    return int(run(with_conn(dsn, lambda c: copy_ingest(c, events, chunk))))


def setup_journal(dsn: str) -> None:
    run(with_conn(dsn, lambda c: c.execute(SETUP_SQL)))


def journal(dsn: str, processor: str) -> Counter[uuid.UUID]:
    found = db(dsn, "SELECT event_id FROM journal WHERE processor = $1", processor)
    return Counter(r["event_id"] for r in found)


_UP_TO = """
SELECT a.event_id, a.txn_id, a.type, a.agent_id, a.request_id, a.occurred_at,
       a.schema_version, a.payload::text AS payload, a.batch_id, b.commit_xid::text AS xid,
       a.src_topic, a.src_partition, a.src_offset
FROM activity AS a JOIN ingest_batches AS b ON b.batch_id = a.batch_id
WHERE b.commit_xid < $1::xid8
   OR (b.commit_xid = $1::xid8 AND ($2::bigint IS NULL
       OR (a.batch_id, a.src_partition, a.src_offset, a.src_topic COLLATE "C")
          <= ($2::bigint, $3::int, $4::bigint, $5::text COLLATE "C")))
"""


def events_up_to(dsn: str, cursor: Cursor | None) -> list[FeedEvent]:
    """Every ingested event a reader at ``cursor`` has consumed (all of them for None)."""
    if cursor is None:
        cursor = Cursor(2**63)
    w = cursor.within
    found = db(
        dsn,
        _UP_TO,
        cursor.xid,
        *((None,) * 4 if w is None else (w.batch_id, w.partition, w.offset, w.topic)),
    )
    return [
        FeedEvent(
            event_id=r["event_id"],
            txn_id=r["txn_id"],
            type=r["type"],
            agent_id=r["agent_id"],
            request_id=r["request_id"],
            occurred_at=r["occurred_at"],
            schema_version=r["schema_version"],
            payload=json.loads(r["payload"]),
            batch_id=r["batch_id"],
            commit_xid=int(r["xid"]),
            topic=r["src_topic"],
            partition=r["src_partition"],
            offset=r["src_offset"],
        )
        for r in found
    ]


def cursor_of(dsn: str, reader: str) -> Cursor | None:
    return run(with_conn(dsn, lambda c: saved_cursor(c, reader)))  # type: ignore[no-any-return]


def stored_runs(dsn: str, table: str = "runs") -> dict[str, RunRow]:
    sql = {"runs": "SELECT * FROM runs", "runs_live": "SELECT * FROM runs_live"}[table]
    return {r["request_id"]: RunRow.from_record(r) for r in db(dsn, sql)}


def status(dsn: str, name: str) -> dict[str, Any]:
    done = ackline(dsn, "processors", "status", name, "--json")
    assert done.code == 0, done.err
    found: list[dict[str, Any]] = json.loads(done.out)
    assert len(found) == 1
    return found[0]


async def waiting_on_a_lock(
    watch: asyncpg.Connection, application: str, task: asyncio.Task[Any], who: str
) -> None:
    """Until a session of ``application`` waits on a lock (the cursor row), within 60 s,
    while ``task`` (its runner) has not ended."""
    deadline = time.monotonic() + 60
    while not await watch.fetchval(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE application_name = $1 AND wait_event_type = 'Lock'",
        application,
    ):
        assert time.monotonic() < deadline, f"{who} never waited on the cursor"
        assert not task.done(), task.result()
        await asyncio.sleep(0.05)


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def steps_of(request: str, n: int, agent: str = "agent-00") -> list[Ev]:
    return [
        Ev(
            "agent.step",
            agent,
            request,
            T0 + timedelta(seconds=i),
            {"run_id": f"run-{request}", "step": i, "thought": "t"},
            f"run-{request}:{i}",
        )
        for i in range(1, n + 1)
    ]


# --- crash between effects and commit ------------------------------------------------------


def test_killed_between_its_effects_and_its_commit(dsn: str) -> None:
    """Two processors in one process, batches of 100; the process kills itself at its
    third batch, after the effects and before COMMIT. At that moment each processor's
    tables hold exactly the events before its cursor; restarted, each finishes once."""
    setup_journal(dsn)
    events = synthetic_runs(2_000, seed=3)
    write(dsn, events, chunk=250)
    spec = "tests.support.processors:JOURNAL"
    killed = ackline(
        dsn,
        "process",
        "runs",
        spec,
        "--until-caught-up",
        "--batch-events",
        "100",
        ACKLINE_FAULTS="processor_before_commit=kill@3",
    )
    assert killed.code == -signal.SIGKILL, killed.err[-2000:]
    assert "fault point processor_before_commit fired: kill" in killed.err

    runs_at = cursor_of(dsn, "runs")
    journal_at = cursor_of(dsn, "journal")
    assert runs_at is not None and journal_at is not None
    before = events_up_to(dsn, runs_at)
    assert stored_runs(dsn) == rows(before)  # effects == the events before the cursor
    assert journal(dsn, "journal") == Counter(e.event_id for e in events_up_to(dsn, journal_at))
    consumed = len(before) + len(events_up_to(dsn, journal_at))
    # killed at the third batch: at most two committed (a COMMIT in flight at the kill
    # may or may not have landed), the third rolled back
    assert consumed in (0, 100, 200)

    again = ackline(dsn, "process", "runs", spec, "--until-caught-up", "--batch-events", "100")
    assert again.code == 0, again.err[-2000:]
    applied = again.report("runs")["applied"] + again.report("journal")["applied"]
    assert applied == 2 * len(events) - consumed
    assert run(check_runs_at(dsn)).mismatches == 0
    assert stored_runs(dsn) == rows(events_up_to(dsn, None))
    assert journal(dsn, "journal") == Counter(e.event_id for e in events)  # each once
    stored = db(dsn, "SELECT reader, delivered FROM feed_cursors ORDER BY reader")
    n = len(events)
    assert [(r["reader"], r["delivered"]) for r in stored] == [("journal", n), ("runs", n)]


# --- two copies of one processor -------------------------------------------------------------


def test_two_copies_the_second_loses_the_cursor_race_and_applies_nothing_twice(dsn: str) -> None:
    setup_journal(dsn)
    events = synthetic_runs(600, seed=5)
    write(dsn, events, chunk=200)
    role_dsn = with_user(dsn, PROCESSOR)

    async def go() -> tuple[ProcessorRunner, ProcessorRunner]:
        gate = PointGate("processor_before_commit", once=True)
        first = ProcessorRunner(JOURNAL, instance="first", faults=gate, poll_interval=0.2)
        second = ProcessorRunner(JOURNAL, instance="second", poll_interval=0.2)
        stop = asyncio.Event()
        task_a = asyncio.create_task(first.run(connector(role_dsn, "race-first"), stop, wait=False))
        await asyncio.wait_for(gate.reached.wait(), 60)
        task_b = asyncio.create_task(
            second.run(connector(role_dsn, "race-second"), stop, wait=False)
        )
        watch = await asyncpg.connect(dsn)
        try:
            await waiting_on_a_lock(watch, "race-second", task_b, "the second copy")
        finally:
            await watch.close()
        gate.release.set()
        reports = await asyncio.wait_for(asyncio.gather(task_a, task_b), 120)
        assert [r.outcome for r in reports] == [Outcome.CAUGHT_UP, Outcome.CAUGHT_UP]
        return first, second

    first, second = run(go())
    assert second.reader.stats.lost_races == 1  # blocked, lost, read on from the winner
    assert (first.applied, second.applied) == (len(events), 0)  # the winner took it all
    assert journal(dsn, "journal") == Counter(e.event_id for e in events)
    assert {r["instance"] for r in db(dsn, "SELECT DISTINCT instance FROM journal")} == {"first"}


def test_two_processes_of_one_processor_while_batches_stream_in(dsn: str, tmp_path: Path) -> None:
    setup_journal(dsn)
    spec = "tests.support.processors:JOURNAL"
    args = ("--batch-events", "50", "--poll-interval", "0.5")
    a = Process(dsn, tmp_path, "a", spec, *args, "--instance", "a")
    b = Process(dsn, tmp_path, "b", spec, *args, "--instance", "b")
    try:
        a.wait_ready()
        b.wait_ready()
        events = synthetic_runs(3_000, seed=9)

        async def stream() -> None:
            conn = await asyncpg.connect(dsn)
            try:
                for at in range(0, len(events), 100):
                    await copy_ingest(conn, events[at : at + 100], chunk=100)
                    await asyncio.sleep(0.02)
            finally:
                await conn.close()

        run(stream())
        wait_until(lambda: sum(journal(dsn, "journal").values()) >= len(events), 120, "every event")
        done = [a.stop(), b.stop()]
    finally:
        a.kill()
        b.kill()
    assert all(d.code == 0 for d in done), [d.err[-1500:] for d in done]
    reports = [d.report("journal") for d in done]
    assert sum(r["applied"] for r in reports) == len(events)
    assert journal(dsn, "journal") == Counter(e.event_id for e in events)  # no event twice


# --- a rolling deploy that changes a filter ------------------------------------------------

V1_FILTER = '{"agents":null,"types":["agent.started","agent.step"]}'
V2_FILTER = '{"agents":null,"types":["agent.requested","agent.started","agent.step"]}'


def test_an_old_instance_cannot_pass_over_the_types_a_newer_filter_took_over(dsn: str) -> None:
    """v1 of `typed` (agent.started, agent.step) follows the feed; v2 (plus
    agent.requested) starts and takes over; then requests are ingested, and the old v1
    instance, still running, reads them first. It must not move the shared cursor past
    them (they are not in its filter): it stops, its batch rolled back, and v2 applies
    every event ingested after the switch, each once."""
    setup_journal(dsn)
    role_dsn = with_user(dsn, PROCESSOR)
    events = synthetic_runs(400, seed=21)
    before, after = events[:200], events[200:]
    v1_types, v2_types = {"agent.started", "agent.step"}, {"agent.requested"}
    v2_types |= v1_types

    async def go() -> tuple[Report, Report]:
        old = ProcessorRunner(TYPED_V1, instance="old", poll_interval=0.2)
        new = ProcessorRunner(TYPED_V2, instance="new", poll_interval=0.2)
        stop_old = asyncio.Event()
        conn = await asyncpg.connect(dsn)
        try:
            await copy_ingest(conn, before, chunk=100)
            task = asyncio.create_task(old.run(connector(role_dsn, "old"), stop_old))
            deadline = time.monotonic() + 60
            while old.applied < sum(e.type in v1_types for e in before):
                assert time.monotonic() < deadline, f"v1 applied {old.applied}"
                assert not task.done(), task.result()
                await asyncio.sleep(0.05)
            # v2 starts (and takes over); nothing new to read yet
            first = await new.run(connector(role_dsn, "new"), asyncio.Event(), wait=False)
            assert first.outcome is Outcome.CAUGHT_UP, first
            batches = old.batches
            await copy_ingest(conn, after, chunk=len(after))  # one ingest transaction
            # the old instance, still following, reads the new events first
            deadline = time.monotonic() + 60
            while not task.done() and old.batches == batches:
                assert time.monotonic() < deadline, "v1 never read the events after the switch"
                await asyncio.sleep(0.05)
            stop_old.set()
            old_report = await asyncio.wait_for(task, 60)
            new_report = await new.run(connector(role_dsn, "new"), asyncio.Event(), wait=False)
        finally:
            await conn.close()
        return old_report, new_report

    old_report, new_report = run(go())
    applied = journal(dsn, "typed")
    requests = [e for e in after if e.type == "agent.requested"]
    assert requests
    missing = [str(e.event_id) for e in requests if e.event_id not in applied]
    assert not missing, (
        f"{len(missing)} of the {len(requests)} agent.requested events ingested after v2 "
        f"took over were never applied (v1 passed them over: {old_report}): {missing}"
    )
    assert old_report.outcome is Outcome.SUPERSEDED, old_report
    assert old_report.failure is not None
    error = old_report.failure.error
    assert f"instance old (filter {V1_FILTER}) is superseded" in error, error
    assert "instance new took over at " in error and f"with filter {V2_FILTER}" in error
    want = [e for e in before if e.type in v1_types] + [e for e in after if e.type in v2_types]
    assert applied == Counter(e.event_id for e in want)  # each once
    by = db(dsn, "SELECT instance, count(*) AS n FROM journal GROUP BY 1 ORDER BY 1")
    n_after = sum(e.type in v2_types for e in after)
    assert {r["instance"]: r["n"] for r in by} == {"new": n_after, "old": len(want) - n_after}
    assert (new_report.outcome, new_report.applied) == (Outcome.CAUGHT_UP, n_after)
    shown = status(dsn, "typed")
    assert (shown["state"], shown["filter"]) == ("ok", V2_FILTER)  # no failure recorded
    assert shown["superseded_filters"] == [V1_FILTER]

    # v1 restarted mid-rollout (an orchestrator restarts what stopped): a replaced filter
    # does not take over back; only the operator's word lets it (a deliberate rollback)
    async def restart_v1() -> Report:
        again = ProcessorRunner(TYPED_V1, instance="old-again", poll_interval=0.2)
        return await again.run(connector(role_dsn, "old-again"), asyncio.Event(), wait=False)

    refused = run(restart_v1())
    assert refused.outcome is Outcome.SUPERSEDED and refused.failure is not None, refused
    assert "does not take over" in refused.failure.error, refused.failure.error
    assert "clear-superseded typed" in refused.failure.error
    assert (refused.applied, status(dsn, "typed")["filter"]) == (0, V2_FILTER)

    done = ackline(dsn, "processors", "clear-superseded", "typed")  # the operator's
    assert done.code == 0 and "may take over again" in done.out, done.err
    assert run(restart_v1()).outcome is Outcome.CAUGHT_UP
    shown = status(dsn, "typed")
    assert (shown["filter"], shown["superseded_filters"]) == (V1_FILTER, [V2_FILTER])


def test_an_instance_that_does_not_check_the_filter_is_refused_by_the_database(
    dsn: str,
) -> None:
    """An ackline older than migration 0012 neither records nor checks a filter: after v2
    took over, such an instance (a plain changefeed Reader with v1's filter, as the
    processor role) must not move the shared cursor past the requests v2 applies. The
    database's guard refuses its compare-and-set (SQLSTATE AKSP1), its batch rolls back,
    and v2 applies every request; the operator may still move the cursor (a reset)."""
    setup_journal(dsn)
    role_dsn = with_user(dsn, PROCESSOR)
    events = synthetic_runs(200, seed=23)
    v2_types = {"agent.requested", "agent.started", "agent.step"}

    async def go() -> tuple[Report, BaseException | None]:
        v1 = ProcessorRunner(TYPED_V1, instance="v1", poll_interval=0.2)  # records v1's
        assert (await v1.run(connector(role_dsn, "v1"), asyncio.Event(), wait=False)).applied == 0
        new = ProcessorRunner(TYPED_V2, instance="new", poll_interval=0.2)
        first = await new.run(connector(role_dsn, "new"), asyncio.Event(), wait=False)
        assert first.outcome is Outcome.CAUGHT_UP, first  # took over, nothing to read
        conn = await asyncpg.connect(dsn)
        try:
            await copy_ingest(conn, events, chunk=len(events))
        finally:
            await conn.close()
        old = Reader("typed", Changefeed(TYPED_V1.filter))

        async def passed_over(conn: asyncpg.Connection, batch: FeedBatch) -> None:
            return None

        refused: BaseException | None = None
        try:
            await follow(old, connector(role_dsn, "old"), passed_over, asyncio.Event(), wait=False)
        except asyncpg.PostgresError as exc:
            refused = exc
        # nor as the operator (a superuser): `ackline tail --commit` given the name
        with pytest.raises(asyncpg.PostgresError, match="is in effect"):
            await follow(old, connector(dsn, "op"), passed_over, asyncio.Event(), wait=False)
        again = ProcessorRunner(TYPED_V2, instance="new-2", poll_interval=0.2)
        return await again.run(connector(role_dsn, "new-2"), asyncio.Event(), wait=False), refused

    report, refused = run(go())
    assert refused is not None and getattr(refused, "sqlstate", None) == "AKSP1", refused
    assert f"filter {V2_FILTER} is in effect" in str(refused), str(refused)
    want = Counter(e.event_id for e in events if e.type in v2_types)
    assert want and journal(dsn, "typed") == want, "v2 missed events the old reader passed over"
    assert (report.outcome, report.applied) == (Outcome.CAUGHT_UP, sum(want.values()))
    done = ackline(dsn, "processors", "reset", "typed", "--cursor-only", "--to-now")
    assert done.code == 0, done.err  # the operator's reset is not the guard's concern

    # v1 of this version beside another processor in one process: v1 stops superseded
    # (refused at start: its filter was replaced), is no longer ready, the other goes on
    write(dsn, synthetic_runs(20, seed=24), chunk=100)
    metrics = ProcessorMetrics()
    both = [
        ProcessorRunner(TYPED_V1, instance="both", metrics=metrics),
        ProcessorRunner(JOURNAL, instance="both", metrics=metrics),
    ]
    reports = run(
        run_all(both, connector(role_dsn, "both"), Stopping(asyncio.Event(), 30), wait=False)
    )
    assert [r.outcome for r in reports] == [Outcome.SUPERSEDED, Outcome.CAUGHT_UP], reports
    failed = metrics.registry.get_sample_value("ackline_processor_failed", {"processor": "typed"})
    assert failed == 1


def test_a_retry_in_smaller_batches_after_a_takeover_stops_as_superseded(dsn: str) -> None:
    """A batch that raised is retried in smaller batches on a new connection; if another
    filter took over meanwhile, the database refuses the retry's compare-and-set, and that
    is a superseded stop, not a failure recorded on the row of the instance in effect."""
    setup_journal(dsn)
    role_dsn = with_user(dsn, PROCESSOR)

    async def go() -> None:
        v1 = ProcessorRunner(TYPED_V1, instance="v1", poll_interval=0.2)
        assert (await v1.run(connector(role_dsn, "v1"), asyncio.Event(), wait=False)).applied == 0
        admin, conn = await asyncpg.connect(dsn), await asyncpg.connect(role_dsn)
        try:
            await copy_ingest(admin, synthetic_runs(20, seed=25), chunk=100)
            await take_over(conn, "typed", V2_FILTER, "v2")  # v2 starts (not reading yet)
        finally:
            await admin.close()
            await conn.close()
        failed = ProcessorBatch("typed", "v1", START, Cursor(1 << 62), ())
        with pytest.raises(Superseded, match="instance v2 took over"):
            await v1._isolate(connector(role_dsn, "v1"), failed, asyncio.Event())

    run(go())
    assert status(dsn, "typed")["state"] == "ok"  # nothing recorded as a failure


def test_a_reader_with_rights_on_feed_cursors_only_is_not_held_by_the_guard(dsn: str) -> None:
    """A changefeed reader that is not a processor needs SELECT on the feed and INSERT,
    UPDATE on feed_cursors, nothing on processors: the guard reads the filter through a
    function of its owner's."""
    role = f"feed_only_{uuid.uuid4().hex[:8]}"
    grants = (
        f"CREATE ROLE {role} LOGIN; "
        f"GRANT SELECT ON activity, ingest_batches, erasures, erased_events TO {role}; "
        f"GRANT SELECT, INSERT, UPDATE ON feed_cursors TO {role}"
    )
    run(with_conn(dsn, lambda c: c.execute(grants)))
    try:
        write(dsn, synthetic_runs(5, seed=26), chunk=100)
        seen: list[int] = []

        async def count(conn: asyncpg.Connection, batch: FeedBatch) -> None:
            seen.append(len(batch.events))

        reader = Reader("billing", Changefeed(ALL))
        run(
            follow(reader, connector(with_user(dsn, role), "b"), count, asyncio.Event(), wait=False)
        )
        assert sum(seen) > 0
    finally:
        run(with_conn(dsn, lambda c: c.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")))


def test_a_takeover_waits_for_the_batch_in_flight(dsn: str) -> None:
    """The takeover locks the cursor row: it waits for an old instance's batch held open
    before COMMIT, which commits (it read the filter before the switch); the new filter
    is recorded after it, and the new instance reads on from that batch's end."""
    setup_journal(dsn)
    role_dsn = with_user(dsn, PROCESSOR)
    events = synthetic_runs(300, seed=22)
    write(dsn, events, chunk=100)

    async def go() -> tuple[Report, Report]:
        gate = PointGate("processor_before_commit", once=True)
        old = ProcessorRunner(TYPED_V1, instance="old", faults=gate, poll_interval=0.2)
        new = ProcessorRunner(TYPED_V2, instance="new", poll_interval=0.2)
        stop = asyncio.Event()
        task_old = asyncio.create_task(old.run(connector(role_dsn, "old"), stop, wait=False))
        await asyncio.wait_for(gate.reached.wait(), 60)
        task_new = asyncio.create_task(new.run(connector(role_dsn, "new"), stop, wait=False))
        watch = await asyncpg.connect(dsn)
        try:
            await waiting_on_a_lock(watch, "new", task_new, "the takeover")
            assert await watch.fetchval("SELECT filter FROM processors") == V1_FILTER
        finally:
            await watch.close()
        gate.release.set()
        old_report, new_report = await asyncio.wait_for(asyncio.gather(task_old, task_new), 120)
        return old_report, new_report

    old_report, new_report = run(go())
    v1 = [e for e in events if e.type in {"agent.started", "agent.step"}]
    assert (old_report.outcome, old_report.applied) == (Outcome.CAUGHT_UP, len(v1))
    assert (new_report.outcome, new_report.applied) == (Outcome.CAUGHT_UP, 0)
    assert journal(dsn, "typed") == Counter(e.event_id for e in v1)
    shown = status(dsn, "typed")
    assert (shown["filter"], shown["filter_instance"]) == (V2_FILTER, "new")


# --- backfill --------------------------------------------------------------------------------


def test_a_processor_added_after_100k_events_backfills_to_the_same_result(dsn: str) -> None:
    """`runs` follows while 100k events are ingested (COPY, 2,000 per ingest batch);
    its table is kept aside; then `processors reset runs` empties it and rewinds the
    cursor to the start, which is what a processor added now sees, and `process runs
    --until-caught-up` backfills: the same rows, and both equal activity recomputed."""
    events = synthetic_runs(100_000, seed=11)
    role_dsn = with_user(dsn, PROCESSOR)

    async def live() -> int:
        runner = ProcessorRunner(RUNS, instance="live", poll_interval=0.2)
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(connector(role_dsn, "live"), stop))
        conn = await asyncpg.connect(dsn)
        try:
            await copy_ingest(conn, events)
        finally:
            await conn.close()
        deadline = time.monotonic() + 300
        while runner.applied < len(events):
            assert time.monotonic() < deadline, f"live applied {runner.applied}"
            assert not task.done(), task.result()
            await asyncio.sleep(0.1)
        stop.set()
        report = await task
        assert report.outcome is Outcome.STOPPED
        return runner.applied

    assert run(live()) == len(events)
    db(dsn, "CREATE TABLE runs_live AS SELECT * FROM runs")
    live_rows = stored_runs(dsn, "runs_live")
    assert len(live_rows) > 5_000

    reset = ackline(dsn, "processors", "reset", "runs")
    assert reset.code == 0, reset.err
    assert "reset to cursor 0 and its state cleared" in reset.out
    assert db(dsn, "SELECT count(*) AS n FROM runs")[0]["n"] == 0
    backfill = ackline(dsn, "process", "runs", "--until-caught-up")
    assert backfill.code == 0, backfill.err[-2000:]
    assert backfill.report("runs")["applied"] == len(events)
    assert stored_runs(dsn) == live_rows
    assert run(check_runs_at(dsn)).mismatches == 0


# --- the runs projection through the ingest writer -----------------------------------------


def _env(type_: str, req: str, i: int, payload: dict[str, Any], *, txn: str = "") -> Envelope:
    return new_envelope(
        type_,
        txn_id=txn or f"{req}:{type_}:{i}",
        agent_id="agent-7",
        request_id=req,
        payload=payload,
        occurred_at=T0 + timedelta(seconds=i),
    )


def _as_row(env: Envelope) -> Row:
    decoded = decode(serialize(env))
    assert isinstance(decoded, Row)
    return decoded


def test_runs_out_of_order_and_twice_through_the_ingest_writer(dsn: str) -> None:
    run_id = "run-x"
    req = {"prompt": "p", "requested_by": "u", "priority": 1, "tools": ["search"]}
    step = [
        _env("agent.step", "rx", i, {"run_id": run_id, "step": i, "thought": "t"})
        for i in (2, 3, 4)
    ]
    called = _env(
        "tool.called",
        "rx",
        5,
        {"run_id": run_id, "call_id": "c1", "tool": "search", "arguments": {}},
    )
    failed_result = _env(
        "tool.result",
        "rx",
        6,
        {"run_id": run_id, "call_id": "c1", "ok": False, "output": "o", "duration_ms": 2},
    )
    finished = _env(
        "agent.finished",
        "rx",
        9,
        {"run_id": run_id, "steps": 3, "tokens_in": 10, "tokens_out": 5, "summary": "s"},
    )
    started = _env("agent.started", "rx", 1, {"run_id": run_id, "model": "m"})
    requested = _env("agent.requested", "rx", 0, req)
    message = _env(
        "message.posted", "rx", 7, {"run_id": run_id, "role": "assistant", "content": "c"}
    )
    # the same facts again as new units of work (new txn_id): rows of their own in activity
    step_again = _env(
        "agent.step", "rx", 8, {"run_id": run_id, "step": 3, "thought": "t"}, txn="rx:again:3"
    )
    called_again = _env(
        "tool.called",
        "rx",
        5,
        {"run_id": run_id, "call_id": "c1", "tool": "search", "arguments": {}},
        txn="rx:again:c1",
    )
    other = _env("agent.requested", "ry", 3, req)  # a second run, only requested
    # arrival order: the end first, the request last; two partitions; an exact copy of
    # `finished` redelivered (ingest drops it as a duplicate)
    partition_0 = [finished, step[2], called_again, failed_result, step_again, requested]
    partition_1 = [message, step[0], other, called, started, step[1], finished]

    async def ingest() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            claims = await claim(conn, "g", "test", [("t", 0), ("t", 1)])
        finally:
            await conn.close()
        epochs = {c.partition: c.epoch for c in claims}
        database = Database(dsn)
        writer = BatchWriter(database, "g", "w")
        try:
            offsets = {0: 0, 1: 0}
            for k in range(4):  # small batches, alternating partitions
                for p, envs in ((0, partition_0), (1, partition_1)):
                    part = envs[2 * k : 2 * k + 2]
                    if not part:
                        continue
                    first = offsets[p]
                    incoming = [
                        Incoming(Coord("t", p, first + j), _as_row(e)) for j, e in enumerate(part)
                    ]
                    rng = PartitionRange("t", p, first, first + len(part), epochs[p])
                    await writer.write(Batch(ranges=(rng,), events=incoming))
                    offsets[p] += len(part)
        finally:
            await database.close()

    run(ingest())
    assert db(dsn, "SELECT count(*) AS n FROM activity")[0]["n"] == 12  # the copy dropped
    small = ackline(dsn, "process", "runs", "--until-caught-up", "--batch-events", "2")
    assert small.code == 0, small.err[-2000:]
    assert small.report("runs")["batches"] >= 6
    got = stored_runs(dsn)
    assert got == rows(events_up_to(dsn, None))
    x = got["rx"]
    assert (x.status, x.steps, x.tool_calls, x.tool_failures, x.messages) == (
        "finished",
        3,
        1,
        1,
        1,
    )
    assert (x.requested_at, x.started_at, x.ended_at) == (
        T0,
        T0 + timedelta(seconds=1),
        T0 + timedelta(seconds=9),
    )
    assert x.duration == timedelta(seconds=8) and x.last_event_at == T0 + timedelta(seconds=9)
    assert (x.tokens_in, x.tokens_out, x.model, x.run_id) == (10, 5, "m", run_id)
    assert got["ry"].status == "requested" and got["ry"].steps == 0
    assert run(check_runs_at(dsn)).mismatches == 0

    assert ackline(dsn, "processors", "reset", "runs").code == 0
    whole = ackline(dsn, "process", "runs", "--until-caught-up")
    assert whole.code == 0 and whole.report("runs")["batches"] == 1
    assert stored_runs(dsn) == got  # one batch or eight: the same rows


def test_the_stuck_view(dsn: str) -> None:
    now = datetime.now(UTC)
    events = [
        Ev(
            "agent.started",
            "a",
            "quiet",
            now - timedelta(minutes=30),
            {"run_id": "q", "model": "m"},
            "s:q",
        ),
        Ev(
            "agent.started",
            "a",
            "busy",
            now - timedelta(minutes=30),
            {"run_id": "b", "model": "m"},
            "s:b",
        ),
        Ev(
            "agent.step",
            "a",
            "busy",
            now - timedelta(minutes=1),
            {"run_id": "b", "step": 1, "thought": "t"},
            "b:1",
        ),
        Ev(
            "agent.started",
            "a",
            "done",
            now - timedelta(minutes=30),
            {"run_id": "d", "model": "m"},
            "s:d",
        ),
        Ev(
            "agent.finished",
            "a",
            "done",
            now - timedelta(minutes=29),
            {"run_id": "d", "steps": 0, "tokens_in": 1, "tokens_out": 1, "summary": "s"},
            "d:1",
        ),
    ]
    write(dsn, events)
    assert ackline(dsn, "process", "runs", "--until-caught-up").code == 0

    async def stuck(conn: asyncpg.Connection) -> tuple[list[str], list[str]]:
        default = await conn.fetch("SELECT request_id FROM runs_stuck ORDER BY 1")
        await conn.execute("SET ackline.stuck_minutes = 0")
        eager = await conn.fetch("SELECT request_id FROM runs_stuck ORDER BY 1")
        return [r[0] for r in default], [r[0] for r in eager]

    default, eager = run(with_conn(with_user(dsn, "ackline_reader"), stuck))
    assert default == ["quiet"]  # started, no event for 30 minutes (> 15)
    assert eager == ["busy", "quiet"]  # every started run, however recent


# --- a processor that raises ---------------------------------------------------------------


def test_a_processor_that_raises_stops_at_that_event_and_resumes_there_once_fixed(
    dsn: str,
) -> None:
    spec = "tests.support.processors:PICKY"
    assert ackline(dsn, "processors", "setup", spec).code == 0
    events = steps_of("r1", 10)
    poison = events[5]
    poison.payload = {**poison.payload, "thought": "poison"}
    write(dsn, events, chunk=4)  # the poison sits inside an ingest transaction

    broken = ackline(dsn, "process", spec, "--until-caught-up")
    assert broken.code == 1, broken.err[-2000:]
    report = broken.report("picky")
    assert report["outcome"] == "failed"
    assert report["error_event_id"] == str(poison.event_id)
    assert "PoisonError: cannot digest step 6 of r1" in report["error"]
    assert f"stopped at event {poison.event_id}" in broken.err
    assert journal(dsn, "picky") == Counter(e.event_id for e in events[:5])
    shown = status(dsn, "picky")
    assert shown["state"] == "failed" and shown["error_event_id"] == str(poison.event_id)
    text = ackline(dsn, "processors", "status")
    assert f"stopped at event {poison.event_id}" in text.out
    assert "PoisonError" in text.out

    still = ackline(dsn, "process", spec, "--until-caught-up")
    assert still.code == 1
    assert still.report("picky")["error_event_id"] == str(poison.event_id)
    assert journal(dsn, "picky") == Counter(e.event_id for e in events[:5])  # nothing twice

    fixed = ackline(dsn, "process", spec, "--until-caught-up", PICKY_FIXED="1")
    assert fixed.code == 0, fixed.err[-2000:]
    assert fixed.report("picky")["applied"] == 5
    assert journal(dsn, "picky") == Counter(e.event_id for e in events)
    shown = status(dsn, "picky")
    assert shown["state"] == "ok" and shown["error"] is None


def _with_poison(dsn: str, spec: str) -> tuple[list[Ev], Ev]:
    """``spec``'s table set up, and ten steps written whose sixth is "poison"."""
    assert ackline(dsn, "processors", "setup", spec).code == 0
    events = steps_of("r1", 10)
    poison = events[5]
    poison.payload = {**poison.payload, "thought": "poison"}
    write(dsn, events, chunk=4)
    return events, poison


def test_a_pause_while_a_failing_batch_is_narrowed_down_is_kept(dsn: str) -> None:
    """An operator pauses a processor whose batch just failed (to look before it goes
    on). The re-reads that narrow the failure down to one event did not look at the
    flag: they went on applying the events before the poison, past the pause. Each
    re-read now checks it, as every other batch does. Found by a review."""
    events, poison = _with_poison(dsn, "tests.support.processors:PICKY")
    assert poison in events

    class Pausing(Picky):
        """Picky, whose first failing batch is paused by the operator as it fails."""

        paused = False

        async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> int:
            if not self.paused and len(batch.events) > 1:
                self.paused = True
                await with_conn(dsn, lambda c: set_paused(c, "picky", True))
            return await super().apply(conn, batch)

    runner = ProcessorRunner(Pausing(), instance="pausing", poll_interval=0.2)
    report = run(
        runner.run(connector(with_user(dsn, PROCESSOR), "pausing"), asyncio.Event(), wait=False)
    )
    assert (report.outcome, report.applied) == (Outcome.PAUSED, 0), report
    assert journal(dsn, "picky") == Counter()
    assert status(dsn, "picky")["state"] == "paused"


def test_an_os_error_of_the_processors_own_code_stops_it_at_that_event(dsn: str) -> None:
    """An OSError raised by the processor's code (a missing file), not by the database
    connection, is the processor's failure: it stops at that event instead of retrying
    the batch for ever as if the database were away."""
    spec = "tests.support.processors:LOST"
    events, poison = _with_poison(dsn, spec)

    broken = ackline(dsn, "process", spec, "--until-caught-up", timeout=60)
    assert broken.code == 1, broken.err[-2000:]
    report = broken.report("lost")
    assert report["outcome"] == "failed"
    assert report["error_event_id"] == str(poison.event_id)
    assert "FileNotFoundError: no model file for step 6" in report["error"]
    assert journal(dsn, "lost") == Counter(e.event_id for e in events[:5])


def test_a_committed_hook_that_raises_does_not_mark_a_processor_that_applied_its_batch(
    dsn: str,
) -> None:
    """`committed(batch, result)` runs after COMMIT, for in-memory statistics. One that
    raised was taken for the processor's failure outside any event: the processor was
    marked failed and stopped (exit 1), though the batch and its cursor had committed,
    and the next start went on past it anyway. It is now an ERROR line and a count of
    kind `committed`; the processor goes on."""
    spec = "tests.support.processors:MISCOUNTS"
    events, _ = _with_poison(dsn, spec)

    done = ackline(dsn, "process", spec, "--until-caught-up", timeout=60)
    assert done.code == 0, done.err[-2000:]
    report = done.report("miscounts")
    assert report["outcome"] == "caught_up" and report["applied"] == len(events), report
    assert "committed() raised after its batch committed" in done.err, done.err[-2000:]
    assert "ZeroDivisionError" in done.err, done.err[-2000:]
    assert journal(dsn, "miscounts") == Counter(e.event_id for e in events)
    assert status(dsn, "miscounts")["state"] != "failed"


@pytest.mark.parametrize("name", ["dawdler", "late_dawdler"])
def test_a_batch_held_idle_past_the_sessions_bound_stops_at_its_event(dsn: str, name: str) -> None:
    """A processor whose own code keeps its transaction idle past
    idle_in_transaction_session_timeout (a slow lookup of its own): the server ends the
    session, the next statement finds the connection closed, and that was taken for the
    database going away: the same whole batch was retried for ever, its status ok. Found
    by a review. Now the batch is the processor's failure when it held the transaction
    longer than the bound and the database answers at once on a new connection: halved,
    it stops at the event that dawdles, and the events before it are applied once.

    ``late_dawdler`` dawdles after its statement, so ``apply`` returns normally and the
    session's end shows at the runner's own next statement: a second review found that
    only a failure inside ``apply`` was looked at, and this one was retried for ever
    (`--until-caught-up` never ended)."""
    spec = f"tests.support.processors:{name.upper()}"
    events, poison = _with_poison(dsn, spec)

    broken = ackline(
        dsn,
        "process",
        spec,
        "--until-caught-up",
        timeout=90,
        ACKLINE_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS="300",
        DAWDLE_S="1.5",
    )
    assert broken.code == 1, broken.err[-2000:]
    report = broken.report(name)
    assert report["outcome"] == "failed", report
    assert report["error_event_id"] == str(poison.event_id), (report, broken.err[-3000:])
    assert "idle_in_transaction_session_timeout" in report["error"], report["error"]
    assert journal(dsn, name) == Counter(e.event_id for e in events[:5])


@pytest.mark.parametrize(
    ("name", "says"), [("swallower", "savepoint"), ("refused_at_commit", "refused at COMMIT")]
)
def test_a_batch_its_processor_leaves_failing_stops_at_its_event(
    dsn: str, name: str, says: str
) -> None:
    """Two failures of a processor that showed only after ``apply`` returned, each taken
    for a failure before any event: no event named, the events before it never applied,
    the same on every restart (found by a review). ``swallower`` catches a failing
    statement without a savepoint, leaving its transaction aborted for the runner's next
    statement; ``refused_at_commit``'s table refuses an event only at COMMIT (a deferred
    constraint trigger). Each is now the processor's failure, narrowed to its event, the
    error saying what happened."""
    spec = f"tests.support.processors:{name.upper()}"
    events, poison = _with_poison(dsn, spec)

    broken = ackline(dsn, "process", spec, "--until-caught-up", timeout=90)
    assert broken.code == 1, broken.err[-2000:]
    report = broken.report(name)
    assert report["outcome"] == "failed", report
    assert report["error_event_id"] == str(poison.event_id), (report, broken.err[-3000:])
    assert says in report["error"], report["error"]
    assert journal(dsn, name) == Counter(e.event_id for e in events[:5])


@pytest.mark.parametrize("name", ["rolling_back", "commits_midway"])
def test_an_apply_that_ends_its_transaction_itself_stops_the_processor(dsn: str, name: str) -> None:
    """A processor whose ``apply`` runs ROLLBACK itself and returns: the runner's COMMIT
    then committed nothing (PostgreSQL only warns), the batch was counted as applied, and
    the same batch came back for ever: `--until-caught-up` never ended (a review). A COMMIT
    of its own (then a BEGIN, and a raise: ``commits_midway``) moved the cursor with part
    of a batch, and narrowing the failure down read on from past it: the rest of the
    batch passed over in silence, exit 0 (a second review). The processor now stops at
    once, saying what it did and how to apply the batch again, and nothing it applied is
    applied twice."""
    spec = f"tests.support.processors:{name.upper()}"
    events, _ = _with_poison(dsn, spec)

    broken = ackline(dsn, "process", spec, "--until-caught-up", timeout=90)
    assert broken.code == 1, broken.err[-2000:]
    report = broken.report(name)
    assert report["outcome"] == "failed", report
    assert "COMMIT or ROLLBACK" in report["error"], report["error"]
    assert f"processors reset {name} --cursor-only --to-cursor" in report["error"]
    applied = journal(dsn, name)
    assert set(applied.values()) <= {1}, applied
    assert set(applied) <= {e.event_id for e in events[:5]}, applied  # none past it


# --- operating: pause, lag, metrics, SIGTERM ---------------------------------------------------


def test_a_late_failure_record_does_not_mark_a_processor_that_moved_on(dsn: str) -> None:
    """An instance that stopped at an event records where, after its batch rolled back and
    with retries. Another instance (a rolling deploy of the fix) may have committed past
    that event meanwhile, clearing the failure; the late record then set it again and
    `processors status` showed a moving processor as failed until its next batch (for
    good on a quiet feed). Found by a review."""
    first = ackline(dsn, "process", "runs", "--until-caught-up")  # registers it
    assert first.code == 0, first.err[-2000:]
    write(dsn, synthetic_runs(40, seed=7))
    moved = ackline(dsn, "process", "runs", "--until-caught-up")
    assert moved.code == 0 and moved.report("runs")["applied"] > 0, moved.err[-2000:]
    now = cursor_of(dsn, "runs")
    assert now is not None and now != START

    def fail_at(cursor: Cursor) -> Awaitable[None]:
        return with_conn(
            dsn, lambda c: record_failure(c, "runs", "boom", uuid.uuid4(), cursor, "old-instance")
        )

    run(fail_at(START))  # where the old instance's batch began: long passed
    assert status(dsn, "runs")["state"] != "failed", status(dsn, "runs")

    async def while_a_batch_moves_the_cursor() -> None:
        """Another instance's batch has moved the cursor and not committed yet: the late
        record waits for it, and finds the cursor moved."""
        mover = await asyncpg.connect(dsn)
        watch = await asyncpg.connect(dsn)
        late = await asyncpg.connect(  # as the processor's own role (privileges, RLS)
            with_user(dsn, PROCESSOR), server_settings={"application_name": "late-record"}
        )
        try:
            batch = mover.transaction()
            await batch.start()
            # as an instance does: only the filter in effect moves the cursor (0012's guard)
            await mover.execute(
                "SELECT set_config('ackline.processor_filter', "
                "ackline_processor_filter('runs'), true)"
            )
            await mover.execute(
                "UPDATE feed_cursors SET position = '1', version = version + 1 "
                "WHERE reader = 'runs'"
            )
            task = asyncio.create_task(
                record_failure(late, "runs", "boom", uuid.uuid4(), now, "old-instance")
            )
            await waiting_on_a_lock(watch, "late-record", task, "the late record")
            await batch.commit()
            await asyncio.wait_for(task, 30)
        finally:
            for conn in (mover, watch, late):
                await conn.close()

    run(while_a_batch_moves_the_cursor())
    assert status(dsn, "runs")["state"] != "failed", status(dsn, "runs")
    run(fail_at(Cursor(1)))  # where the cursor is: a failure of now
    assert status(dsn, "runs")["state"] == "failed", status(dsn, "runs")


def test_the_lag_and_the_head_count_an_erasure(dsn: str) -> None:
    """An erasure is a transaction of the feed (its notices, one per erased event). The
    lag and the head looked at ingest_batches alone: a processor that had applied the
    events an erasure then erased showed no lag while the notices waited, and a processor
    moved to the head (or started --from-now) after an erasure sat below it and was
    handed its notices, of events from before its start. Found by a review."""
    first = ackline(dsn, "process", "runs", "--until-caught-up")  # registers it
    assert first.code == 0, first.err[-2000:]
    events = synthetic_runs(60, seed=5)
    write(dsn, events)
    applied = ackline(dsn, "process", "runs", "--until-caught-up")
    assert applied.code == 0 and applied.report("runs")["applied"] == len(events)
    assert ackline(dsn, "processors", "pause", "runs").code == 0
    agent = Counter(e.agent_id for e in events).most_common(1)[0][0]
    erased = ackline(dsn, "erase", "--agent", agent, "--json")
    assert erased.code == 0, erased.err[-2000:]
    notices = int(json.loads(erased.out)["events"])
    assert notices > 0
    assert status(dsn, "runs")["lag_events"] == notices

    moved = ackline(dsn, "processors", "reset", "runs", "--to-now")
    assert moved.code == 0, moved.err[-2000:]
    assert status(dsn, "runs")["lag_events"] == 0
    assert ackline(dsn, "processors", "resume", "runs").code == 0
    after = ackline(dsn, "process", "runs", "--until-caught-up")
    assert after.code == 0, after.err[-2000:]
    assert after.report("runs")["applied"] == 0, after.report("runs")


def test_erasure_notices_are_not_counted_as_applied_events(dsn: str) -> None:
    """A processor handed an erasure's notices counted them in ``applied``, so an operator
    read more events applied than rows stored (22,600 against 22,227 rows and 373 erased,
    in a probe). Notices are counted apart, as ``erased``."""
    first = ackline(dsn, "process", "runs", "--until-caught-up")  # registers it
    assert first.code == 0, first.err[-2000:]
    events = synthetic_runs(60, seed=7)
    write(dsn, events)
    applied = ackline(dsn, "process", "runs", "--until-caught-up")
    assert applied.code == 0, applied.err[-2000:]
    assert applied.report("runs")["applied"] == len(events)
    agent = Counter(e.agent_id for e in events).most_common(1)[0][0]
    erased = ackline(dsn, "erase", "--agent", agent, "--json")
    assert erased.code == 0, erased.err[-2000:]
    notices = int(json.loads(erased.out)["events"])
    assert notices > 0
    after = ackline(dsn, "process", "runs", "--until-caught-up")
    assert after.code == 0, after.err[-2000:]
    report = after.report("runs")
    assert report["applied"] == 0, report
    assert report["erased"] == notices, report
    # `processors status` too: its applied column showed the cursor's delivered count,
    # which holds the notices (61 events applied and 19 notices showed 80)
    before = first.report("runs")["applied"]
    table = ackline(dsn, "processors", "status", "runs")
    assert table.code == 0, table.err[-2000:]
    row = next(line for line in table.out.splitlines() if line.startswith("runs "))
    assert row.split()[2:4] == [f"{before + len(events):,}", f"{notices:,}"], table.out
    shown = status(dsn, "runs")
    assert (shown["applied"], shown["erased"]) == (before + len(events), notices), shown
    assert shown["delivered"] == before + len(events) + notices, shown


def test_a_reader_on_a_database_without_the_erased_column_says_to_migrate(dsn: str) -> None:
    """The cursor's erasure-notice count is migration 0013's column: a processor or
    `processors status` of this version on a database migrated up to 0012 (a rollout that
    started the code first) stops with one line naming the migration, not an undefined
    column at the processor's first batch."""
    first = ackline(dsn, "process", "runs", "--until-caught-up")  # registers it
    assert first.code == 0, first.err[-2000:]
    db(dsn, "ALTER TABLE feed_cursors DROP COLUMN erased")
    db(dsn, "DELETE FROM schema_migrations WHERE version = 13")
    write(dsn, synthetic_runs(5, seed=3))
    stopped = ackline(dsn, "process", "runs", "--until-caught-up")
    assert stopped.code == 1, stopped.err[-2000:]
    assert "0013_feed_cursor_erased.sql" in stopped.report("runs")["error"], stopped.summary
    shown = ackline(dsn, "processors", "status", "runs")
    assert shown.code == 2, shown.err[-2000:]
    assert "run `ackline migrate` (0013_feed_cursor_erased.sql)" in shown.err, shown.err
    assert "Traceback" not in shown.err, shown.err[-2000:]


def test_pause_resume_lag_metrics_and_sigterm(dsn: str, tmp_path: Path) -> None:
    gone = ackline(dsn, "processors", "pause", "runs")
    assert gone.code == 2 and "no processor named 'runs'" in gone.err
    first = ackline(dsn, "process", "runs", "--until-caught-up")  # registers it
    assert first.code == 0 and first.report("runs")["applied"] == 0
    # a typo is refused in one line that names the registered processors (an operator
    # found pause naming none, and status exiting 1 after printing the table's header)
    for verb in ("pause", "resume", "status", "clear-superseded"):
        typo = ackline(dsn, "processors", verb, "ruuns")
        assert typo.code == 2, (verb, typo.code, typo.err[-2000:])
        assert "no processor named 'ruuns' (registered: runs;" in typo.err, (verb, typo.err)
        assert "Traceback" not in typo.err and typo.out == "", (verb, typo.out)
    assert ackline(dsn, "processors", "pause", "runs").code == 0
    events = synthetic_runs(300, seed=2)
    n = len(events)  # 300 and a few re-emitted
    write(dsn, events, chunk=100)
    paused = ackline(dsn, "process", "runs", "--until-caught-up")
    assert paused.code == 0 and paused.report("runs")["outcome"] == "paused"
    assert paused.report("runs")["applied"] == 0
    shown = status(dsn, "runs")
    assert (shown["state"], shown["lag_events"]) == ("paused", n)
    assert shown["lag_seconds"] > 0

    port = pick_free_port()
    proc = Process(
        dsn,
        tmp_path,
        "runs",
        "runs",
        ACKLINE_METRICS_PORT=str(port),
        ACKLINE_DB_CHECK_INTERVAL_S="0.5",
    )
    try:
        proc.wait_ready()
        lag = 'ackline_processor_lag_events{processor="runs"}'
        wait_until(lambda: scrape(port).get(lag) == n, 30, "the lag gauge")
        assert scrape(port)['ackline_processor_paused{processor="runs"}'] == 1
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            assert json.loads(resp.read())["ready"] is True
        assert ackline(dsn, "processors", "resume", "runs").code == 0
        applied = 'ackline_processor_events_total{processor="runs"}'
        wait_until(lambda: scrape(port).get(applied) == n, 60, "the events applied")
        wait_until(lambda: scrape(port).get(lag) == 0, 30, "the lag to drain")
        done = proc.stop()
    finally:
        proc.kill()
    assert done.code == 0, done.err[-2000:]
    assert done.report("runs")["outcome"] == "stopped"
    assert run(check_runs_at(dsn)).mismatches == 0


def test_sigterm_with_a_batch_stalled_before_commit_rolls_it_back_within_the_wait(
    dsn: str, tmp_path: Path
) -> None:
    proc = Process(
        dsn,
        tmp_path,
        "stalled",
        "runs",
        ACKLINE_FAULTS="processor_before_commit=stall",
        ACKLINE_FAULT_STALL_SECONDS="600",
        ACKLINE_SHUTDOWN_WAIT_S="1",
    )
    try:
        proc.wait_ready()
        events = synthetic_runs(500, seed=4)
        write(dsn, events, chunk=250)
        wait_until(lambda: "processor_before_commit fired: stall" in proc.log(), 60, "the stall")
        # the processor holds its transaction open (cursor row locked, effects written):
        # ingest does not wait for it
        more = synthetic_runs(300, seed=14)
        run(asyncio.wait_for(with_conn(dsn, lambda c: copy_ingest(c, more, 100)), 30))
        events += more
        t0 = time.monotonic()
        done = proc.stop(timeout=60)
        waited = time.monotonic() - t0
    finally:
        proc.kill()
    assert done.code == 0, done.err[-2000:]
    assert done.report("runs")["outcome"] == "cancelled"
    assert "shutdown wait (1s) ran out" in done.err
    assert waited < 60
    assert db(dsn, "SELECT count(*) AS n FROM runs")[0]["n"] == 0  # rolled back
    assert status(dsn, "runs")["delivered"] == 0
    again = ackline(dsn, "process", "runs", "--until-caught-up")
    assert again.code == 0 and again.report("runs")["applied"] == len(events)
    assert run(check_runs_at(dsn)).mismatches == 0


# --- least privilege ------------------------------------------------------------------------


def test_the_processor_role_reads_the_feed_and_writes_only_its_own(dsn: str) -> None:
    events = synthetic_runs(200, seed=6)
    write(dsn, events)
    db(dsn, "INSERT INTO feed_cursors (reader) VALUES ('ops')")  # a tail reader's cursor
    assert ackline(dsn, "process", "runs", "dispatcher", "--until-caught-up").code == 0
    requested = db(dsn, "SELECT count(*) AS n FROM activity WHERE type = 'agent.requested'")
    assert db(dsn, "SELECT count(*) AS n FROM agent_runs")[0]["n"] == requested[0]["n"] > 0
    role = with_user(dsn, PROCESSOR)

    async def probe(conn: asyncpg.Connection) -> None:
        assert await conn.fetchval("SELECT count(*) FROM activity") == len(events)
        assert await conn.fetchval("SELECT count(*) FROM runs") > 0
        for sql in (
            "INSERT INTO activity SELECT * FROM activity LIMIT 1",
            "UPDATE activity SET payload = '{}'",
            "DELETE FROM activity",
            "DELETE FROM runs",
            "TRUNCATE runs",
            "DELETE FROM run_facts",
            "UPDATE run_facts SET key = 'x'",
            "DELETE FROM feed_cursors",
            "DELETE FROM processors",
            "UPDATE processors SET paused = false",
            "INSERT INTO txn_ledger SELECT * FROM txn_ledger LIMIT 1",
            "UPDATE consumer_offsets SET epoch = 0",
            "CREATE TABLE sneaky (x int)",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(sql)
        # it records the filter in effect (0012), and nothing else of the control row
        assert await conn.execute(
            "UPDATE processors SET filter = filter, filter_at = now(), filter_instance = 'x' "
            "WHERE name = 'runs'"
        ) == ("UPDATE 1")
        # other readers' cursors: invisible and untouchable (row-level security)
        assert await conn.fetchval("SELECT count(*) FROM feed_cursors WHERE reader = 'ops'") == 0
        assert await conn.execute(
            "UPDATE feed_cursors SET position = '9' WHERE reader = 'ops'"
        ) == ("UPDATE 0")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # nor can it adopt one
            await conn.execute("INSERT INTO processors (name) VALUES ('ops')")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("INSERT INTO feed_cursors (reader) VALUES ('mine')")
        assert {r[0] for r in await conn.fetch("SELECT reader FROM feed_cursors")} == {
            "runs",
            "dispatcher",
        }

    run(with_conn(role, probe))
    assert (
        db(dsn, "SELECT position::text AS p FROM feed_cursors WHERE reader = 'ops'")[0]["p"] == "0"
    )
    hijack = ackline(dsn, "process", "tests.support.processors:OPS", "--until-caught-up")
    assert hijack.code == 1
    assert "already exists and is not a processor" in hijack.report("ops")["error"]


# --- the worked example, found by its entry point -------------------------------------------


def test_the_example_found_by_entry_point_counts_exactly_through_a_kill(
    dsn: str, tmp_path: Path
) -> None:
    dist = tmp_path / "ackline_example_daily-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: ackline-example-daily\nVersion: 0.1.0\n"
    )
    (dist / "entry_points.txt").write_text(
        "[ackline.processors]\ndaily_tool_calls = daily_tool_calls:PROCESSOR\n"
    )
    path = {"PYTHONPATH": f"{tmp_path}:{ROOT}:{EXAMPLE}"}
    listed = ackline(dsn, "processors", "list", "--json", **path)
    assert json.loads(listed.out)["daily_tool_calls"] == "daily_tool_calls:PROCESSOR"
    assert ackline(dsn, "processors", "setup", "daily_tool_calls", **path).code == 0
    write(dsn, synthetic_runs(3_000, seed=8), chunk=300)
    killed = ackline(
        dsn,
        "process",
        "daily_tool_calls",
        "--until-caught-up",
        "--batch-events",
        "100",
        ACKLINE_FAULTS="processor_before_commit=kill@2",
        **path,
    )
    assert killed.code == -signal.SIGKILL
    done = ackline(dsn, "process", "daily_tool_calls", "--until-caught-up", **path)
    assert done.code == 0, done.err[-2000:]
    got = {
        (r["agent_id"], r["day"], r["tool"]): (r["calls"], r["failures"])
        for r in db(dsn, "SELECT * FROM daily_tool_calls")
    }
    truth = db(
        dsn,
        "SELECT agent_id, (occurred_at AT TIME ZONE 'UTC')::date AS day, "
        "CASE WHEN type = 'tool.called' THEN payload->>'tool' ELSE '*' END AS tool, "
        "count(*) FILTER (WHERE type = 'tool.called') AS calls, "
        "count(*) FILTER (WHERE type = 'tool.result' AND payload->'ok' = 'false') AS failures "
        "FROM activity WHERE type IN ('tool.called', 'tool.result') GROUP BY 1, 2, 3",
    )
    want = {
        (r["agent_id"], r["day"], r["tool"]): (r["calls"], r["failures"])
        for r in truth
        if r["calls"] or r["failures"]
    }
    assert got == want and sum(c for c, _ in got.values()) > 100


def test_runs_check_sees_a_wrong_row(dsn: str) -> None:
    """The chaos verdict's check is not vacuous: a changed, a missing and an extra run."""
    write(dsn, synthetic_runs(400, seed=12))
    assert ackline(dsn, "process", "runs", "--until-caught-up").code == 0

    async def tamper(conn: asyncpg.Connection) -> Any:
        assert (await check_runs(conn)).mismatches == 0
        ids = [r[0] for r in await conn.fetch("SELECT request_id FROM runs ORDER BY 1 LIMIT 2")]
        await conn.execute("UPDATE runs SET steps = steps + 1 WHERE request_id = $1", ids[0])
        await conn.execute("DELETE FROM runs WHERE request_id = $1", ids[1])
        await conn.execute(
            "INSERT INTO runs (request_id, agent_id, first_event_at, last_event_at, active) "
            "VALUES ('ghost', 'a', now(), now(), true)"
        )
        return await check_runs(conn)

    found = run(with_conn(dsn, tamper))
    assert (found.different, found.missing, found.extra, found.mismatches) == (1, 1, 1, 3)


def test_a_rebuild_from_the_start_after_a_retention_drop_is_refused(dsn: str) -> None:
    """docs/retention.md advised `processors reset runs` after an erasure. Once retention
    has dropped a partition that held events, the feed no longer holds them: the reset
    emptied `runs` and the backfill rebuilt it without every run of the dropped days, for
    good. A rebuild from a cursor before the dropped events (the start, or --to-cursor)
    is refused now, the table kept, unless --accept-gap; a reset that keeps the state
    (--cursor-only) loses nothing and goes on."""
    write(dsn, steps_of("r-old", 5))
    done = ackline(dsn, "process", "runs", "--until-caught-up")
    assert done.code == 0, done.err[-2000:]
    assert db(dsn, "SELECT count(*) AS n FROM runs")[0]["n"] == 1
    tomorrow = next_utc_midnight(dsn)
    dropped = run(
        with_conn(dsn, lambda c: apply_retention(c, timedelta(0), now=tomorrow, force=True))
    )
    assert any(d.dropped for d in dropped), dropped
    refused = ackline(dsn, "processors", "reset", "runs")
    assert refused.code == 2, (refused.code, refused.err)
    assert "retention dropped 1 partition(s) holding events" in refused.err, refused.err
    assert "--accept-gap" in refused.err and "Traceback" not in refused.err, refused.err
    assert db(dsn, "SELECT count(*) AS n FROM runs")[0]["n"] == 1  # kept
    older = ackline(dsn, "processors", "reset", "runs", "--to-cursor", "1")  # before the drop
    assert older.code == 2 and "holding events after it" in older.err, (older.code, older.err)
    kept = ackline(dsn, "processors", "reset", "runs", "--cursor-only")  # loses nothing
    assert kept.code == 0, kept.err
    assert db(dsn, "SELECT count(*) AS n FROM runs")[0]["n"] == 1
    accepted = ackline(dsn, "processors", "reset", "runs", "--accept-gap")
    assert accepted.code == 0, accepted.err
    assert db(dsn, "SELECT count(*) AS n FROM runs")[0]["n"] == 0


def test_a_rebuild_from_a_cursor_past_the_readable_feed_is_refused(dsn: str) -> None:
    """An operator's hunt: `processors reset runs --to-cursor <a cursor from the future>`
    (a typo, another database's cursor) emptied `runs` and set the cursor past every
    transaction, so the rebuilt processor skipped what committed until the xids reached
    it. --cursor-only refused it already; the rebuild is refused now, the table kept."""
    write(dsn, steps_of("r-1", 3))
    done = ackline(dsn, "process", "runs", "--until-caught-up")
    assert done.code == 0, done.err[-2000:]
    ahead = ackline(dsn, "processors", "reset", "runs", "--to-cursor", str(2**62))
    assert ahead.code == 2, (ahead.code, ahead.out, ahead.err)
    assert "past the readable feed" in ahead.err and "Traceback" not in ahead.err, ahead.err
    assert db(dsn, "SELECT count(*) AS n FROM runs")[0]["n"] == 1  # kept
    back = ackline(dsn, "processors", "reset", "runs", "--to-cursor", "1")
    assert back.code == 0, back.err


def _old_events_dropped_by_retention(dsn: str) -> None:
    """Five events of run "r-old" written, then taken by a forced retention drop of
    today's partition, which is made anew for what the test writes next."""
    write(dsn, steps_of("r-old", 5))
    tomorrow = next_utc_midnight(dsn)
    dropped = run(
        with_conn(dsn, lambda c: apply_retention(c, timedelta(0), now=tomorrow, force=True))
    )
    assert any(d.dropped for d in dropped), dropped
    run(with_conn(dsn, lambda c: ensure_partitions(c, "day", 0)))  # today's, made anew


def test_a_processor_made_after_a_retention_drop_says_where_its_feed_starts(dsn: str) -> None:
    """A processor whose first run comes after a drop starts at the start of what the
    feed holds and says so (at INFO: it is where a new reader starts), as the processor
    role, which reads the columns of retention_drops that tell (migration 0014). Its
    rebuild is still refused: no clock safely tells a drop before its first run from one
    it read through (a review reproduced both ways a created_at rule lost a run); the
    refusal says when --accept-gap loses nothing, and with it the rebuild gives the same
    rows."""
    _old_events_dropped_by_retention(dsn)
    write(dsn, steps_of("r-new", 3))
    done = ackline(dsn, "process", "runs", "--until-caught-up")
    assert done.code == 0, done.err[-2000:]
    said = [line for line in done.err.splitlines() if "retention dropped 1 partition(s)" in line]
    assert len(said) == 1 and " INFO " in said[0], done.err
    assert "after cursor 0" in said[0], said
    assert [r["request_id"] for r in db(dsn, "SELECT request_id FROM runs")] == ["r-new"]
    refused = ackline(dsn, "processors", "reset", "runs")
    assert refused.code == 2, (refused.code, refused.err)
    assert "it loses nothing if 'runs' first ran after that drop" in refused.err, refused.err
    rebuilt = ackline(dsn, "processors", "reset", "runs", "--accept-gap")
    assert rebuilt.code == 0, rebuilt.err
    again = ackline(dsn, "process", "runs", "--until-caught-up")
    assert again.code == 0, again.err[-2000:]
    assert [r["request_id"] for r in db(dsn, "SELECT request_id FROM runs")] == ["r-new"]


def test_a_drop_is_told_once_across_the_retry_of_a_failing_batch(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A processor behind a retention drop says so as it starts. When a batch raised, the
    runner narrowed it down and then followed the feed again from the cursor, and each
    follow told the drop again while the cursor was still behind it: here the operator
    pauses the processor as its batch fails (the narrowing then stops at once, nothing
    committed), and it is resumed and run again in the same process. The drop is told
    once in the process."""
    caplog.set_level(logging.INFO, logger="ackline.sinks.feed.follow")
    setup_journal(dsn)
    _old_events_dropped_by_retention(dsn)
    events = steps_of("r-new", 10)
    write(dsn, events, chunk=10)

    class Hiccup(Journal):
        """A journal whose first batch of more than one event raises, once, as the
        operator pauses it to look."""

        name = "hiccup"
        raised = False

        async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> int:
            if not self.raised and len(batch.events) > 1:
                self.raised = True
                await with_conn(dsn, lambda c: set_paused(c, self.name, True))
                raise RuntimeError("a hiccup")
            return await super().apply(conn, batch)

    runner = ProcessorRunner(Hiccup(), instance="hiccup", poll_interval=0.2)
    connect = connector(with_user(dsn, PROCESSOR), "hiccup")
    report = run(runner.run(connect, asyncio.Event(), wait=False))
    assert (report.outcome, report.applied) == (Outcome.PAUSED, 0), report
    assert "retrying it in smaller batches" in caplog.text  # narrowed down, followed anew
    run(with_conn(dsn, lambda c: set_paused(c, "hiccup", False)))
    report = run(runner.run(connect, asyncio.Event(), wait=False))
    assert (report.outcome, report.applied) == (Outcome.CAUGHT_UP, len(events)), report
    said = [r for r in caplog.records if "retention dropped 1 partition(s)" in r.message]
    assert [r.levelno for r in said] == [logging.INFO], caplog.text  # a new one: where it starts
    assert journal(dsn, "hiccup") == Counter(e.event_id for e in events)


def test_a_cursor_only_reset_to_now_never_moves_the_cursor_back(dsn: str) -> None:
    """`processors reset NAME --to-now --cursor-only` reads the head before it locks the
    cursor row (it must, before its transaction holds an xid). An instance that committed
    a batch past that head in between had its cursor rewound to the head, and the batch,
    kept in the state, was applied again. The reset now keeps the later of the two: every
    event in the journal once. A cursor past the feed's newest transaction still goes
    back to the head."""
    setup_journal(dsn)
    role_dsn = with_user(dsn, PROCESSOR)

    async def catch_up(instance: str) -> None:
        runner = ProcessorRunner(JOURNAL, instance=instance)
        (report,) = await run_all(
            [runner], connector(role_dsn, instance), Stopping(asyncio.Event(), 30), wait=False
        )
        assert report.outcome is Outcome.CAUGHT_UP, report

    first, later = steps_of("r1", 5), steps_of("r2", 5)
    write(dsn, first)
    run(catch_up("a"))

    async def reset_meanwhile() -> Cursor:
        gate = PointGate("reset_after_head")
        conn = await asyncpg.connect(dsn)
        try:
            task = asyncio.create_task(reset(conn, "journal", None, None, faults=gate))
            await asyncio.wait_for(gate.reached.wait(), 30)
            await with_conn(dsn, lambda c: copy_ingest(c, later))  # past the head read
            await catch_up("b")  # applied, the cursor past the head
            applied = await with_conn(
                dsn,
                lambda c: c.fetchval("SELECT count(*) FROM journal WHERE processor = 'journal'"),
            )
            assert applied == len(first) + len(later)  # b applied them before the lock
            gate.release.set()
            return await task
        finally:
            await conn.close()

    moved = run(reset_meanwhile())
    assert moved == cursor_of(dsn, "journal")
    run(catch_up("c"))
    ingested = db(dsn, "SELECT event_id FROM activity")
    assert journal(dsn, "journal") == Counter(r["event_id"] for r in ingested)  # each once

    # a cursor past the feed (a database restored behind its readers) still goes back
    async def past_the_feed(conn: asyncpg.Connection) -> None:
        async with conn.transaction():  # as a restore would leave it: no filter guard
            await conn.execute("SET LOCAL session_replication_role = replica")
            await conn.execute(
                "UPDATE feed_cursors SET position = '999999999' WHERE reader = 'journal'"
            )

    run(with_conn(dsn, past_the_feed))
    back = ackline(dsn, "processors", "reset", "journal", "--to-now", "--cursor-only")
    assert back.code == 0, back.err
    at = cursor_of(dsn, "journal")
    assert at is not None and at.xid < 999999999, at


def test_a_cursor_only_reset_takes_the_forms_process_takes(dsn: str) -> None:
    """`processors reset --cursor-only` took its argument for the cursor's name as given,
    while its help (and `process`) take `module:attribute` too: that form failed with
    "has no cursor yet" (found by a review). It names the processor's cursor now; a bare
    name still needs no importable code (its cursor is moved by name)."""
    spec = "tests.support.processors:JOURNAL"
    setup_journal(dsn)
    write(dsn, steps_of("r1", 5))
    assert ackline(dsn, "process", spec, "--until-caught-up").code == 0
    assert cursor_of(dsn, "journal") is not None
    back = ackline(dsn, "processors", "reset", spec, "--cursor-only")
    assert back.code == 0, back.err[-2000:]
    assert "processor journal reset to cursor" in back.out, back.out
    assert cursor_of(dsn, "journal") == START
    gone = ackline(dsn, "processors", "reset", "no_such_processor", "--cursor-only")
    assert gone.code != 0 and "no_such_processor" in gone.err, gone.err[-2000:]


def test_a_retention_drop_during_a_rebuild_waits_and_keeps_what_the_rebuild_reads(
    dsn: str,
) -> None:
    """A rebuild checks for dropped events, then clears and rewinds. A drop that committed
    in between read the processor's cursor as it was (caught up), dropped the partition,
    and the rebuild, checked before it, went on without its events, for good. The
    rebuild now holds retention's lock from its check to its COMMIT: the drop waits, then
    finds the rewound cursor behind and keeps the partition."""
    write(dsn, steps_of("r-held", 5))
    done = ackline(dsn, "process", "runs", "--until-caught-up")
    assert done.code == 0, done.err[-2000:]
    tomorrow = next_utc_midnight(dsn)

    async def go() -> list[Any]:
        reached, release = asyncio.Event(), asyncio.Event()

        async def slow_clear(conn: asyncpg.Connection) -> None:  # a long DELETE
            await RUNS.reset(conn)
            reached.set()
            await release.wait()

        conn = await asyncpg.connect(dsn)
        other = await asyncpg.connect(dsn)
        try:
            rebuild = asyncio.create_task(reset(conn, "runs", START, slow_clear))
            await asyncio.wait_for(reached.wait(), 30)
            drop = asyncio.create_task(apply_retention(other, timedelta(0), now=tomorrow))
            await asyncio.sleep(2)  # the drop's own lock timeout is 10 s
            waited = not drop.done()
            release.set()
            await rebuild
            dropped = await drop
            assert waited, dropped
            return dropped
        finally:
            await conn.close()
            await other.close()

    busy = {
        f"activity_p{r['d']:%Y%m%d}"
        for r in db(dsn, "SELECT DISTINCT ingested_on AS d FROM activity")
    }
    looked = run(go())
    kept = {d.name: d for d in looked if d.name in busy}
    assert set(kept) == busy, looked
    assert all(not d.dropped and d.readers_behind == ("runs",) for d in kept.values()), looked
    assert db(dsn, "SELECT count(*) AS n FROM activity")[0]["n"] == 5


def test_a_following_processor_says_what_it_applied(dsn: str, tmp_path: Path) -> None:
    """`ackline process` following the feed logged nothing between its start line and its
    stop. Every ACKLINE_PROGRESS_LOG_S (1 s here) each processor says what it applied
    since the last line: those lines add up to the events applied, and a caught-up
    processor says nothing more applied."""
    proc = Process(dsn, tmp_path, "runs", "runs", ACKLINE_PROGRESS_LOG_S="1")

    def said() -> list[str]:
        return re.findall(r"progress: processor runs: (.*)", proc.log())

    def applied() -> int:
        found = (re.match(r"([\d,]+) events applied", line) for line in said())
        return sum(int(m.group(1).replace(",", "")) for m in found if m)

    try:
        proc.wait_ready()
        events = synthetic_runs(300, seed=6)
        write(dsn, events, chunk=100)
        wait_until(lambda: applied() == len(events), 60, "the lines to add up")
        wait_until(
            lambda: re.match(r"nothing applied .*; lag 0 events", said()[-1]) is not None,
            30,
            "a caught-up line",
        )
        quiet = len(said())
        time.sleep(4)  # four more seconds caught up: nothing more applied
        # (said once is the unit tests'; a lag sample that lands late may say one more)
        assert all(line.startswith("nothing applied") for line in said()[quiet:]), said()
        done = proc.stop()
    finally:
        proc.kill()
    assert done.code == 0, done.err[-2000:]
    assert done.report("runs")["applied"] == len(events)


def test_a_slow_connect_does_not_hide_a_batch_held_idle_past_the_sessions_bound(
    dsn: str, tmp_path: Path
) -> None:
    """The idle bound's probe (a new connection, then SELECT 1: is the database there?)
    was bounded by 5 s as a whole, below the connect's own bound
    (ACKLINE_DB_CONNECT_TIMEOUT_S, 10 s by default). Over a slow link (here Toxiproxy's
    3 s of latency on what PostgreSQL sends: a connect takes 6 s, its SELECT 1 3 s) the
    probe ran out, and the dawdling processor's batch was taken for the database going
    away and retried whole, for as long as the link was slow. The connect now has its own
    bound and the SELECT 1 5 s: the batch is halved at once (then the link is made fast
    again, or every later statement takes seconds), and the processor stops at the event
    that dawdles."""
    spec = "tests.support.processors:SLOW_TO_CONNECT"
    events, poison = _with_poison(dsn, spec)
    sizes = tmp_path / "sizes"
    with ToxiproxyServer.start() as server:
        proxy, relayed = relay_postgresql(server, dsn)
        slow = Process(
            relayed,
            tmp_path,
            "slow",
            spec,
            "--until-caught-up",
            ACKLINE_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS="300",
            ACKLINE_DB_CONNECT_TIMEOUT_S="20",
            DAWDLE_S="1",
            LATENCY_MS="3000",
            SIZES_FILE=str(sizes),
            TOXIPROXY_API=server.api.base_url,
            TOXIPROXY_PROXY=proxy.name,
        )
        try:
            deadline = time.monotonic() + 60
            while "in smaller batches" not in slow.log() and time.monotonic() < deadline:
                assert slow.proc.poll() is None, slow.log()[-3000:]
                time.sleep(0.2)
            assert "in smaller batches" in slow.log(), (
                "not halved in 60 s over the slow link: the probe took the processor's "
                f"idle transaction for the database going away\n{slow.log()[-3000:]}"
            )
            proxy.remove_toxic("slow")
            code = slow.proc.wait(60)
        finally:
            slow.kill()
    handed = [int(n) for n in sizes.read_text().split()]
    assert len(handed) >= 2 and handed[1] < handed[0], handed
    assert code == 1, slow.log()[-3000:]
    report = json.loads(slow.out_path.read_text().strip().splitlines()[-1])
    (mine,) = [r for r in report["processors"] if r["processor"] == "slow_to_connect"]
    assert mine["outcome"] == "failed", report
    assert mine["error_event_id"] == str(poison.event_id), (report, slow.log()[-3000:])
    assert journal(dsn, "slow_to_connect") == Counter(e.event_id for e in events[:5])
