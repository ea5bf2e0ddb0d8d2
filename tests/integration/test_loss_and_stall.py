"""Loss and stall paths that whole-process chaos does not reach (issue 11, items 1-3).

Each test makes one path happen on purpose and ends exactly once (``verify_ok``), with
the stalled partition either consumed by the worker that Kafka still assigns it to, or
reported as not consumed (metric, /readyz, an ERROR line) — never silently idle.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from ackline.dev.toxiproxy import ToxiproxyServer
from ackline.load.manifest import read_manifest
from ackline.sinks.connection import Database
from ackline.sinks.ingest.offsets import StuckWatch, claim
from ackline.streams.admin import delete_topic, ensure_topic
from ackline.streams.errors import TopicError
from tests.integration.harness import Services, Worker, db, relay_postgresql, run_async, wait_until
from tests.integration.windows import (
    Item,
    OffsetRow,
    Scenario,
    backends,
    batches,
    fired,
    killed_by_point,
    offset_rows,
    produce_mix,
    split_by_retention,
    step,
    verify_ok,
    wait_drained,
    watermarks,
    write_manifest,
)

pytestmark = pytest.mark.integration

FAST: dict[str, Any] = {"batch_max_events": 200, "session_timeout_ms": 3000}


@pytest.fixture
def topic1(services: Services) -> Iterator[str]:
    """A fresh 1-partition topic for one test (every record in one partition's order)."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    ensure_topic(services.bootstrap, name, partitions=1)
    yield name
    with contextlib.suppress(TopicError):
        delete_topic(services.bootstrap, name)


_NONE = OffsetRow(next_offset=None, epoch=0, owner="")


def _intrude(dsn: str, group: str, topic: str, partition: int) -> None:
    """Bump the epoch of one partition as a late claimer would (a worker that resumes
    inside its assign callback after the real owner claimed): no row is written."""

    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await claim(conn, group, "intruder", [(topic, partition)])
        finally:
            await conn.close()

    run_async(go())


def _readyz(worker: Worker) -> tuple[int, dict[str, Any]]:
    url = f"http://127.0.0.1:{worker.metrics_port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_item_1_batch_fenced_on_some_partitions_loses_nothing(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str
) -> None:
    """A batch over three partitions is fenced on one of them: the transaction rolls back
    on all three, so the worker must re-read the other two from their DB offsets. Before
    the fix the faust runtime took the next records of the others after the dropped
    batch, and the fence (next_offset <= first_offset) let that commit: lost."""
    group = f"g-{topic}"
    sc = Scenario(services.bootstrap, topic, tmp_path / "partial.jsonl.gz")
    try:
        sc.send([Item.event(step(i), partition=i % 3) for i in range(60)])
        w = Worker(
            services,
            dsn,
            topic,
            tmp_path,
            name="w",
            runtime=runtime,
            faults="after_fetch=stall@1",
            fault_stall_seconds=4,
            batch_max_events=500,
            batch_max_ms=1500,  # the faust runtime's take window
            batch_linger_ms=1500,  # the default runtime's: one batch over all partitions
        )
        wait_until(lambda: fired(w, "after_fetch"), 90, "the first batch to stall after fetch")
        _intrude(dsn, group, topic, 0)
        w.release_stall()  # the intruder's epoch is in: the rest of the 4 s stall is padding
        wait_until(lambda: "fenced and rolled back" in w.log(), 60, "the batch to be fenced")
        sc.send([Item.event(step(100 + i), partition=i % 3) for i in range(30)])
        manifest = sc.write()
    finally:
        sc.close()
    # The worker alone must finish: partition 0 is still assigned to it by Kafka.
    wait_drained(dsn, manifest, group, [w])
    assert w.stop() == 0, w.log()[-3000:]
    verify_ok(dsn, manifest, group)


def test_item_2_latest_resumes_where_the_first_claim_started(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """start_from=latest means where a group that never committed starts, once: a first
    worker that claimed and died before committing must not make the next one skip the
    records produced since. Before the fix the second worker sought to the log end and
    ingested none of them (and its --until-drained never returned)."""
    group = f"g-{topic}"
    w1 = Worker(
        services, dsn, topic, tmp_path, name="w1", start_from="latest", faults="after_fetch=kill@1"
    )
    wait_until(lambda: len(offset_rows(dsn, group)) == 3, 60, "w1 to claim every partition")
    manifest = produce_mix(services, topic, tmp_path, 1000, seed=211)
    killed_by_point(w1, "after_fetch")
    assert batches(dsn) == 0
    w2 = Worker(services, dsn, topic, tmp_path, name="w2", start_from="latest", **FAST)
    wait_drained(dsn, manifest, group, [w2])
    assert w2.stop() == 0, w2.log()[-3000:]
    verify_ok(dsn, manifest, group)


def test_item_2_latest_after_retention_resumes_at_the_log_start(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """With start_from=latest, a DB offset below the log start (retention deleted records
    no worker read) resumes at the log start and counts exactly the deleted offsets.
    Before the fix librdkafka's auto.offset.reset=latest jumped to the log end: the
    records between the log start and the end were skipped, unreported."""
    group = f"g-{topic}"
    sc = Scenario(services.bootstrap, topic, tmp_path / "retention.jsonl.gz")
    try:
        sc.send([Item.event(step(i), partition=i % 3) for i in range(150)])
        first = sc.write()
        w1 = Worker(services, dsn, topic, tmp_path, name="w1", batch_max_events=60)
        wait_drained(dsn, first, group, [w1])
        assert w1.stop() == 0
        # produced while no worker runs: retention deletes part of it before anyone reads
        sc.send([Item.event(step(1000 + i), partition=i % 3) for i in range(600)])
        manifest = sc.write()
    finally:
        sc.close()
    stored = {p: r.next_offset or 0 for p, r in offset_rows(dsn, group).items()}
    marks = watermarks(services.bootstrap, topic, 3)
    cut = {p: stored[p] + (marks[p][1] - stored[p]) // 3 for p in range(3)}
    gaps = {p: cut[p] - stored[p] for p in range(3)}
    assert all(gaps[p] > 0 and cut[p] < marks[p][1] for p in range(3)), (stored, marks)
    admin = AdminClient({"bootstrap.servers": services.bootstrap})
    doomed = [TopicPartition(topic, p, o) for p, o in cut.items()]
    for future in admin.delete_records(doomed).values():
        future.result(30)
    loaded = read_manifest(manifest)
    kept, _ = split_by_retention(loaded.records, stored, cut)
    readable = write_manifest(tmp_path / "readable.jsonl.gz", loaded.header, kept)
    w2 = Worker(services, dsn, topic, tmp_path, name="w2", start_from="latest", **FAST)
    wait_drained(dsn, readable, group, [w2])
    assert w2.metric("ackline_retention_skipped_offsets_total") == sum(gaps.values())
    assert w2.stop() == 0
    verify_ok(dsn, readable, group)


def test_item_3_fenced_on_a_partition_kafka_still_assigns_is_taken_back(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """A late claimer bumps the epoch of a partition this worker owns and Kafka still
    assigns to it: the next batch is fenced. The worker must take the partition back (a
    new claim) and go on. Before the fix it forgot the partition while Kafka kept it
    assigned: its records were discarded forever, its lag gauge removed, /readyz 200."""
    group = f"g-{topic}"
    first = produce_mix(services, topic, tmp_path, 600, seed=213)
    w = Worker(services, dsn, topic, tmp_path, name="w", **FAST)
    wait_drained(dsn, first, group, [w])
    _intrude(dsn, group, topic, 0)
    sc = Scenario(services.bootstrap, topic, tmp_path / "more.jsonl.gz", base=first)
    try:
        sc.send([Item.event(step(1000 + i), partition=i % 3) for i in range(90)])
        manifest = sc.write()
    finally:
        sc.close()
    wait_drained(dsn, manifest, group, [w])
    assert "fenced and rolled back" in w.log()
    assert w.metric("ackline_partitions_not_consumed") == 0
    assert w.stop() == 0, w.log()[-3000:]
    verify_ok(dsn, manifest, group)


def test_an_assign_does_not_wait_behind_a_blocked_retake(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Worker a is fenced on a partition it keeps, and its claim to take it back waits on
    a row lock it may not end (another role's open transaction). b stops, so Kafka
    assigns b's partition to a. The control connection serves one claim at a time: the
    assign's claim waited for the retake, and the new partition was not consumed, nor
    the rebalance ended, for as long as the lock was held. Now the assign abandons the
    retake and claims it again after the callback: a consumes b's partition while the
    lock is held; once it is let go, every event exactly once."""
    group = f"g-{topic}"
    first = produce_mix(services, topic, tmp_path, 300, seed=517)
    a = Worker(services, dsn, topic, tmp_path, name="a", faults="before_reread=stall", **FAST)
    wait_drained(dsn, first, group, [a])
    b = Worker(services, dsn, topic, tmp_path, name="b", **FAST)
    wait_until(lambda: "b" in {r.owner for r in offset_rows(dsn, group).values()}, 60, "b's claim")
    wait_until(lambda: "revoked [" in a.log(), 60, "a to give b its share")
    owners = {p: r.owner for p, r in offset_rows(dsn, group).items()}
    x = min(p for p, o in owners.items() if o == "a")
    z = next(p for p, o in owners.items() if o == "b")
    with _retake_behind_a_lock(services, dsn, a, topic, x, first, tmp_path) as sc:
        assert b.stop() == 0, b.log()[-3000:]
        manifest = _consumed_while_the_retake_waits(dsn, group, a, sc, z, "b's partition")
    wait_drained(dsn, manifest, group, [a])
    assert a.stop() == 0, a.log()[-3000:]
    verify_ok(dsn, manifest, group)


def test_a_claim_waiting_on_a_lock_past_the_leave_bound_does_not_leave_the_group(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Worker a's claim to take back a fenced partition waits on a row lock it may not end,
    its statements timing out, for longer than ``db_leave_after_s``. PostgreSQL answers
    (it only waits), so a stays in the group: its other partitions go on being consumed,
    and once the lock is let go, every event exactly once. Counting those timeouts as an
    outage made a leave the group, join again at once (its probe was answered) and claim
    every partition in its assign callback, behind the same lock: nothing was consumed,
    over and over, for as long as the lock was held."""
    group = f"g-{topic}"
    first = produce_mix(services, topic, tmp_path, 300, seed=518)
    a = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="a",
        faults="before_reread=stall",
        db_leave_after_s=2,
        db_statement_timeout_s=1,
        **FAST,
    )
    wait_drained(dsn, first, group, [a])
    with _retake_behind_a_lock(services, dsn, a, topic, 0, first, tmp_path) as sc:
        time.sleep(8)  # four times the bound, the claim's statements timing out meanwhile
        manifest = _consumed_while_the_retake_waits(dsn, group, a, sc, 1, "another partition")
        assert "leaving the consumer group" not in a.log(), a.log()[-3000:]
    wait_drained(dsn, manifest, group, [a])
    assert a.stop() == 0, a.log()[-3000:]
    verify_ok(dsn, manifest, group)


@contextlib.contextmanager
def _retake_behind_a_lock(
    services: Services, dsn: str, a: Worker, topic: str, x: int, first: Path, tmp_path: Path
) -> Iterator[Scenario]:
    """Worker a (armed with ``before_reread=stall``) fenced on partition ``x``, its claim
    to take it back waiting on a row lock of another role's open transaction; the lock is
    let go on leaving. Yields the scenario that adds records after ``first``."""
    group = f"g-{topic}"
    _intrude(dsn, group, topic, x)
    sc = Scenario(services.bootstrap, topic, tmp_path / "more.jsonl.gz", base=first)
    lock = _RowLock(dsn, group, topic, x)
    try:
        sc.send([Item.event(step(2000 + i), partition=x) for i in range(20)])
        wait_until(lambda: fired(a, "before_reread"), 60, "a's batch on the fenced partition")
        lock.take()
        a.release_stall()
        wait_until(lambda: _claim_waits(dsn, a.name), 60, "a's retake to wait on the lock")
        yield sc
    finally:
        lock.release()
        sc.close()


def _consumed_while_the_retake_waits(
    dsn: str, group: str, a: Worker, sc: Scenario, partition: int, what: str
) -> Path:
    """Send 20 records to ``partition``; a must commit them while its retake still waits.
    Returns the manifest of everything sent."""
    sent = sc.send([Item.event(step(3000 + i), partition=partition) for i in range(20)])
    manifest = sc.write()
    end = max(r.offset for r in sent) + 1  # the DB offset once they are all in

    def consumed() -> bool:
        row = offset_rows(dsn, group)[partition]
        return row.owner == a.name and (row.next_offset or 0) >= end

    wait_until(consumed, 60, f"a to consume {what} while its retake waits")
    assert _claim_waits(dsn, a.name), "the retake no longer waits: the test proves nothing"
    return manifest


def _claim_waits(dsn: str, worker: str) -> bool:
    """The worker's control connection (its claims) waits on a lock."""
    rows = db(
        dsn,
        "SELECT count(*) AS n FROM pg_stat_activity "
        "WHERE application_name = $1 AND wait_event_type = 'Lock'",
        f"ackline-control:{worker}",
    )
    return int(rows[0]["n"]) > 0


class _RowLock:
    """A partition's offset row locked by the test's own open transaction (a session of
    another role, which the worker's claim may not end: it waits)."""

    def __init__(self, dsn: str, group: str, topic: str, partition: int) -> None:
        self._args = (group, topic, partition)
        self._loop = asyncio.new_event_loop()
        self._conn: asyncpg.Connection = self._loop.run_until_complete(asyncpg.connect(dsn))
        self._tx: Any = None

    def take(self) -> None:
        async def go() -> None:
            self._tx = self._conn.transaction()
            await self._tx.start()
            await self._conn.execute(
                "SELECT 1 FROM consumer_offsets WHERE group_id = $1 AND topic = $2 "
                "AND partition = $3 FOR UPDATE",
                *self._args,
            )

        self._loop.run_until_complete(go())

    def release(self) -> None:
        if self._tx is not None:
            self._loop.run_until_complete(self._tx.rollback())
        self._loop.run_until_complete(self._conn.close())
        self._loop.close()


def test_item_3_a_db_offset_past_the_log_end_is_reported_not_skipped(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """A DB offset past the log end (the topic was recreated, or the log truncated) must
    not make the worker drop what the log holds as "already committed", nor idle in
    silence: the partition is not consumed, and the metric, /readyz and an ERROR line say
    so. The other partitions flow."""
    group = f"g-{topic}"
    sc = Scenario(services.bootstrap, topic, tmp_path / "m.jsonl.gz")
    try:
        sc.send([Item.event(step(i), partition=i % 3) for i in range(30)])
    finally:
        sc.close()
    db(
        dsn,
        "INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, epoch, owner) "
        "VALUES ($1, $2, 0, 5000, 1, 'gone')",
        group,
        topic,
    )
    w = Worker(services, dsn, topic, tmp_path, name="w", **FAST)
    wait_until(
        lambda: all((offset_rows(dsn, group).get(p) or _NONE).next_offset for p in (1, 2)),
        60,
        "partitions 1 and 2 to be ingested",
    )
    wait_until(lambda: w.metric("ackline_partitions_not_consumed") == 1, 30, "the stall metric")
    status, body = _readyz(w)
    assert status == 503, body
    assert any("not consumed" in reason for reason in body["reasons"]), body
    assert "past the log end" in w.log()
    assert offset_rows(dsn, group)[0].next_offset == 5000  # nothing skipped or rewritten
    assert w.stop() == 0


def test_held_partitions_whose_log_end_reached_their_db_offset_are_released_together(
    services: Services, dsn: str, tmp_path: Path
) -> None:
    """Partitions held because their DB offset is past the log end are released once the
    log end reaches it, read at each lag report (every 5 s). Their ends were asked of the
    consumer one partition after another, each waiting behind the consumer's long-poll
    fetch of the partitions that flow (up to fetch.wait.max.ms, 500 ms), within 1 s a
    report: about two a report, so the last of twelve was released half a minute after
    the first, its records waiting. They are asked in one request on the admin client's
    connection now: all twelve go in one report."""
    topic = f"t-{uuid.uuid4().hex[:12]}"
    ensure_topic(services.bootstrap, topic, partitions=24)
    group = f"g-{topic}"
    held = list(range(12))  # 12..23 flow (empty: the consumer long-polls them)
    for p in held:
        db(
            dsn,
            "INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, epoch, "
            "owner) VALUES ($1, $2, $3, 3, 1, 'gone')",
            group,
            topic,
            p,
        )
    w = Worker(services, dsn, topic, tmp_path, name="w", **FAST)
    try:
        wait_until(lambda: w.log().count("past the log end") >= len(held), 60, "held partitions")
        time.sleep(6)  # a lag report with nothing to release, then the long polls go on
        sc = Scenario(services.bootstrap, topic, tmp_path / "m.jsonl.gz")
        try:  # offsets 0-2 of each held partition and one record past, in one transaction
            sc.send([Item.event(step(i), partition=p) for p in held for i in range(4)])
        finally:
            sc.close()
        released = "the log end reached the DB offset"
        wait_until(lambda: w.log().count(released) >= len(held), 90, "every release")
        wait_until(
            lambda: all((offset_rows(dsn, group).get(p) or _NONE).next_offset == 4 for p in held),
            60,
            "the record past each DB offset to be ingested",
        )
        times = [
            datetime.fromisoformat(json.loads(line)["ts"])
            for line in w.log().splitlines()
            if released in line
        ]
        spread = (max(times) - min(times)).total_seconds()
        assert spread < 2.0, f"released over {spread:.1f} s"
    finally:
        assert w.stop() == 0


# A previous owner stopped inside a COPY: it claims, fences (the UPDATE that holds the offset
# rows' locks until its transaction ends), starts a COPY, and SIGSTOPs itself once the server
# waits for the COPY's data. Run as ackline_ingest, the workers' own role.
_STUCK_MID_COPY = """
import asyncio, os, signal, sys
import asyncpg
from ackline.sinks.ingest.offsets import claim

async def main(dsn, group, topic):
    conn = await asyncpg.connect(dsn, server_settings={"application_name": "ackline:gone"})
    await claim(conn, group, "gone", [(topic, p) for p in range(3)])
    await conn.execute("CREATE TEMP TABLE stuck (n int)")
    await conn.execute("BEGIN")
    await conn.execute(
        "UPDATE consumer_offsets SET updated_at = now() WHERE group_id = $1", group
    )

    async def rows():
        yield (1,)
        print(conn.get_server_pid(), flush=True)  # the server now waits for COPY data
        os.kill(os.getpid(), signal.SIGSTOP)
        yield (2,)

    await conn.copy_records_to_table("stuck", records=rows())

asyncio.run(main(*sys.argv[1:]))
"""


@contextlib.contextmanager
def _stuck_mid_copy(dsn: str, group: str, topic: str) -> Iterator[int]:
    """A previous owner of ``topic``'s three partitions in ``group``, stopped mid-COPY
    (:data:`_STUCK_MID_COPY`) for the block; its server session's pid."""
    ingest = dsn.replace("postgres@", "ackline_ingest@", 1)
    stuck = subprocess.Popen(
        [sys.executable, "-c", _STUCK_MID_COPY, ingest, group, topic],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stuck.stdout is not None
        yield int(stuck.stdout.readline())
    finally:
        stuck.kill()
        stuck.communicate(timeout=30)


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_a_previous_owner_stopped_mid_copy_does_not_stall_its_heir(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str
) -> None:
    """A worker stopped (SIGSTOP, a paused VM) while its COPY waits for data holds its
    fence's row locks for ever: PostgreSQL ends neither a COPY FROM STDIN waiting on its
    client (statement_timeout is not acted on while it reads from the client) nor the
    transaction (it is not idle), and the client's kernel keeps the socket alive. Before
    the fix, the heir's claim waited on those locks for ever: the chaos harness saw a
    zombie's partitions unclaimed for 180 s. The heir now ends a session that holds its
    partitions' rows while waiting on its client for longer than the statement bound."""
    group = f"g-{topic}"
    manifest = produce_mix(services, topic, tmp_path, 600, seed=241)
    with _stuck_mid_copy(dsn, group, topic) as pid:
        rows = db(dsn, "SELECT state, wait_event FROM pg_stat_activity WHERE pid = $1", pid)
        assert [tuple(r) for r in rows] == [("active", "ClientRead")]
        w = Worker(
            services,
            dsn,
            topic,
            tmp_path,
            name="w",
            runtime=runtime,
            db_statement_timeout_s=3,
            **FAST,
        )
        wait_drained(dsn, manifest, group, [w], timeout=60)
        assert not db(dsn, "SELECT 1 FROM pg_stat_activity WHERE pid = $1", pid)
        assert f"ended session {pid}" in w.log(), w.log()[-3000:]
        assert w.stop() == 0, w.log()[-3000:]
    verify_ok(dsn, manifest, group)
    assert {r.owner for r in offset_rows(dsn, group).values()} == {"w"}


def test_a_session_the_watch_ended_is_logged_when_the_claim_returns_first(
    dsn: str, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The watch ends a stuck holder; the holder's locks go at once, so the claim can
    return before the look has read pg_terminate_backend's answer. The claim then
    cancelled the look, and the line that says a session was ended (a transaction of
    another worker rolled back) was never written: a faust heir's log lacked it in a
    fresh run. Here the look's connection runs through a relay that delays every answer
    by 1 s (Toxiproxy's latency toxic), so the claim always returns first."""
    group = f"g-{topic}"
    with _stuck_mid_copy(dsn, group, topic) as pid, ToxiproxyServer.start() as server:
        proxy, relayed = relay_postgresql(server, dsn)
        proxy.add_latency("slow", 1000)
        watch = StuckWatch(lambda: asyncpg.connect(relayed), stuck_after_s=1, every_s=0.2)

        async def go() -> list[int]:
            heir = await asyncpg.connect(dsn)
            try:
                tps = [(topic, p) for p in range(3)]
                claimed = await asyncio.wait_for(claim(heir, group, "heir", tps, watch=watch), 60)
                return [c.epoch for c in claimed]
            finally:
                await heir.close()

        with caplog.at_level(logging.WARNING, logger="ackline.sinks.ingest.offsets"):
            epochs = run_async(go())
    assert epochs == [2, 2, 2], epochs
    assert not db(dsn, "SELECT 1 FROM pg_stat_activity WHERE pid = $1", pid)
    assert f"ended session {pid}" in caplog.text, caplog.text


def test_a_claim_waits_for_a_previous_owner_running_a_statement(dsn: str, topic: str) -> None:
    """Only a holder stuck on its client is ended: one running a statement (here a sleep)
    is waited for, however long, and its transaction commits first."""
    group = f"g-{topic}"
    tps = [(topic, p) for p in range(3)]
    watch = StuckWatch(lambda: asyncpg.connect(dsn), stuck_after_s=1, every_s=0.2)

    async def go() -> tuple[float, str, list[int | None]]:
        holder, heir = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
        try:
            await claim(holder, group, "slow", tps)
            await holder.execute("BEGIN")
            await holder.execute(
                "UPDATE consumer_offsets SET next_offset = 7 WHERE group_id = $1", group
            )
            working = asyncio.create_task(holder.execute("SELECT pg_sleep(4); COMMIT"))
            await asyncio.sleep(0.5)
            started = time.monotonic()
            claimed = await asyncio.wait_for(claim(heir, group, "heir", tps, watch=watch), 30)
            waited = time.monotonic() - started
            assert [c.epoch for c in claimed] == [2, 2, 2]
            return waited, await working, [c.next_offset for c in claimed]
        finally:
            await holder.close()
            await heir.close()

    waited, done, offsets = run_async(go())
    assert done == "COMMIT" and offsets == [7, 7, 7] and waited > 2, (waited, done, offsets)


def test_a_watched_claim_gives_way_to_every_cancellation(dsn: str, topic: str) -> None:
    """Cancelled at random moments while it waits for a held row (a stop request, faust's
    claim deadline), a watched claim must end at once every time. Reviews found two ways
    earlier versions lost a cancellation: asyncpg's ROLLBACK of a claim in a transaction,
    and Python 3.11's asyncio.wait_for, which returns a connection made just as the
    cancellation lands (in the connect of the watch's second connection). A lost one
    made the claim wait, then retry, for as long as the row was held."""
    group = f"g-{topic}"
    tps = [(topic, 0)]
    rng = random.Random(20261201)

    async def go() -> tuple[int, int, int]:
        holder = await asyncpg.connect(dsn)
        database = Database(dsn, statement_timeout=30, application_name="ackline:cancelled")
        looks = 0

        async def look() -> asyncpg.Connection:
            nonlocal looks
            looks += 1
            return await database.connect_aside()

        watch = StuckWatch(look, stuck_after_s=60, every_s=0.01)
        tries = 0
        try:
            await claim(holder, group, "slow", tps)
            await holder.execute("BEGIN")
            await holder.execute(
                "UPDATE consumer_offsets SET owner = 'slow' WHERE group_id = $1", group
            )
            started = time.monotonic()
            while time.monotonic() - started < 12:
                tries += 1
                deadline = rng.uniform(0.005, 0.05)
                attempt = asyncio.ensure_future(
                    asyncio.wait_for(
                        database.retrying(
                            "claim", lambda conn: claim(conn, group, "heir", tps, watch=watch)
                        ),
                        deadline,
                    )
                )
                done, _ = await asyncio.wait((attempt,), timeout=deadline + 5)
                if not done:
                    attempt.cancel()
                    return tries, 1, looks
                assert isinstance(attempt.exception(), TimeoutError), attempt.exception()
            return tries, 0, looks
        finally:
            await database.close()
            holder.terminate()

    tries, lost, looks = run_async(go())
    assert lost == 0, f"a cancellation was lost after {tries} cancelled claims"
    assert tries > 50 and looks > 10, (tries, looks)  # cancellations also landed in looks
    left = "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'ackline:cancelled'"
    wait_until(lambda: db(dsn, left)[0]["n"] == 0, 15, "no session of the claims left")


_FIRST_AND_NEXT = """
SELECT b.worker,
       min((r.value ->> 0)::bigint) FILTER (WHERE b.batch_id = f.first) AS first,
       max((r.value ->> 1)::bigint) AS next
FROM ingest_batches AS b
CROSS JOIN LATERAL jsonb_each(b.ranges) AS r
JOIN (SELECT worker, min(batch_id) AS first FROM ingest_batches GROUP BY worker) AS f
    ON f.worker = b.worker
GROUP BY b.worker
"""
"""Per worker: the first offset of its first batch, and the end of its last (the ranges
column is {"topic:partition": [first_offset, next_offset]}; one partition here)."""


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_a_standby_worker_takes_over_from_the_db_offset(
    services: Services, dsn: str, tmp_path: Path, runtime: str, topic1: str
) -> None:
    """More workers than partitions: b holds nothing until a, stopped inside a batch's
    transaction, loses the partition. faust left a standby's flow running at the revoke,
    so what b fetched while its claim waited (on a's row locks) reached the agent before
    the seek to the DB offset: its first batch started far past it and committed, and the
    seek back found the rest "already taken" (11,586 of 30,000 lost). b's first batch
    must start at the first record read at or after the end of a's last committed batch,
    and nothing may be lost."""
    topic = topic1
    manifest = produce_mix(services, topic, tmp_path, 30_000, seed=37, partitions=1)
    group = f"g-{topic}"
    common: dict[str, Any] = {"runtime": runtime, "batch_max_events": 300}
    a = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="a",
        faults="after_commit=stall@2,before_commit=stall@4",
        fault_stall_seconds=8,
        db_idle_in_transaction_timeout_ms=8500,
        **common,
    )
    wait_until(lambda: batches(dsn, "a") >= 2, 90, "worker a's first batches")
    b = Worker(services, dsn, topic, tmp_path, name="b", **common)
    if runtime == "faust":
        # b's join revokes a's partition (faust rebalances eagerly) and waits for a's stalled
        # batch: from there on, the rest of a's 8 s stall after its 2nd commit is padding
        wait_until(
            lambda: "Revoking previously assigned partitions frozenset(" in a.log(),
            60,
            "b's join to revoke a's partition",
        )
    else:
        # the default runtime's join of b waits for a's consumer, which the stall holds:
        # once b runs, the rest of a's 8 s stall after its 2nd commit is padding
        wait_until(lambda: "worker b starting" in b.log(), 60, "b to start")
    a.release_stall("after_commit")
    wait_until(
        lambda: bool(backends(dsn, "a", "state = 'idle in transaction'")),
        60,
        "a inside its stalled transaction",
    )
    a.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: batches(dsn, "b") >= 1, 120, "b to take over and commit")
    finally:
        a.kill()
    wait_drained(dsn, manifest, group, [b], 180)
    assert b.stop() == 0
    verify_ok(dsn, manifest, group)
    spans = {r["worker"]: (r["first"], r["next"]) for r in db(dsn, _FIRST_AND_NEXT)}
    first = first_readable(manifest, spans["a"][1])
    assert spans["b"][0] == first, f"{spans}: b should have started at {first}"


def first_readable(manifest: Path, offset: int) -> int:
    """The first offset at or after ``offset`` that read_committed delivers in the
    manifest's one partition: a's last batch may end right before a transaction's marker
    or an aborted transaction's records, which occupy offsets nobody reads."""
    records = read_manifest(manifest).records
    readable = sorted(r.offset for r in records if r.committed and r.offset >= 0)
    at = bisect.bisect_left(readable, offset)
    assert at < len(readable), f"no record at or after {offset}: a's batches ended past the log"
    return readable[at]


_LOSE_BATCHES = tuple(  # every row a batch writes, ingest_batches last
    f"DELETE FROM {table} WHERE batch_id IN (SELECT batch_id FROM ingest_batches)"
    for table in ("activity", "event_keys", "txn_ledger", "conflicts", "rejects", "ingest_batches")
)


def test_a_stop_while_a_fenced_batch_is_re_read_writes_nothing_past_it(
    services: Services, dsn: str, tmp_path: Path, topic1: str
) -> None:
    """A batch that did not commit, of a partition still owned: the worker re-reads the
    partition's offset row and rewinds. When a stop came first (SIGTERM during that read,
    or before it), the re-read was skipped and nothing else changed, and the same turn of
    the loop sent the records buffered behind the failed batch: the fence let them commit
    past it (the writer forgets where it left a batch that fails), and the failed batch's
    records were lost. Here the failure is the left-at check (the partition's row went
    back, as an asynchronous failover can leave it), and the stop lands while the worker
    stands at ``before_reread``."""
    topic = topic1
    manifest = produce_mix(services, topic, tmp_path, 3_000, seed=41, partitions=1)
    group = f"g-{topic}"
    a = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="a",
        faults="after_fetch=stall@2,before_reread=stall@1",
        fault_stall_seconds=4,
        batch_max_events=500,
        writer_connections=1,
    )

    async def roll_back_the_offset_row() -> None:
        """While batch 2 waits: lose batch 1 (its rows and the offset row back to 0, as
        an asynchronous failover can) inside a transaction that batch 2's fence waits
        on, and commit once the worker has buffered what follows."""
        conn, watch = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
        try:
            async with conn.transaction():
                for statement in _LOSE_BATCHES:  # what the failover lost with the offset
                    await conn.execute(statement)
                await conn.execute(
                    "UPDATE consumer_offsets SET next_offset = 0 WHERE group_id = $1", group
                )
                # batch 2 has its row lock to wait on now: the rest of its 4 s stall
                # after fetch is padding (the stall at before_reread is left whole)
                a.release_stall()
                deadline = time.monotonic() + 60
                while not await watch.fetchval(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = 'ackline:a' AND wait_event_type = 'Lock'"
                ):
                    assert time.monotonic() < deadline, "batch 2 never waited on its row"
                    await asyncio.sleep(0.05)
                await asyncio.sleep(1.5)  # the consumer buffers the next batch meanwhile
        finally:
            await conn.close()
            await watch.close()

    wait_until(lambda: fired(a, "after_fetch"), 90, "batch 2 to stall before its write")
    first = offset_rows(dsn, group)[0].next_offset
    assert first is not None and first > 0, first
    run_async(roll_back_the_offset_row())
    wait_until(lambda: fired(a, "before_reread"), 60, "the fenced batch's re-read")
    a.signal(signal.SIGTERM)
    assert a.stop() == 0, a.log()[-3000:]
    assert "fenced and rolled back" in a.log()
    # Nothing past the failed batch: the row is where the rollback put it.
    assert offset_rows(dsn, group)[0].next_offset == 0, a.log()[-3000:]
    b = Worker(services, dsn, topic, tmp_path, name="b", batch_max_events=500)
    wait_drained(dsn, manifest, group, [b])
    assert b.stop() == 0
    verify_ok(dsn, manifest, group)


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_a_re_read_whose_range_retention_deleted_goes_on_at_the_log_start(
    services: Services, dsn: str, tmp_path: Path, topic1: str, runtime: str
) -> None:
    """A batch that may not have committed is re-read from the DB offset, records above
    the highest offset fetched before it refused until the re-read's first arrives. When
    retention deletes past that offset first, Kafka resets the position to the log start
    and no such record ever comes: every record was refused, the partition stalled for
    good (a review found it in the ledger). The default runtime now re-reads from the log
    start and counts what retention took; the faust runtime, whose queues keep records
    fetched before a seek, rejoins the group and claims the partition again (it stalled
    until a restart before)."""
    topic, group = topic1, f"g-{topic1}"
    sc = Scenario(services.bootstrap, topic, tmp_path / "m.jsonl.gz")
    a: Worker | None = None
    try:
        sc.send([Item.event(step(i), partition=0) for i in range(200)])
        a = Worker(
            services,
            dsn,
            topic,
            tmp_path,
            name="a",
            runtime=runtime,
            faults="after_fetch=stall@2,before_reread=stall@1",
            fault_stall_seconds=120,
            batch_max_events=50,
            writer_connections=1,
        )
        wait_until(lambda: fired(a, "after_fetch"), 90, "batch 2 to stall before its write")
        committed = offset_rows(dsn, group)[0].next_offset
        assert committed is not None and 0 < committed < 200, committed
        _intrude(dsn, group, topic, 0)  # batch 2 is fenced: taken back, re-read from its row
        a.release_stall("after_fetch")
        wait_until(lambda: fired(a, "before_reread"), 60, "batch 2's re-read")
        # 0..199 are the first transaction's records, 200 its commit marker: the log
        # starts at a marker, so the re-read's first record is 201
        admin = AdminClient({"bootstrap.servers": services.bootstrap})
        for future in admin.delete_records([TopicPartition(topic, 0, 200)]).values():
            future.result(30)
        rows = db(dsn, "SELECT count(*) AS n FROM activity")[0]["n"]
        seen = len(a.log())
        a.release_stall("before_reread")
        # The records past the cut come once the partition is taken back (its claim runs
        # while the thread polls on): fetched before that, they would raise the mark
        # past the log start, and the re-read would pass it without retention's help.
        taken_back = "claimed [" if runtime == "confluent" else "took back ["
        wait_until(lambda: taken_back in a.log()[seen:], 60, "the partition to be taken back")
        sc.send([Item.event(step(1000 + i), partition=0) for i in range(100)])
        low, high = watermarks(services.bootstrap, topic, 1)[0]
        assert (low, high) == (200, 302), (low, high)
        wait_until(
            lambda: offset_rows(dsn, group)[0].next_offset == 301,
            60,
            "the records past retention's cut to be ingested",
        )
        assert db(dsn, "SELECT count(*) AS n FROM activity")[0]["n"] == rows + 100
        assert a.metric("ackline_retention_skipped_offsets_total") == 200 - committed
        assert "retention deleted the re-read" in a.log()
        assert a.stop() == 0, a.log()[-3000:]
    finally:
        sc.close()
        if a is not None and a.proc.poll() is None:
            a.kill()
