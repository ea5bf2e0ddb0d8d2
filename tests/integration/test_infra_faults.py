"""Faults beyond one process, short (issue 12; the long proof is `make chaos-infra`).

One stack for the whole module (ackline.dev.infra: three KRaft brokers, a PostgreSQL
primary with a streaming standby, a tmpfs tablespace per node, a Toxiproxy proxy per
client and server), in a temporary directory, stopped at the end. Each test leaves it
healthy for the next: after a failover the old primary is rebuilt as the standby.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from ackline.core.faults import Faults
from ackline.dev import infra as infra_stack
from ackline.dev.errors import DevStackError
from ackline.dev.infra import TMPFS_SIZE, Infra
from ackline.load.chaos.infra import readyz
from ackline.load.chaos.workers import FENCED_LINE
from ackline.load.generate import Knobs
from ackline.sinks.admin.migrate import migrate
from ackline.sinks.connection import Database
from ackline.sinks.errors import FeedError, FencedError
from ackline.sinks.feed.changefeed import LocalReader, Reader
from ackline.sinks.ingest.offsets import claim, locked_offsets
from ackline.sinks.ingest.writer import BatchWriter
from ackline.streams.admin import ensure_topic
from ackline.streams.aio_producer import AsyncActivityProducer
from ackline.streams.errors import ProduceError, TopicError, TransientProduceError
from ackline.streams.producer import ActivityProducer, Outgoing, prepare
from tests.integration.harness import Services, Worker, db, wait_until
from tests.integration.producing import committed_values, unit_of_work
from tests.integration.test_producer_refusals import _aio_send, _sync_send
from tests.integration.test_writer import GROUP, TOPIC, batch, row
from tests.integration.windows import produce_mix, verify_ok, wait_drained

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def infra() -> Iterator[Infra]:
    state = Path(tempfile.mkdtemp(prefix="ackline-infra-", dir="/tmp"))
    state.chmod(0o755)  # PostgreSQL runs as an unprivileged user when we are root
    stack: Infra | None = None
    try:
        stack = infra_stack.up(state, slots=3, mode="async", disk=True)
        yield stack
    finally:
        if stack is not None and stack.server is not None:
            # stopped through its Popen, which reaps it: a Popen collected while its
            # process still runs is a ResourceWarning, an error in whatever test is next
            stack.server.stop()
        infra_stack.down(state, wipe=True)
        shutil.rmtree(state, ignore_errors=True)


async def _fresh_database(infra: Infra) -> str:
    """A migrated database on the pair, replayed by the standby; its DSN lists both nodes
    (superuser). asyncpg gives up on a multi-host DSN at the first host that answers with
    an error, so a standby that has not replayed CREATE DATABASE yet would fail it."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    primary = infra.pair.primary
    conn = await asyncpg.connect(primary.dsn())
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    conn = await asyncpg.connect(primary.dsn(name))
    try:
        await migrate(conn)
    finally:
        await conn.close()
    while not infra.pair.standby_down and not infra.pair.caught_up():
        await asyncio.sleep(0.05)
    return infra.admin_dsn(name)


async def _claim(dsn: str, owner: str, partition: int) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        claims = await claim(conn, GROUP, owner, [(TOPIC, partition)])
    finally:
        await conn.close()
    return claims[0].epoch


async def _sql(dsn: str, sql: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        return str(await conn.fetchval(sql))
    finally:
        await conn.close()


async def _next_offset(dsn: str, partition: int) -> int | None:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await locked_offsets(conn, GROUP, [(TOPIC, partition)])
    finally:
        await conn.close()
    return rows[0].next_offset


async def _setup_seen(dsn: str) -> None:
    """A side-effect table of the stored reader, in the same database (a primary key)."""
    await _sql(dsn, "CREATE TABLE seen (event_id uuid PRIMARY KEY)")


async def _follow(dsn: str, reader: Reader | LocalReader) -> list[uuid.UUID]:
    """Read until caught up; a stored reader inserts each event into ``seen`` in the
    transaction that advances its cursor."""
    out: list[uuid.UUID] = []
    conn = await asyncpg.connect(dsn)
    try:
        await reader.position(conn)
        while True:
            async with reader.next_batch(conn) as fb:
                ids = [e.event_id for e in fb.events]
                if isinstance(reader, Reader) and ids:
                    await conn.execute("INSERT INTO seen SELECT unnest($1::uuid[])", ids)
            out += ids
            if fb.caught_up:
                return out
    finally:
        await conn.close()


async def _burn_xids(dsn: str, count: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for _ in range(count):
            await conn.fetchval("SELECT pg_current_xact_id()")
    finally:
        await conn.close()


def _rebuild(infra: Infra) -> None:
    """The crashed old primary becomes the standby again; its proxies come back."""
    infra.pair.rebuild("async")
    infra.set_node_reachable(infra.pair.standby.name, True)
    infra.record()


def test_async_failover_lost_commits_are_rewritten_not_skipped(infra: Infra) -> None:
    """An asynchronous failover loses acknowledged commits: rows and offset rows roll back
    together, so the writer must find its partitions behind where it left them and fail
    the batch (the runtime then re-reads from the DB offset), never commit past them.

    Two writers, one partition each. W had batch B1 acknowledged on the old primary and
    B2's COMMIT in flight when it died; on the new primary the sequence hands B2's batch
    id to another writer's batch (sequence values are reused after an async failover),
    so a reconcile that looks for the batch row by id finds it and takes B2 for
    committed. X had batch C1 acknowledged and lost, and writes C2 with no reconcile: a
    fence that only asks ``next_offset <= first_offset`` lets C2 commit past C1.
    """
    stall_s = 8.0

    async def go() -> None:
        dsn = await _fresh_database(infra)
        direct = infra.pair.primary.dsn(dsn.rsplit("/", 1)[1].split("?")[0])
        w_epoch, x_epoch, v_epoch = [
            await _claim(dsn, o, p) for o, p in (("w", 0), ("x", 1), ("v", 2))
        ]
        w_db = Database(dsn, statement_timeout=5, commit_timeout=5, application_name="ackline:w")
        x_db = Database(dsn, statement_timeout=5, commit_timeout=5, application_name="ackline:x")
        v_db = Database(dsn, statement_timeout=5, commit_timeout=5, application_name="ackline:v")
        w = BatchWriter(w_db, GROUP, "w", Faults("before_commit=stall@3", stall_s))
        x = BatchWriter(x_db, GROUP, "x")
        v = BatchWriter(v_db, GROUP, "v")
        await w.write(batch(0, [row(1), row(2)], w_epoch, partition=0))  # A: replicated
        await x.write(batch(0, [row(11), row(12)], x_epoch, partition=1))
        stored, local = Reader("r"), LocalReader()
        await _setup_seen(dsn)
        assert len(await _follow(dsn, stored)) == len(await _follow(dsn, local)) == 4
        while not infra.pair.caught_up():
            await asyncio.sleep(0.05)
        infra.pair.hold_wal_senders()  # from here on nothing reaches the standby
        await _burn_xids(direct, 200)  # the xids the new primary will hand out again
        await _sql(direct, "SELECT setval('ingest_batch_id_seq', 1000)")
        await x.write(batch(2, [row(13), row(14)], x_epoch, partition=1))  # C1, acknowledged
        b1 = await w.write(batch(2, [row(3), row(4)], w_epoch, partition=0))
        assert b1.batch_id == 1002  # so B2 takes 1003
        # Both readers see C1 and B1 on the old primary; the stored one commits its cursor
        # (and its side effect) there too: lost with the primary, with what it read.
        assert len(await _follow(dsn, stored)) == len(await _follow(dsn, local)) == 4
        b2 = asyncio.ensure_future(w.write(batch(4, [row(5), row(6)], w_epoch, partition=0)))
        while (
            await _sql(
                infra.pair.primary.dsn(),
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ackline:w' "
                "AND state = 'idle in transaction' AND query LIKE '%pg_notify%'",
            )
            != "1"
        ):
            await asyncio.sleep(0.05)  # B2 took batch id 1003 and stalls before its COMMIT
        await asyncio.to_thread(infra.pair.crash)
        infra.set_node_reachable(infra.pair.primary.name, False)
        await asyncio.to_thread(infra.pair.promote)
        infra.record()
        new = infra.pair.primary.dsn(dsn.rsplit("/", 1)[1].split("?")[0])
        assert await _next_offset(new, 0) == 2  # A survived, B1 rolled back with its row
        await _sql(new, "SELECT setval('ingest_batch_id_seq', 1002)")
        reused = await v.write(batch(0, [row(21)], v_epoch, partition=2))
        assert reused.batch_id == 1003  # the id B2 took on the old primary
        with pytest.raises(FencedError):
            await b2  # B2 did not commit, and B1 is gone: the writer must not go on
        with pytest.raises(FencedError):
            await x.write(batch(4, [row(15), row(16)], x_epoch, partition=1))  # C2
        assert await _next_offset(new, 0) == 2
        assert await _next_offset(new, 1) == 2
        # What the runtime does next: re-read from the DB offsets, in order.
        await w.write(batch(2, [row(3), row(4)], w_epoch, partition=0))
        await w.write(batch(4, [row(5), row(6)], w_epoch, partition=0))
        await x.write(batch(2, [row(13), row(14)], x_epoch, partition=1))
        await x.write(batch(4, [row(15), row(16)], x_epoch, partition=1))
        for database in (w_db, x_db, v_db):
            await database.close()
        assert await _sql(new, "SELECT count(*) FROM activity") == "13"
        # The stored reader's cursor rolled back with the batches it had read: it reads
        # what the new primary has, each event once (its side effect table has a primary
        # key), and ends with every event exactly once.
        await _follow(dsn, stored)
        assert await _sql(new, "SELECT count(*) FROM seen") == "13"
        assert (
            await _sql(new, "SELECT count(*) FROM activity a JOIN seen s USING (event_id)") == "13"
        )
        # The in-memory reader's cursor is past xids the new primary handed out again
        # (docs/changefeed.md says so). While the new primary's own xids are below that
        # cursor the read refuses (FeedError, naming the failover); once they pass it, it
        # skips the batches that took the reused xids (here V's). It had shown B1 and C1
        # before they were rewritten.
        horizon = int(await _sql(new, "SELECT pg_snapshot_xmax(pg_current_snapshot())"))
        if local.cursor.xid >= horizon:
            with pytest.raises(FeedError, match="asynchronous failover"):
                await _follow(dsn, local)
        else:
            after = await _follow(dsn, local)
            assert uuid.UUID(int=21) not in after
        offsets = await _sql(
            new,
            "SELECT string_agg(next_offset::text, ',' ORDER BY partition) FROM consumer_offsets",
        )
        assert offsets == "6,6,1"

    try:
        asyncio.run(go())
    finally:
        if infra.pair.standby_down:
            _rebuild(infra)


# ---- worker processes behind their own proxies --------------------------------------

CLEAN = Knobs(
    redeliver=0.03, retry=0.02, conflict_ledger=0.0, conflict_pk=0.0, poison=0.0, abort=0.03
)
"""No poison: a worker must not reach the dead-letter topic while its Kafka link is cut,
and a disk-full episode must leave ``rejects`` empty."""


def _database(infra: Infra) -> tuple[str, str]:
    dsn = asyncio.run(_fresh_database(infra))
    return dsn, dsn.rsplit("/", 1)[1].split("?")[0]


def _rf3_topic(infra: Infra) -> str:
    """A 3-partition topic and its dead-letter topic, replication factor 3."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    for topic in (name, f"{name}.dlq"):
        for attempt in range(15):
            try:
                ensure_topic(
                    infra.bootstrap, topic, 3, {"min.insync.replicas": "2"}, replication_factor=3
                )
                break
            except TopicError:
                if attempt == 14:
                    raise
                time.sleep(2)
    return name


def _direct(infra: Infra) -> Services:
    return Services(infra.bootstrap, infra.admin_dsn(), infra.state_dir)


def _worker(
    infra: Infra, slot: int, db: str, topic: str, log_dir: Path, name: str, **settings: Any
) -> Worker:
    """`ackline run` reaching Kafka and PostgreSQL only through slot ``slot``'s proxies."""
    services = Services(infra.slot_bootstrap(slot), "", infra.state_dir)
    bounds = {
        "db_statement_timeout_s": 3,
        "db_commit_timeout_s": 3,
        "db_connect_timeout_s": 2,
        "batch_max_events": 200,
        **settings,
    }
    return Worker(services, infra.slot_dsn(slot, db), topic, log_dir, name=name, **bounds)


def _owned(dsn: str, group: str, worker: str) -> set[int]:
    rows = db(
        dsn,
        "SELECT partition FROM consumer_offsets WHERE group_id = $1 AND owner = $2",
        group,
        worker,
    )
    return {int(r["partition"]) for r in rows}


def _batches(dsn: str) -> int:
    return int(db(dsn, "SELECT count(*) AS n FROM ingest_batches")[0]["n"])


def test_a_black_hole_during_commit_longer_than_the_statement_timeout(
    infra: Infra, tmp_path: Path
) -> None:
    """The worker's PostgreSQL link goes dark while its COMMIT is in flight (held by a
    synchronous standby that never answers, released once the hole is on): the server
    commits, the reply is lost. The COMMIT times out, the reconcile waits out the hole and
    finds the batch committed by reading its offset rows; nothing twice, nothing lost."""
    dsn, name = _database(infra)
    topic = _rf3_topic(infra)
    manifest = produce_mix(_direct(infra), topic, tmp_path, 6000, seed=21, knobs=CLEAN)
    worker = _worker(infra, 0, name, topic, tmp_path, "h0")
    wait_until(lambda: _batches(dsn) >= 2, 120, "the worker's first batches")
    in_commit = (
        "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'ackline:h0' "
        "AND state = 'active' AND query ILIKE 'COMMIT%' AND wait_event = 'SyncRep'"
    )
    admin = infra.admin_dsn()
    proxies = infra.pg_proxies(0)
    db(admin, "ALTER SYSTEM SET synchronous_standby_names = 'ackline_test_ghost'")
    db(admin, "SELECT pg_reload_conf()")
    try:
        wait_until(lambda: db(admin, in_commit)[0]["n"] == 1, 60, "the worker's COMMIT in flight")
        for proxy in proxies:
            proxy.add_timeout("hole", 0, "both")
    finally:
        infra.pair.set_mode(infra.pair.mode)  # the held COMMIT completes on the server
    # The hole outlasts the 3 s COMMIT bound and a reconcile that meets it (connect bound
    # 2 s): the reconcile waits it out, however long it lasts.
    wait_until(
        lambda: "reconcile: transient PostgreSQL error" in worker.log(),
        60,
        "the reconcile to meet the hole",
    )
    for proxy in proxies:
        proxy.remove_toxic("hole")
    wait_drained(dsn, manifest, f"g-{topic}", [worker])
    verify_ok(dsn, manifest, f"g-{topic}")
    log = worker.log()
    assert "COMMIT outcome unknown" in log and "had committed; reconciled by reading" in log
    worker.stop()


def test_a_kafka_black_hole_past_the_session_timeout(infra: Infra, tmp_path: Path) -> None:
    """Every Kafka link of a worker holding a batch goes dark past its session timeout:
    the other worker takes all its partitions, its batch is fenced when it writes it, and
    once the link is back it owns partitions again; exactly once throughout."""
    dsn, name = _database(infra)
    topic = _rf3_topic(infra)
    group = f"g-{topic}"
    manifest = produce_mix(_direct(infra), topic, tmp_path, 9000, seed=22, knobs=CLEAN)
    cut = _worker(
        infra, 0, name, topic, tmp_path, "k0", faults="after_fetch=stall@3", fault_stall_seconds=25
    )
    # k1 starts once k0 holds its batch: started together, k1 could ingest the whole topic
    # before k0 joined, and k0 never fetched a third batch (CI failed so).
    wait_until(lambda: "fault point after_fetch fired" in cut.log(), 120, "k0 to hold a batch")
    other = _worker(infra, 1, name, topic, tmp_path, "k1")
    assert _owned(dsn, group, "k0"), "k0 owns nothing while it holds a batch"
    proxies = infra.kafka_proxies(0)
    for proxy in proxies:
        proxy.add_timeout("hole", 0, "both")
    try:
        wait_until(lambda: not _owned(dsn, group, "k0"), 90, "k1 to claim all of k0's partitions")
        cut.release_stall()  # its batch has an heir now (the 25 s stall only bounded the wait)
        wait_until(lambda: FENCED_LINE in cut.log(), 90, "k0's batch to be fenced")
    finally:
        for proxy in proxies:
            proxy.remove_toxic("hole")
    wait_until(lambda: bool(_owned(dsn, group, "k0")), 120, "k0 to own partitions again")
    wait_drained(dsn, manifest, group, [cut, other])
    verify_ok(dsn, manifest, group)
    for w in (cut, other):
        w.stop()


def test_sigkill_of_a_busy_partition_leader(infra: Infra, tmp_path: Path) -> None:
    """The broker leading the partition with the most to ingest is SIGKILLed mid-ingest
    and restarted: another replica leads (RF 3, min.insync.replicas 2), the workers
    follow it, exactly once."""
    dsn, name = _database(infra)
    topic = _rf3_topic(infra)
    group = f"g-{topic}"
    manifest = produce_mix(_direct(infra), topic, tmp_path, 8000, seed=23, knobs=CLEAN)
    workers = [_worker(infra, s, name, topic, tmp_path, f"l{s}") for s in (0, 1)]
    wait_until(lambda: _batches(dsn) >= 3, 120, "ingest to get going")
    ends = _ends(infra, topic)
    rows = db(dsn, "SELECT partition, next_offset FROM consumer_offsets WHERE group_id = $1", group)
    stored = {int(r["partition"]): int(r["next_offset"] or 0) for r in rows}
    busiest = max(ends, key=lambda p: ends[p] - stored.get(p, 0))
    leader = infra.cluster.leaders(topic)[busiest]
    infra.cluster.node(leader).kill()
    assert infra.cluster.wait_leader(topic, busiest, leader, 120) != leader
    infra.cluster.node(leader).start(300)
    infra.cluster.wait_full_isr(300)
    wait_drained(dsn, manifest, group, workers, timeout=240)
    verify_ok(dsn, manifest, group)
    for w in workers:
        w.stop()


def _ends(infra: Infra, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": infra.bootstrap, "group.id": "ends"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(3)
        }
    finally:
        consumer.close()


def test_a_full_disk_is_retried_and_alerted_never_rejected(infra: Infra, tmp_path: Path) -> None:
    """The filesystem of the activity table's tablespace fills up mid-ingest: the worker
    retries (DiskFullError is transient), says so (the down-since gauge, then /readyz
    503), rejects and dead-letters nothing, and drains once space is freed."""
    dsn, name = _database(infra)
    db(dsn, "SELECT ackline_activity_tablespace('ackline_ts')")
    # A partition made later goes where activity is, not to default_tablespace.
    (made,) = db(
        dsn, "SELECT * FROM ackline_ensure_partitions_at(now() + interval '300 days', 'day', 0)"
    )
    (where,) = db(
        dsn,
        "SELECT t.spcname FROM pg_class AS c JOIN pg_tablespace AS t ON t.oid = c.reltablespace"
        " WHERE c.oid = to_regclass('public.' || $1)",
        made["partition_name"],
    )
    assert where["spcname"] == "ackline_ts"
    topic = _rf3_topic(infra)
    group = f"g-{topic}"
    manifest = produce_mix(_direct(infra), topic, tmp_path, 6000, seed=24, knobs=CLEAN)
    worker = _worker(infra, 2, name, topic, tmp_path, "f2", db_down_error_after_s=2)
    wait_until(lambda: _batches(dsn) >= 2, 120, "the worker's first batches")
    fs = infra.tmpfs[infra.pair.primary.name]
    fs.resize(fs.used() + (256 << 10))
    try:
        wait_until(
            lambda: worker.metric("ackline_database_down_since_timestamp_seconds") > 0,
            120,
            "the worker to report PostgreSQL failing",
        )
        wait_until(lambda: readyz(worker.metrics_port) == 503, 60, "/readyz to fail")
        assert "DiskFullError" in worker.log() or "No space left" in worker.log()
        assert db(dsn, "SELECT count(*) AS n FROM rejects")[0]["n"] == 0
    finally:
        fs.resize(TMPFS_SIZE)
    wait_drained(dsn, manifest, group, [worker])
    verify_ok(dsn, manifest, group)
    assert db(dsn, "SELECT count(*) AS n FROM rejects")[0]["n"] == 0
    assert _ends(infra, f"{topic}.dlq") == {0: 0, 1: 0, 2: 0}
    wait_until(lambda: readyz(worker.metrics_port) == 200, 60, "/readyz to pass again")
    worker.stop()


# ---- a producer whose partition leader is away, its transaction coordinator not --------

_PRODUCER_SLOT = 2
_LEADER_AWAY = {"queue.buffering.max.messages": 3, "message.timeout.ms": 2_000}
"""A local queue smaller than the transaction, records timing out 2 s after the cut."""
Cut = Callable[[], AbstractContextManager[None]]
"""The partition leader unreachable to the producer for the block."""
_ABORTED = (
    r"transaction aborted, nothing committed: \d+ record\(s\) not delivered, "
    r"first: _MSG_TIMED_OUT: .*send the same records again.*"
)
"""What :func:`ackline.streams.producer.not_committed` says of records that timed out (an
abort not confirmed says otherwise: "abort_transaction not confirmed")."""


def _java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (a signed 32-bit int) of ASCII ``text``. Pure."""
    assert text.isascii()
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _coordinator(infra: Infra, transactional_id: str) -> int:
    """The broker coordinating ``transactional_id``'s transactions: the leader of its
    ``__transaction_state`` partition, ``Utils.abs(id.hashCode()) % partitions`` (the
    broker librdkafka's FindCoordinator found, in the runs its debug log was read)."""
    leaders: dict[int, int] = {}

    def known() -> bool:
        nonlocal leaders
        try:
            leaders = infra.cluster.leaders("__transaction_state")
        except DevStackError:  # not in the metadata of the broker asked yet
            return False
        return bool(leaders) and min(leaders.values()) >= 0

    wait_until(known, 30, "a leader for every partition of __transaction_state")
    h = _java_hash(transactional_id)
    return leaders[(0 if h == -(1 << 31) else abs(h)) % len(leaders)]


def _topic_led_by(infra: Infra, leader: int) -> str:
    """A 1-partition topic, replication factor 3, whose leader is broker ``leader``."""
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    name = f"t-{uuid.uuid4().hex[:12]}"
    others = [n.node_id for n in infra.layout.cluster.nodes if n.node_id != leader]
    new = NewTopic(
        name, 1, replica_assignment=[[leader, *others]], config={"min.insync.replicas": "2"}
    )
    client = infra.cluster.admin()  # kept: the futures die with the client
    client.create_topics([new], operation_timeout=30)[name].result(60)

    def led() -> bool:
        try:
            return infra.cluster.leaders(name).get(0) == leader
        except DevStackError:  # not in the metadata of the broker asked yet
            return False

    wait_until(led, 30, f"broker {leader} to lead {name}")
    return name


@dataclass(frozen=True)
class _Outage:
    """One producer's run: it learns the leader and commits ``before`` (if any, so that
    it holds a connection to the leader), then sends ``records`` inside ``cut``."""

    bootstrap: str
    topic: str
    transactional_id: str
    before: list[Outgoing]
    records: list[Outgoing]
    cut: Cut


def _sync_away(run: _Outage, block: bool) -> str:
    """The synchronous producer's run: what its error said (a TransientProduceError)."""
    producer = ActivityProducer(run.bootstrap, run.topic, run.transactional_id, extra=_LEADER_AWAY)
    producer.start()
    try:
        producer.client.list_topics(run.topic, timeout=10)
        if run.before:
            producer.send_transaction(run.before, timeout=30)
        with run.cut(), pytest.raises(ProduceError) as caught:
            _sync_send(producer, run.records, block, 30)
    finally:
        producer.close()
    assert caught.type is TransientProduceError, f"{caught.type.__name__}: {caught.value}"
    return str(caught.value)


def _aio_away(run: _Outage, block: bool) -> str:
    """:func:`_sync_away` through the asyncio producer."""

    async def go() -> str:
        producer = AsyncActivityProducer(
            run.bootstrap, run.topic, run.transactional_id, extra=_LEADER_AWAY
        )
        await producer.start()
        try:
            await producer._client().list_topics(run.topic, timeout=10)  # no public way
            if run.before:
                await producer.send_transaction(run.before, timeout=30)
            with run.cut(), pytest.raises(ProduceError) as caught:
                await _aio_send(producer, run.records, block, 30)
        finally:
            await producer.close()
        assert caught.type is TransientProduceError, f"{caught.type.__name__}: {caught.value}"
        return str(caught.value)

    return asyncio.run(go())


# "unconnected" too (the producer only learned the leader: its connection hangs in
# ApiVersion and the records time out queued) failed the same way on the old code and
# passed with the fix; `make test` runs "connected" only, each way costs 5-10 s.
@pytest.mark.parametrize("connected", [True], ids=["connected"])
@pytest.mark.parametrize(
    ("away", "block"),
    [(_aio_away, False), (_aio_away, True), (_sync_away, False), (_sync_away, True)],
    ids=["aio-send_transaction", "aio-transaction", "sync-send_transaction", "sync-transaction"],
)
def test_a_transaction_whose_partition_leader_is_away_but_not_its_coordinator(
    infra: Infra, away: Callable[[_Outage, bool], str], block: bool, connected: bool
) -> None:
    """The partial outage: the producer reaches the transaction coordinator (one broker)
    but not the partition's leader (another: the producer's proxy to it a black hole),
    with more records than the local queue holds. ``unconnected``: the producer only
    learned the leader, its connection hangs in ApiVersion; ``connected``: it committed a
    record through the leader first, so its ProduceRequest goes into the hole and times
    out in flight. Either way the records time out, librdkafka fails the transaction
    (abortable, epoch bump) and refuses every later produce() with ``_STATE``; the abort
    and the bump reach the coordinator while the leader is still cut off. Nothing was
    committed because a broker was away: TransientProduceError, not ProduceError (which
    tells a caller to drop the records; the code before a9a9443 said so, all 8 ways).
    Once the leader is back, a new instance with the same transactional.id sends the
    same records: a read_committed consumer reads them once."""
    # __transaction_state exists once a transactional producer has started
    warm = ActivityProducer(infra.bootstrap, "unused", f"warm-{uuid.uuid4().hex[:8]}")
    warm.start()
    warm.close()
    tid = f"svc-{uuid.uuid4().hex[:8]}"
    coordinator = _coordinator(infra, tid)
    leader = next(n.node_id for n in infra.layout.cluster.nodes if n.node_id != coordinator)
    topic = _topic_led_by(infra, leader)
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-p", 4)]
    before = records[:1] if connected else []  # committed first, through the leader
    records = records[1:] if connected else records
    assert len(records) > 2 * _LEADER_AWAY["queue.buffering.max.messages"]
    proxy = infra.proxy(infra_stack.kafka_proxy(leader, _PRODUCER_SLOT))

    @contextmanager
    def cut() -> Iterator[None]:
        proxy.add_timeout("leader-away", 0, "both")
        try:
            yield
        finally:
            proxy.remove_toxic("leader-away")

    bootstrap = infra.slot_bootstrap(_PRODUCER_SLOT)
    said = away(_Outage(bootstrap, topic, tid, before, records, cut), block)
    assert _coordinator(infra, tid) == coordinator and infra.cluster.leaders(topic)[0] == leader
    # judged by the records that timed out; the abort reached the coordinator during the cut
    assert re.fullmatch(_ABORTED, said), said
    assert committed_values(infra.bootstrap, topic, partitions=1) == [r.value for r in before]
    again = ActivityProducer(bootstrap, topic, tid)
    again.start()
    try:
        again.send_transaction(records, timeout=30)
    finally:
        again.close()
    assert sorted(committed_values(infra.bootstrap, topic, partitions=1)) == sorted(
        r.value for r in before + records
    )
