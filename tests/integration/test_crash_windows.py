"""The 18 crash windows of docs/design.md, one test each, each proven by ``ackline.load.verify``.

Each test makes its window happen on purpose — an armed fault point
(``ACKLINE_FAULTS``, see ackline.core.faults), a SIGKILL, a SIGSTOP/SIGCONT, a
``pg_terminate_backend`` of the writer's backend (application_name ``ackline:<worker>``),
a PostgreSQL restart — waits on the condition that shows the window was hit, lets the
system recover (restart, reassignment), and ends with :func:`verify_ok`: zero lost, zero
duplicated, and exactly the expected duplicates, conflicts and rejects.

Tests that restart PostgreSQL or change server settings run on a private stack in a
temporary state directory (fixture ``private``), never on the shared one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from ackline.dev import stack
from ackline.load.generate import POISON_KINDS, Knobs, make_poison
from ackline.load.manifest import read_manifest
from ackline.load.verify import Verdict
from ackline.sinks.admin.migrate import migrate
from ackline.streams.admin import delete_topic, ensure_topic
from ackline.streams.errors import TopicError
from tests.integration.harness import Services, Worker, db, dsn_for, wait_until
from tests.integration.windows import (
    Item,
    Scenario,
    backends,
    batches,
    changed,
    commit_kafka_offsets,
    fired,
    kafka_committed,
    killed_by_point,
    offset_rows,
    produce_mix,
    read_topic,
    split_by_retention,
    step,
    terminate,
    verify_ok,
    wait_drained,
    watermarks,
    write_manifest,
)

pytestmark = pytest.mark.integration

FAST: dict[str, Any] = {"batch_max_events": 200, "session_timeout_ms": 3000}
"""Small batches (many windows per run) and a short session (expiry in seconds)."""
STEADY: dict[str, Any] = {"batch_max_events": 200, "session_timeout_ms": 10_000}
"""Small batches and a session the test never lets expire, long enough that a slow
broker's answers (two stacks and the chaos runs on two cores) do not cut the worker off
from its group: with FAST's 1.5 s grace that happened, and the stalled batch was fenced
instead of retried, the other correct path than the one the window means to prove."""
ONE_WRITER: dict[str, Any] = {**FAST, "writer_connections": 1}
"""FAST over one writer connection, for the windows that count the batches committed when
the Nth batch reaches a point: with two, the other connection's batches go on meanwhile
(its buffer fills while the first one's write is in flight), so the count is a race."""


def _finish(services: Services, dsn: str, topic: str, tmp_path: Path, manifest: Path) -> Verdict:
    """A fresh worker drains the topic; then the verdict must be exactly once."""
    group = f"g-{topic}"
    name = f"fin-{uuid.uuid4().hex[:4]}"
    last = Worker(services, dsn, topic, tmp_path, name=name, batch_max_events=1000)
    wait_drained(dsn, manifest, group, [last])
    assert last.stop() == 0, last.log()[-3000:]
    return verify_ok(dsn, manifest, group)


# --- a private stack for PostgreSQL restarts and server settings ----------------------


@pytest.fixture(scope="module")
def private() -> Iterator[Services]:
    """A Kafka broker and a PostgreSQL server of this module alone (temporary state)."""
    path = Path(tempfile.mkdtemp(prefix="ackline-windows-", dir="/tmp"))
    path.chmod(0o755)  # PostgreSQL runs as an unprivileged user when we are root
    try:
        info = stack.up(path)
        yield Services(info.kafka_bootstrap, info.database_url, path)
    finally:
        try:
            stack.down(path)
        finally:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def private_dsn(private: Services) -> str:
    name = f"w_{uuid.uuid4().hex[:10]}"

    async def create() -> None:
        conn = await asyncpg.connect(private.database_url)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        conn = await asyncpg.connect(dsn_for(private.database_url, name))
        try:
            await migrate(conn)
        finally:
            await conn.close()

    asyncio.run(create())
    return dsn_for(private.database_url, name)


@pytest.fixture
def private_topic(private: Services) -> Iterator[str]:
    name = f"p-{uuid.uuid4().hex[:10]}"
    ensure_topic(private.bootstrap, name, partitions=3)
    yield name
    for t in (name, f"{name}.dlq"):
        # the dead-letter topic exists only when a worker ran
        with contextlib.suppress(TopicError):
            delete_topic(private.bootstrap, t)


def _set_sync_standby(dsn: str, names: str | None) -> None:
    """ALTER SYSTEM synchronous_standby_names (None resets it) and reload."""
    if names is None:
        db(dsn, "ALTER SYSTEM RESET synchronous_standby_names")
    else:
        db(dsn, f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
    db(dsn, "SELECT pg_reload_conf()")


# --- the windows --------------------------------------------------------------------


def test_window_01_after_fetch_before_db_txn(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Killed with a fetched batch in hand: nothing of it reached PostgreSQL, the offset
    row did not move, and the next worker reads it again."""
    manifest = produce_mix(services, topic, tmp_path, 1500, seed=101)
    w1 = Worker(
        services, dsn, topic, tmp_path, name="w1", faults="after_fetch=kill@3", **ONE_WRITER
    )
    killed_by_point(w1, "after_fetch")
    assert batches(dsn) == 2
    _finish(services, dsn, topic, tmp_path, manifest)


def test_window_02_during_copy_insert(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Killed inside the transaction, after COPY into staging and before the INSERT:
    the server rolls the transaction back with the connection."""
    manifest = produce_mix(services, topic, tmp_path, 1500, seed=102)
    w1 = Worker(services, dsn, topic, tmp_path, name="w1", faults="mid_copy=kill@2", **ONE_WRITER)
    killed_by_point(w1, "mid_copy")
    assert batches(dsn) == 1
    wait_until(lambda: not backends(dsn, "w1"), 30, "the dead writer's backend to go")
    _finish(services, dsn, topic, tmp_path, manifest)


def test_window_03_connection_lost_during_commit(
    private: Services, private_dsn: str, private_topic: str, tmp_path: Path
) -> None:
    """The writer's backend is terminated (1) with its transaction complete but COMMIT not
    yet sent, and (2) while its COMMIT is in flight. (1) The transaction dies with the
    connection: the worker must learn by reading that it did not commit, and write it
    again. (2) The COMMIT is held in flight by a synchronous standby that does not exist:
    durable locally, its reply never comes, so the worker must learn by reading that it
    committed, and not write it again."""
    dsn, topic = private_dsn, private_topic
    manifest = produce_mix(private, topic, tmp_path, 3000, seed=103)
    group = f"g-{topic}"
    w1 = Worker(
        private,
        dsn,
        topic,
        tmp_path,
        name="w1",
        faults="before_commit=stall@2,after_fetch=stall@4",
        fault_stall_seconds=3,
        **STEADY,
    )
    wait_until(lambda: fired(w1, "before_commit"), 60, "the 2nd batch to stall before COMMIT")
    idle = backends(dsn, "w1", "state = 'idle in transaction'")
    assert terminate(dsn, [b["pid"] for b in idle]) == 1
    wait_until(lambda: "did not commit; retrying" in w1.log(), 60, "the worker to retry")

    wait_until(lambda: fired(w1, "after_fetch"), 60, "the 4th batch to wait after fetch")
    in_commit = "state = 'active' AND query ILIKE 'COMMIT%' AND wait_event = 'SyncRep'"
    _set_sync_standby(dsn, "ackline_ghost_standby")
    try:
        wait_until(lambda: bool(backends(dsn, "w1", in_commit)), 60, "a COMMIT in flight")
        before = batches(dsn)
        assert terminate(dsn, [b["pid"] for b in backends(dsn, "w1", in_commit)]) == 1
    finally:
        _set_sync_standby(dsn, None)
    wait_until(lambda: "reconciled by reading" in w1.log(), 60, "the worker to reconcile")
    assert batches(dsn) >= before + 1  # the terminated COMMIT had committed, once
    wait_drained(dsn, manifest, group, [w1])
    assert w1.stop() == 0, w1.log()[-3000:]
    verify_ok(dsn, manifest, group)


def test_window_04_after_db_commit_before_offset_store(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Killed after the DB commit and before the Kafka offset store: Kafka is behind
    the DB, and the restart resumes from the DB without repeating the batch."""
    manifest = produce_mix(services, topic, tmp_path, 1500, seed=104)
    group = f"g-{topic}"
    w1 = Worker(
        services, dsn, topic, tmp_path, name="w1", faults="after_commit=kill@2", **ONE_WRITER
    )
    killed_by_point(w1, "after_commit")
    assert batches(dsn) == 2
    rows = offset_rows(dsn, group)
    for partition, kafka in kafka_committed(services.bootstrap, group, topic, 3).items():
        assert kafka <= (rows[partition].next_offset or 0)
    _finish(services, dsn, topic, tmp_path, manifest)


def test_window_05_kafka_offset_ahead_of_db_offset(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Kafka's committed offsets are set far past the end, before the first start and
    again after a crash: the workers resume from the DB offsets (or the beginning where
    the DB has none), so nothing between the DB offset and Kafka's is skipped."""
    manifest = produce_mix(services, topic, tmp_path, 1500, seed=105)
    group = f"g-{topic}"
    far = {p: high + 1_000_000 for p, (_, high) in watermarks(services.bootstrap, topic, 3).items()}
    commit_kafka_offsets(services.bootstrap, group, topic, far)
    w1 = Worker(services, dsn, topic, tmp_path, name="w1", faults="after_commit=kill@3", **FAST)
    killed_by_point(w1, "after_commit")
    commit_kafka_offsets(services.bootstrap, group, topic, far)
    assert kafka_committed(services.bootstrap, group, topic, 3) == far
    rows = offset_rows(dsn, group)
    assert all((r.next_offset or 0) < far[p] for p, r in rows.items())
    _finish(services, dsn, topic, tmp_path, manifest)


@pytest.mark.parametrize("ending", ["killed", "cancelled"])
def test_window_06_revoke_while_transaction_in_flight(
    services: Services, dsn: str, topic: str, tmp_path: Path, ending: str
) -> None:
    """A second worker joins while the first holds an open transaction (stalled before
    COMMIT). killed: the first dies inside its revoke callback; the server rolls the
    transaction back. cancelled: the revoke wait runs out and the batch is cancelled;
    the partitions it keeps must be re-read from the DB offset, the revoked ones by
    the newcomer."""
    manifest = produce_mix(services, topic, tmp_path, 2500, seed=106)
    group = f"g-{topic}"
    faults = "before_commit=stall@3" + (",revoke_in_flight=kill" if ending == "killed" else "")
    a = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="a",
        faults=faults,
        fault_stall_seconds=40,
        revoke_wait_s=2,
        db_idle_in_transaction_timeout_ms=60_000,
        **FAST,
    )
    wait_until(lambda: fired(a, "before_commit"), 60, "a's 3rd batch to stall before COMMIT")
    assert backends(dsn, "a", "state = 'idle in transaction'")
    b = Worker(services, dsn, topic, tmp_path, name="b", **FAST)
    if ending == "killed":
        killed_by_point(a, "revoke_in_flight")
        alive = [b]
    else:
        wait_until(lambda: "cancelling it" in a.log(), 60, "a to cancel its batch")
        alive = [a, b]
    wait_drained(dsn, manifest, group, alive)
    for w in alive:
        assert w.stop() == 0, w.log()[-3000:]
    verify_ok(dsn, manifest, group)


@pytest.mark.parametrize("holding", ["fetched_batch", "open_transaction"])
def test_window_07_paused_worker_resumes_and_is_fenced(
    services: Services, dsn: str, topic: str, tmp_path: Path, holding: str
) -> None:
    """A worker holding a batch (fetched, or inside its transaction) is SIGSTOPped past
    its session timeout; an heir claims every partition; after SIGCONT the zombie's
    batch is fenced (by the epoch compare-and-set, or when its COMMIT finds its session
    gone and reading shows the epoch moved) and rolled back, and the metric counts it."""
    manifest = produce_mix(services, topic, tmp_path, 2500, seed=107)
    group = f"g-{topic}"
    point = "after_fetch" if holding == "fetched_batch" else "before_commit"
    z = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="z",
        faults=f"{point}=stall@3",
        fault_stall_seconds=8,
        db_idle_in_transaction_timeout_ms=2000,
        **FAST,
    )
    wait_until(lambda: fired(z, point), 60, f"the zombie to stall at {point}")
    z.signal(signal.SIGSTOP)
    try:
        h = Worker(services, dsn, topic, tmp_path, name="h", **FAST)
        wait_until(
            lambda: {r.owner for r in offset_rows(dsn, group).values()} == {"h"},
            60,
            "the heir to claim every partition",
        )
    finally:
        z.signal(signal.SIGCONT)
    z.release_stall()  # the heir holds every partition: what is left of the 8 s stall is padding
    wait_until(lambda: "fenced and rolled back" in z.log(), 60, "the zombie's batch to be fenced")
    assert z.metric("ackline_fenced_batches_total") >= 1
    wait_drained(dsn, manifest, group, [z, h])
    assert z.stop() == 0 and h.stop() == 0
    verify_ok(dsn, manifest, group)


@pytest.mark.parametrize("how", ["revoked", "lost"])
def test_window_08_lost_vs_revoked(
    services: Services, dsn: str, topic: str, tmp_path: Path, how: str
) -> None:
    """revoked (a newcomer joins): the revoke callback lets the batch in flight commit,
    nothing is fenced. lost (the worker exceeds max.poll.interval holding a batch, an
    heir takes its partitions): the stale batch is fenced and the lost callback runs."""
    manifest = produce_mix(services, topic, tmp_path, 2500, seed=108)
    group = f"g-{topic}"
    if how == "revoked":
        a = Worker(
            services,
            dsn,
            topic,
            tmp_path,
            name="a",
            faults="before_commit=stall@3",
            fault_stall_seconds=6,
            **FAST,
        )
        wait_until(lambda: fired(a, "before_commit"), 60, "a batch to stall before COMMIT")
        b = Worker(services, dsn, topic, tmp_path, name="b", **FAST)
        wait_until(lambda: "revoked [" in a.log(), 60, "a's partitions to be revoked")
        assert "in flight: letting it finish" in a.log()
        assert a.metric("ackline_fenced_batches_total") == 0
        assert "lost [" not in a.log()
    else:
        a = Worker(
            services,
            dsn,
            topic,
            tmp_path,
            name="a",
            faults="after_fetch=stall@2",
            fault_stall_seconds=15,
            max_poll_interval_ms=3000,
            **FAST,
        )
        # a alone owns every partition when it stalls; the heir joins only then, so it
        # cannot drain the topic before a reaches its second batch.
        wait_until(lambda: fired(a, "after_fetch"), 60, "a's batch to stall after fetch")
        b = Worker(services, dsn, topic, tmp_path, name="b", **FAST)  # the heir
        wait_until(
            lambda: {r.owner for r in offset_rows(dsn, group).values()} == {"b"},
            60,
            "the heir to claim every partition",
        )
        a.release_stall()  # its batch has an heir now (the 15 s stall only bounded the wait)
        wait_until(lambda: "fenced and rolled back" in a.log(), 90, "a's stale batch fenced")
        wait_until(lambda: "lost [" in a.log(), 60, "a's lost callback")
        assert a.metric("ackline_fenced_batches_total") >= 1
    wait_drained(dsn, manifest, group, [a, b])
    assert a.stop() == 0 and b.stop() == 0
    verify_ok(dsn, manifest, group)


def test_window_09_reassigned_to_same_worker_with_stale_batch(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """The only worker exceeds max.poll.interval holding a batch: it loses its
    partitions and gets them back (new epochs) with the stale batch still in flight.
    Nobody else claimed meanwhile, so the stale batch may commit; then the re-assigned
    partitions resume exactly at the DB offsets."""
    manifest = produce_mix(services, topic, tmp_path, 2000, seed=109)
    group = f"g-{topic}"
    a = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="a",
        faults="after_fetch=stall@3",
        fault_stall_seconds=7,
        max_poll_interval_ms=3000,
        **FAST,
    )
    wait_until(lambda: fired(a, "after_fetch"), 60, "a batch to stall after fetch")
    wait_until(lambda: a.log().count("assigned [") >= 2, 90, "the partitions to come back")
    assert "lost [" in a.log() or "revoked [" in a.log()
    wait_drained(dsn, manifest, group, [a])
    rows = offset_rows(dsn, group)
    assert {r.owner for r in rows.values()} == {"a"}
    assert {r.epoch for r in rows.values()} == {2}
    assert a.metric("ackline_fenced_batches_total") == 0
    assert a.stop() == 0
    verify_ok(dsn, manifest, group)


def test_window_10_between_epoch_bump_and_assign(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Killed after the claim bumped the epochs and before the partitions were
    assigned: the epochs are held by no one; the next claim bumps them again."""
    manifest = produce_mix(services, topic, tmp_path, 1500, seed=110)
    group = f"g-{topic}"
    w1 = Worker(services, dsn, topic, tmp_path, name="w1", faults="after_claim=kill@1", **FAST)
    killed_by_point(w1, "after_claim")
    rows = offset_rows(dsn, group)
    assert len(rows) == 3 and {r.epoch for r in rows.values()} == {1}
    assert batches(dsn) == 0
    _finish(services, dsn, topic, tmp_path, manifest)
    assert {r.epoch for r in offset_rows(dsn, group).values()} == {2}


def test_window_11_postgres_restart_and_connection_reset(
    private: Services, private_dsn: str, private_topic: str, tmp_path: Path
) -> None:
    """Two workers run through a fast PostgreSQL restart and a crash (SIGKILL, crash
    recovery), each while a batch is stalled inside its transaction, then through the
    termination of every ackline connection; no worker dies, nothing is lost or doubled."""
    dsn, topic = private_dsn, private_topic
    manifest = produce_mix(private, topic, tmp_path, 20_000, seed=111)
    group = f"g-{topic}"
    stall = {"fault_stall_seconds": 3, **FAST}
    # b starts once a's batch is stalled, and stalls at its own first batch: so b's stall
    # cannot fire and end before the restarts (it did when both started together and b
    # happened to get the partitions first).
    a = Worker(private, dsn, topic, tmp_path, name="a", faults="before_commit=stall@2", **stall)
    wait_until(lambda: fired(a, "before_commit"), 60, "a batch of a inside its transaction")
    b = Worker(private, dsn, topic, tmp_path, name="b", faults="before_commit=stall@1", **stall)
    stack.restart_postgres(private.state_dir, hard=False)
    wait_until(lambda: fired(b, "before_commit"), 60, "a batch of b inside its transaction")
    stack.restart_postgres(private.state_dir, hard=True)

    def reset_connections() -> bool:
        rows = db(
            dsn,
            "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity "
            "WHERE application_name LIKE 'ackline:%'",
        )
        return int(rows[0]["n"]) >= 1

    wait_until(reset_connections, 60, "a writer connection to reset")
    wait_drained(dsn, manifest, group, [a, b])
    for w in (a, b):
        assert w.stop() == 0, w.log()[-3000:]
        # Its stalled batch did not commit: written again by this worker, or, when the
        # other worker claimed its partitions while PostgreSQL was down (seen under two
        # test workers on two cores), fenced at reconciliation and re-read by that one.
        log = w.log()
        assert "did not commit; retrying" in log or "fenced and rolled back" in log, log[-3000:]
    verify_ok(dsn, manifest, group)


def test_window_12_replays_same_and_different_body(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """A committed range is replayed: the same bytes (duplicates), producer retries
    (duplicates), changed bodies under the same txn_id (ledger conflicts) and under the
    same event_id (primary-key conflicts); a crash after a commit in the middle of the
    replay must neither double-count nor lose a quarantined conflict."""
    group = f"g-{topic}"
    originals = [step(i, agent=f"agent-{i % 6}") for i in range(300)]
    sc = Scenario(services.bootstrap, topic, tmp_path / "replays.jsonl.gz")
    try:
        for k in range(0, 300, 100):
            sc.send([Item.event(e) for e in originals[k : k + 100]])
        manifest = sc.write()
        first = Worker(services, dsn, topic, tmp_path, name="w1", **FAST)
        wait_drained(dsn, manifest, group, [first])
        assert first.stop() == 0
        replay = [Item.event(e, "redelivery") for e in originals[:120]]
        replay += [
            Item.event(e.model_copy(update={"event_id": uuid.uuid4()}), "retry")
            for e in originals[120:160]
        ]
        replay += [
            Item.event(changed(e, eid=uuid.uuid4()), "conflict_ledger") for e in originals[160:200]
        ]
        replay += [
            Item.event(changed(e, txn=f"{e.txn_id}~again"), "conflict_pk")
            for e in originals[200:240]
        ]
        for k in range(0, len(replay), 60):
            sc.send(replay[k : k + 60])
        manifest = sc.write()
    finally:
        sc.close()
    w2 = Worker(
        services, dsn, topic, tmp_path, name="w2", faults="after_commit=kill@2", batch_max_events=50
    )
    killed_by_point(w2, "after_commit")
    verdict = _finish(services, dsn, topic, tmp_path, manifest)
    assert verdict.duplicates_expected == 160 and verdict.conflicts_expected == 80


def test_window_13_duplicates_inside_one_batch(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Copies of one event inside one batch (the same bytes, and a producer retry with a
    new event_id) keep one row; the batch is killed before COMMIT once and replayed."""
    group = f"g-{topic}"
    es = [step(i) for i in range(40)]
    items = [Item.event(e, partition=0) for e in es]
    items.insert(10, Item.event(es[3], "redelivery", partition=0))
    items.insert(20, Item.event(es[3], "redelivery", partition=0))
    retry = es[7].model_copy(update={"event_id": uuid.uuid4()})
    items.append(Item.event(retry, "retry", partition=0))
    sc = Scenario(services.bootstrap, topic, tmp_path / "in-batch.jsonl.gz")
    try:
        sent = sc.send(items)
        manifest = sc.write()
    finally:
        sc.close()
    settings: dict[str, Any] = {
        "batch_max_events": 500,
        "batch_linger_ms": 1500,
        "session_timeout_ms": 3000,
    }
    w1 = Worker(
        services, dsn, topic, tmp_path, name="w1", faults="before_commit=kill@1", **settings
    )
    killed_by_point(w1, "before_commit")
    assert batches(dsn) == 0
    w2 = Worker(services, dsn, topic, tmp_path, name="w2", **settings)
    wait_drained(dsn, manifest, group, [w2])
    assert w2.stop() == 0
    rows = db(dsn, "SELECT events, inserted, duplicates_ledger, ranges FROM ingest_batches")
    assert len(rows) == 1, rows  # the copies were inside the one batch
    assert (rows[0]["events"], rows[0]["inserted"], rows[0]["duplicates_ledger"]) == (43, 40, 3)
    assert json.loads(rows[0]["ranges"]) == {f"{topic}:0": [sent[0].offset, sent[-1].offset + 1]}
    verify_ok(dsn, manifest, group)


def test_window_14_concurrent_inserter_race(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Two workers insert the same txn_id at once (a copy re-keyed onto another
    partition): the second blocks on the first's uncommitted key, loses the race when it
    commits, rolls back, re-reads and records a duplicate instead of failing."""
    group = f"g-{topic}"
    slow: dict[str, Any] = {"faults": "before_commit=stall@1", "fault_stall_seconds": 3, **FAST}
    a = Worker(services, dsn, topic, tmp_path, name="a", **slow)
    b = Worker(services, dsn, topic, tmp_path, name="b", **slow)
    wait_until(
        lambda: len({r.owner for r in offset_rows(dsn, group).values()}) == 2,
        60,
        "both workers to own partitions",
    )
    owners = offset_rows(dsn, group)
    workers = {"a": a, "b": b}
    p_first = min(owners)
    first_owner = owners[p_first].owner
    p_second = next(p for p, r in owners.items() if r.owner != first_owner)
    winner = step(1, txn="shared-txn")
    sc = Scenario(services.bootstrap, topic, tmp_path / "race.jsonl.gz")
    try:
        sc.send([Item.event(winner, partition=p_first)])
        wait_until(
            lambda: fired(workers[first_owner], "before_commit"),
            60,
            "the first copy to be inserted and held before COMMIT",
        )
        copy = winner.model_copy(update={"event_id": uuid.uuid4()})
        sc.send([Item.event(copy, "retry", partition=p_second)])
        manifest = sc.write()
    finally:
        sc.close()
    second_owner = owners[p_second].owner
    wait_until(
        lambda: bool(backends(dsn, second_owner, "wait_event_type = 'Lock'")),
        60,
        "the second insert to wait on the first's uncommitted key",
    )
    # the race is set: the rest of the first's 3 s stall is padding, and so is the
    # second's, once it lost the race and holds its re-read batch before COMMIT
    workers[first_owner].release_stall()
    wait_until(
        lambda: fired(workers[second_owner], "before_commit"),
        60,
        "the second, past the race, to stall before its COMMIT",
    )
    workers[second_owner].release_stall()
    wait_drained(dsn, manifest, group, [a, b])
    assert a.stop() == 0 and b.stop() == 0
    verdict = verify_ok(dsn, manifest, group)
    assert verdict.duplicates_dropped == 1 and verdict.ingested == 1


def test_window_15_poison_and_schema_invalid(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Every kind of poison (undecodable bytes, schema-invalid events) is rejected with
    its reason, once, and dead-lettered; a kill after the dead-letter acknowledgement and
    before COMMIT repeats dead-letter records (never loses one) and never a reject row."""
    group = f"g-{topic}"
    rng = random.Random(115)
    knobs = Knobs(oversize_bytes=5000)  # the worker's limit below is 4096 bytes
    items: list[Item] = []
    for i, kind in enumerate(sorted(POISON_KINDS)):
        items.append(Item.event(step(i)))
        items.append(Item.bad(make_poison(kind, rng, step(100 + i), knobs), POISON_KINDS[kind]))
    sc = Scenario(services.bootstrap, topic, tmp_path / "poison.jsonl.gz")
    try:
        sc.send(items)
        manifest = sc.write()
    finally:
        sc.close()
    settings: dict[str, Any] = {
        "batch_max_events": 500,
        "batch_linger_ms": 1500,
        "max_message_bytes": 4096,
        "session_timeout_ms": 3000,
    }
    w1 = Worker(
        services, dsn, topic, tmp_path, name="w1", faults="before_commit=kill@1", **settings
    )
    killed_by_point(w1, "before_commit")
    w2 = Worker(services, dsn, topic, tmp_path, name="w2", **settings)
    wait_drained(dsn, manifest, group, [w2])
    assert w2.stop() == 0
    verdict = verify_ok(dsn, manifest, group)
    assert verdict.rejected == len(POISON_KINDS)
    dead = read_topic(services.bootstrap, f"{topic}.dlq", expected=2 * len(POISON_KINDS))
    copies: dict[tuple[int, int], int] = {}
    for m in dead:
        h = dict(m.headers() or [])
        where = (int(h["ackline.source.partition"] or -1), int(h["ackline.source.offset"] or -1))
        copies[where] = copies.get(where, 0) + 1
    rejects = db(dsn, "SELECT src_partition, src_offset, dlq_offset FROM rejects")
    assert {(r["src_partition"], r["src_offset"]) for r in rejects} == set(copies)
    assert set(copies.values()) == {2}  # sent before the kill, and again after it


def test_window_16_aborted_transactions_and_offset_gaps(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """A third of the upstream transactions abort (their records occupy offsets, then
    vanish under read_committed), and every commit leaves a marker: offsets are not
    contiguous. A kill mid-stream resumes at a DB offset that may be a marker's."""
    knobs = Knobs(redeliver=0.03, retry=0.02, poison=0.005, abort=0.33)
    manifest = produce_mix(services, topic, tmp_path, 3000, seed=116, knobs=knobs, txn_size=50)
    records = read_manifest(manifest).records
    aborted = [r for r in records if not r.committed]
    assert len(aborted) > 100
    committed_offsets = {(r.partition, r.offset) for r in records if r.committed}
    marks = watermarks(services.bootstrap, topic, 3)
    assert sum(high for _, high in marks.values()) > len(committed_offsets) + len(aborted)
    w1 = Worker(services, dsn, topic, tmp_path, name="w1", faults="after_commit=kill@4", **FAST)
    killed_by_point(w1, "after_commit")
    _finish(services, dsn, topic, tmp_path, manifest)
    verdict = verify_ok(dsn, manifest, "g-" + topic)
    assert verdict.aborted == len(aborted)
    nexts = {p: r.next_offset for p, r in offset_rows(dsn, "g-" + topic).items()}
    assert all(n is not None and (p, n) not in committed_offsets for p, n in nexts.items())


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_window_17_first_start_and_offset_deleted_by_retention(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str
) -> None:
    """First start: no offset row, the worker claims and reads from the log start.
    Retention: records past the stored DB offset are deleted (delete_records moves the
    log start beyond it) while no worker runs; the next worker (of either runtime)
    continues from the log start, reports the gap (log line and
    ackline_retention_skipped_offsets_total) and does not crash. The faust runtime
    skipped the gap silently before.

    Accounting: records deleted before any worker read them cannot be ingested; they
    are "lost by retention", not lost by ackline. The test removes exactly those — the
    manifest records at offsets in [DB offset, new log start) of each partition — from
    the manifest, and verify must then be exact on what remains (a copy of a deleted
    original that survived becomes the winner, as it does in the database)."""
    first = produce_mix(services, topic, tmp_path, 3000, seed=117)
    group = f"g-{topic}"
    assert offset_rows(dsn, group) == {}
    w1 = Worker(services, dsn, topic, tmp_path, name="w1", batch_max_events=60)
    wait_drained(dsn, first, group, [w1])
    assert w1.stop() == 0
    rows = offset_rows(dsn, group)
    assert {r.epoch for r in rows.values()} == {1}
    for p in range(3):  # read from the log start: the first committed record
        start = min(
            r.offset for r in read_manifest(first).records if r.committed and r.partition == p
        )
        assert _first_batched_offset(dsn, topic, p) == start
    # More records while no worker runs (group commit drains a first worker's topic before
    # it can be stopped part way): retention deletes some of them before anyone reads.
    second = read_manifest(produce_mix(services, topic, tmp_path, 1500, seed=118)).records
    loaded = read_manifest(first)
    shift = 1 + max(r.seq for r in loaded.records)
    tx = 1 + max(r.transaction for r in loaded.records)
    records = [
        *loaded.records,
        *(
            replace(
                r,
                seq=r.seq + shift,
                original=None if r.original is None else r.original + shift,
                transaction=r.transaction + tx,
            )
            for r in second
        ),
    ]

    marks = watermarks(services.bootstrap, topic, 3)
    stored = {p: rows[p].next_offset or 0 for p in range(3)}
    cut = {p: stored[p] + min(400, (marks[p][1] - stored[p]) // 2) for p in range(3)}
    gaps = {p: cut[p] - stored[p] for p in range(3)}
    assert all(g > 0 for g in gaps.values()), (stored, marks)
    admin = AdminClient({"bootstrap.servers": services.bootstrap})
    doomed = [TopicPartition(topic, p, o) for p, o in cut.items() if gaps[p]]
    for future in admin.delete_records(doomed).values():
        future.result(30)
    assert all(
        watermarks(services.bootstrap, topic, 3)[p][0] == cut[p] for p in range(3) if gaps[p]
    )

    kept, lost_by_retention = split_by_retention(records, stored, cut)
    assert lost_by_retention > 0
    readable = write_manifest(tmp_path / "readable.jsonl.gz", loaded.header, kept)
    w2 = Worker(services, dsn, topic, tmp_path, name="w2", runtime=runtime, **FAST)
    wait_drained(dsn, readable, group, [w2])
    assert w2.metric("ackline_retention_skipped_offsets_total") == sum(gaps.values())
    assert "deleted by retention" in w2.log()
    assert w2.stop() == 0
    verify_ok(dsn, readable, group)


def _first_batched_offset(dsn: str, topic: str, partition: int) -> int | None:
    rows = db(
        dsn,
        "SELECT min((r.value->>0)::bigint) AS o FROM ingest_batches b, jsonb_each(b.ranges) r "
        "WHERE r.key = $1",
        f"{topic}:{partition}",
    )
    return None if rows[0]["o"] is None else int(rows[0]["o"])


@pytest.mark.parametrize("ending", ["finishes", "rolled_back"])
def test_window_18_shutdown_with_write_in_flight(
    services: Services, dsn: str, topic: str, tmp_path: Path, ending: str
) -> None:
    """SIGTERM while a batch is stalled before COMMIT. finishes: the shutdown waits and
    the batch commits. rolled_back: the shutdown wait runs out, the batch is cancelled
    and rolled back. Either way the worker exits 0 and the next one resumes exactly."""
    manifest = produce_mix(services, topic, tmp_path, 1500, seed=118)
    extra: dict[str, Any] = (
        {"fault_stall_seconds": 3} if ending == "finishes" else {"shutdown_wait_s": 1}
    )
    w = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="w1",
        faults="before_commit=stall@2",
        **extra,
        **ONE_WRITER,
    )
    wait_until(lambda: fired(w, "before_commit"), 60, "the 2nd batch to stall before COMMIT")
    w.signal(signal.SIGTERM)
    assert w.stop(timeout=30) == 0, w.log()[-3000:]
    assert batches(dsn) == (2 if ending == "finishes" else 1)
    _finish(services, dsn, topic, tmp_path, manifest)
