"""A PostgreSQL host that vanishes under a running worker (issue 11 item 4, issue 18).

The operator's report: "with the connection frozen for 45 s and no reset either way, the
worker was still stuck 3 minutes after the database came back". A proxy cannot show it (its
kernel ACKs everything and it forwards closes), so the worker runs in a network namespace
and reaches a PostgreSQL in another one over a veth pair (ackline.dev.netns); setting the
link down makes the server vanish: no FIN, no RST, no ICMP, both sockets stay open.

The database "comes back" without the old connection, as it does after a failover or a
restart, or when a server sheds a client that stopped acknowledging: the test server runs
with ``tcp_user_timeout = 2s``, so it drops a connection whose reply goes unacknowledged.
After that nobody will ever answer the old connection. A worker that waits for the reply
without a bound waits forever; one that bounds every wait gives up, reconnects when the
link is back, reconciles and carries on, exactly once.

The moments are made exact with two gates, advisory locks the test holds: a statement
trigger on ``activity`` stops the batch's COPY on the server, a deferred trigger on
``ingest_batches`` stops its COMMIT. The worker's request has arrived and it waits for the
reply; the link goes down; the gate opens, so the server finishes (the COMMIT commits) and
its reply is lost.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from ackline.core.faults import Faults
from ackline.dev.netns import Forwarder, NetnsPostgres, VanishingLink, submit_in_namespace
from ackline.sinks.admin.migrate import migrate
from ackline.sinks.connection import Database
from ackline.sinks.errors import WaitStoppedError
from ackline.sinks.ingest.offsets import claim
from ackline.sinks.ingest.writer import BatchWriter
from tests.integration.harness import Services, Worker, db, wait_until
from tests.integration.processing import Ev, Process, copy_ingest, scrape, synthetic_runs
from tests.integration.test_writer import GROUP, TOPIC, batch, row
from tests.integration.windows import (
    batches,
    fired,
    produce_worker_mix,
    verify_ok,
    wait_drained,
)
from tests.support.processors import SETUP_SQL

COPY_GATE, COMMIT_GATE = 4241, 4242
BOUNDS = {"db_connect_timeout_s": 2, "db_statement_timeout_s": 4, "db_commit_timeout_s": 4}
GAVE_UP = re.compile(r"retrying in [0-9.]+s: TimeoutError")
"""The worker's log line when it gave up waiting for a reply (not for a connection)."""

_GATES = """
CREATE FUNCTION test_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_lock_shared(TG_ARGV[0]::bigint);
    PERFORM pg_advisory_unlock_shared(TG_ARGV[0]::bigint);
    RETURN NULL;
END $$;
CREATE TRIGGER copy_gate AFTER INSERT ON activity
    FOR EACH STATEMENT EXECUTE FUNCTION test_gate('4241');
CREATE CONSTRAINT TRIGGER commit_gate AFTER INSERT ON ingest_batches
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_gate('4242');
"""


@dataclass
class Net:
    link: VanishingLink
    pg: NetnsPostgres
    services: Services


@pytest.fixture(scope="module")
def net(services: Services) -> Iterator[Net]:
    """The two namespaces, a PostgreSQL in the server one, Kafka relayed into the client
    one; all removed afterwards, also on failure."""
    host, _, port = services.bootstrap.partition(",")[0].rpartition(":")
    assert host == "127.0.0.1", services.bootstrap
    with VanishingLink("vanish") as link:
        pg = NetnsPostgres(
            services.state_dir / "netns-pg", link, settings={"tcp_user_timeout": "2000"}
        )
        try:
            pg.start()
            kafka = ("127.0.0.1", int(port))
            with Forwarder(kafka, kafka, listen_ns=link.client_ns):
                yield Net(link, pg, services)
        finally:
            pg.stop("immediate")


@pytest.fixture
def netdb(net: Net) -> Iterator[str]:
    """A fresh migrated database on the namespaced server, with the two gates."""
    name = f"v_{int(time.time() * 1000) % 10**10}"

    async def create() -> None:
        conn = await asyncpg.connect(net.pg.socket_dsn())
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        conn = await asyncpg.connect(net.pg.socket_dsn(name))
        try:
            await migrate(conn)
            await conn.execute(_GATES)
        finally:
            await conn.close()

    asyncio.run(create())
    yield name

    async def drop() -> None:
        conn = await asyncpg.connect(net.pg.socket_dsn())
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(drop())


class Gates:
    """The test's session holding the gates (over the unix socket: it never vanishes)."""

    def __init__(self, dsn: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.conn: asyncpg.Connection = self.loop.run_until_complete(asyncpg.connect(dsn))

    def close_gate(self, gate: int) -> None:
        self.loop.run_until_complete(self.conn.execute("SELECT pg_advisory_lock($1)", gate))

    def open_gate(self, gate: int) -> None:
        self.loop.run_until_complete(self.conn.execute("SELECT pg_advisory_unlock($1)", gate))

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()


def waiting_at(dsn: str, gate: int, worker: str) -> list[dict[str, Any]]:
    """The worker's writer backends that wait on ``gate``."""
    return backends_at(dsn, gate, f"ackline:{worker}")


def backends_at(dsn: str, gate: int, application_name: str) -> list[dict[str, Any]]:
    """The backends of ``application_name`` that wait on ``gate``."""
    rows = db(
        dsn,
        "SELECT a.pid, left(a.query, 40) AS query FROM pg_stat_activity a "
        "JOIN pg_locks l ON l.pid = a.pid AND NOT l.granted AND l.locktype = 'advisory' "
        "WHERE a.application_name = $1 AND l.objid = $2",
        application_name,
        gate,
    )
    return [dict(r) for r in rows]


def test_worker_recovers_from_a_vanished_database_mid_batch_and_at_commit(
    net: Net, netdb: str, topic: str, tmp_path: Path
) -> None:
    """The link vanishes twice, each time until the worker gave up its wait on its own
    (its statement and commit bounds): while the batch's COPY waits for its reply, then
    while its COMMIT does (the COMMIT commits, the reply is lost). The worker reconnects
    once the link is back, re-sends what did not commit and reconciles what did: every
    event exactly once."""
    observer = net.pg.socket_dsn(netdb)
    manifest = produce_worker_mix(net.services, topic, tmp_path, events=3_000, seed=1111)
    gates = Gates(observer)
    try:
        gates.close_gate(COPY_GATE)
        gates.close_gate(COMMIT_GATE)
        w = Worker(
            net.services,
            net.pg.dsn(netdb),
            topic,
            tmp_path,
            prefix=net.link.exec_prefix(net.link.client_ns),
            **BOUNDS,
        )
        group = f"g-{topic}"

        # 1. a batch in flight: its COPY arrived, the server holds the reply; vanish.
        wait_until(lambda: waiting_at(observer, COPY_GATE, w.name), 90, "COPY at the gate")
        seen = len(w.log())
        net.link.vanish()
        gates.open_gate(COPY_GATE)  # the server finishes the COPY; the reply is lost
        wait_until(
            lambda: GAVE_UP.search(w.log(), seen) is not None, 60, "the worker to give up the COPY"
        )
        net.link.restore()
        restored = time.monotonic()

        # 2. after the database came back, the batch again, now held at COMMIT; vanish.
        wait_until(
            lambda: waiting_at(observer, COMMIT_GATE, w.name),
            60,
            "the worker, after the database came back, to write the batch again (at COMMIT)",
        )
        print(f"back at work {time.monotonic() - restored:.1f}s after the link returned")
        seen = len(w.log())
        net.link.vanish()
        gates.open_gate(COMMIT_GATE)  # the COMMIT commits on the server; the reply is lost
        wait_until(
            lambda: "COMMIT outcome unknown" in w.log()[seen:],
            60,
            "the worker to give up the COMMIT",
        )
        net.link.restore()
        restored = time.monotonic()
        committed = db(observer, "SELECT count(*) AS n FROM ingest_batches")[0]["n"]
        wait_until(
            lambda: db(observer, "SELECT count(*) AS n FROM ingest_batches")[0]["n"] > committed,
            60,
            "the worker, after the database came back, to commit its next batch",
        )
        print(f"committing again {time.monotonic() - restored:.1f}s after the link returned")

        wait_drained(observer, manifest, group, [w], timeout=120)
        verify_ok(observer, manifest, group)
        # The lost COMMIT had committed: the database is drained as soon as the other
        # connection's batches commit, while this one's reconcile may still be ending the
        # dropped session (the server holds it up to its tcp_user_timeout) before it reads.
        wait_until(lambda: "reconciled by reading" in w.log(), 30, "the reconcile's verdict")
        assert w.stop() == 0, w.log()[-4000:]
    finally:
        gates.close()


def test_a_revoke_while_the_database_is_away_hands_the_partitions_over(
    net: Net, netdb: str, topic: str, tmp_path: Path
) -> None:
    """Worker a's batches are in flight when its link to PostgreSQL vanishes; b, whose
    database is there, joins. a's revoke callback lets the batches run out its revoke
    wait, cancels them and gives the revoked partitions up without asking PostgreSQL, so
    b drains them while a's link is still down; the partitions a keeps are claimed again
    once its link is back: every event exactly once. Before, the callback re-read the
    batches' offset rows first, waiting for the vanished database, and the whole
    rebalance waited with it (b got nothing) until the link came back."""
    observer = net.pg.socket_dsn(netdb)
    manifest = produce_worker_mix(net.services, topic, tmp_path, events=3_000, seed=1313)
    group = f"g-{topic}"
    gates = Gates(observer)
    try:
        gates.close_gate(COPY_GATE)
        a = _beyond_the_link(net, netdb, topic, tmp_path, revoke_wait_s=2)
        wait_until(lambda: waiting_at(observer, COPY_GATE, "a"), 90, "a's COPY at the gate")
        net.link.vanish()
        try:
            gates.open_gate(COPY_GATE)  # a's COPY finishes on the server; its reply is lost
            b = Worker(net.services, observer, topic, tmp_path, name="b", **BOUNDS)
            wait_until(lambda: "revoked [" in a.log(), 60, "a to give up its revoked partitions")
            wait_until(lambda: batches(observer, "b") > 0, 60, "b to commit while a's link is down")
            assert "did not commit during a rebalance" in a.log(), a.log()[-4000:]
        finally:
            net.link.restore()
        wait_drained(observer, manifest, group, [a, b], timeout=120)
        verify_ok(observer, manifest, group)
        assert a.stop() == 0 and b.stop() == 0, a.log()[-4000:]
    finally:
        gates.close()


def test_a_fenced_batch_while_the_database_goes_away_keeps_the_worker_polling(
    net: Net, netdb: str, topic: str, tmp_path: Path
) -> None:
    """Worker a's batch is fenced (an intruder bumped the epochs), and a's link to
    PostgreSQL vanishes before a re-positions the partitions. Before, a re-read their
    offset rows on the consumer thread, retrying for as long as the link was down: the
    thread stopped polling, so when b joined the rebalance waited for a (b got nothing
    until a's link came back or max.poll.interval.ms ran out). Now a suspends them and
    claims them again on its event loop while its thread polls on: b drains its share
    while a's link is still down; then every event exactly once."""
    observer = net.pg.socket_dsn(netdb)
    manifest = produce_worker_mix(net.services, topic, tmp_path, events=3_000, seed=1414)
    group = f"g-{topic}"
    a = _beyond_the_link(
        net,
        netdb,
        topic,
        tmp_path,
        faults="after_fetch=stall@1,before_reread=stall@1",
        fault_stall_seconds=120,
    )
    wait_until(lambda: fired(a, "after_fetch"), 90, "a's first batch to stall after fetch")
    _intrude(observer, group, topic, [0, 1, 2])
    a.release_stall("after_fetch")
    wait_until(lambda: fired(a, "before_reread"), 60, "a's fenced batch to be re-positioned")
    assert "fenced and rolled back" in a.log(), a.log()[-4000:]
    net.link.vanish()
    try:
        a.release_stall("before_reread")
        b = Worker(net.services, observer, topic, tmp_path, name="b", **BOUNDS)
        wait_until(lambda: batches(observer, "b") > 0, 60, "b to commit while a's link is down")
    finally:
        net.link.restore()
    wait_drained(observer, manifest, group, [a, b], timeout=120)
    verify_ok(observer, manifest, group)
    assert a.stop() == 0 and b.stop() == 0, a.log()[-4000:]


def test_a_worker_cut_off_from_postgresql_leaves_the_group_and_joins_again(
    net: Net, netdb: str, topic: str, tmp_path: Path
) -> None:
    """Worker a's link to PostgreSQL vanishes with a batch in flight, and b, whose
    database is there, joins. a gives b part of the partitions at the revoke; its claim
    of the ones it kept fails for as long as the link is down. Past
    ``db_leave_after_s`` a leaves the consumer group, so b drains every partition while
    a's link is still down; once the link is back a joins again; every event exactly
    once. Before, a kept its partitions for as long as its link was down: nothing
    handed them to b."""
    observer = net.pg.socket_dsn(netdb)
    manifest = produce_worker_mix(net.services, topic, tmp_path, events=3_000, seed=1515)
    group = f"g-{topic}"
    gates = Gates(observer)
    try:
        gates.close_gate(COPY_GATE)
        a = _beyond_the_link(net, netdb, topic, tmp_path, revoke_wait_s=2, db_leave_after_s=5)
        wait_until(lambda: waiting_at(observer, COPY_GATE, "a"), 90, "a's COPY at the gate")
        net.link.vanish()
        try:
            gates.open_gate(COPY_GATE)  # a's COPY finishes on the server; its reply is lost
            b = Worker(net.services, observer, topic, tmp_path, name="b", **BOUNDS)
            wait_drained(observer, manifest, group, [a, b], timeout=120)
            assert "leaving the consumer group" in a.log(), a.log()[-4000:]
        finally:
            net.link.restore()
        wait_until(lambda: "joining the consumer group again" in a.log(), 90, "a to join again")
        verify_ok(observer, manifest, group)
        _alone_it_drains(net, observer, topic, tmp_path, group, a, b, seed=1717)
    finally:
        gates.close()


def test_an_assign_claim_past_the_leave_bound_leaves_the_group(
    net: Net, netdb: str, topic: str, tmp_path: Path
) -> None:
    """a and b share the (empty) topic's partitions; a's link to PostgreSQL vanishes and b
    stops, so a's assign callback claims b's partitions over the vanished link; c joins.
    Past ``db_leave_after_s`` the callback gives the claim up and a leaves the group, so c
    takes every partition and drains what is produced while a's link is still down.
    Before, the claim retried inside the callback for as long as the link was down
    (librdkafka does not apply max.poll.interval.ms there), and the rebalance that c's
    join started waited for a: c got nothing."""
    observer = net.pg.socket_dsn(netdb)
    group = f"g-{topic}"
    a = _beyond_the_link(net, netdb, topic, tmp_path, db_leave_after_s=5)
    wait_until(lambda: "assigned [" in a.log(), 60, "a to be assigned the partitions")
    b = Worker(net.services, observer, topic, tmp_path, name="b", **BOUNDS)
    wait_until(lambda: "assigned [" in b.log(), 60, "b to share the partitions")
    net.link.vanish()
    try:
        assert b.stop() == 0, b.log()[-4000:]
        # a's assign claim of b's partitions fails over the link (before c joins, which
        # could take them instead)
        wait_until(lambda: "claim: transient" in a.log(), 60, "a to claim b's partitions")
        c = Worker(net.services, observer, topic, tmp_path, name="c", **BOUNDS)
        manifest = produce_worker_mix(net.services, topic, tmp_path, events=1_000, seed=1616)
        wait_drained(observer, manifest, group, [a, c], timeout=120)
        assert "PostgreSQL away while claiming" in a.log(), a.log()[-4000:]
        assert "leaving the consumer group" in a.log(), a.log()[-4000:]
    finally:
        net.link.restore()
    wait_until(lambda: "joining the consumer group again" in a.log(), 90, "a to join again")
    verify_ok(observer, manifest, group)
    _alone_it_drains(net, observer, topic, tmp_path, group, a, c, seed=1818)


def _alone_it_drains(
    net: Net, dsn: str, topic: str, tmp_path: Path, group: str, a: Worker, other: Worker, seed: int
) -> None:
    """The other worker stops: a, back in the group, claims every partition and drains
    what is produced next. A rejoin that logged its line and then claimed nothing (the
    client assigning the partitions itself, unowned, their records dropped) stalls here."""
    assert other.stop() == 0, other.log()[-4000:]
    more = produce_worker_mix(net.services, topic, tmp_path, events=500, seed=seed)
    wait_drained(dsn, more, group, [a], timeout=120)
    assert a.stop() == 0, a.log()[-4000:]


def _beyond_the_link(net: Net, netdb: str, topic: str, tmp_path: Path, **settings: Any) -> Worker:
    """Worker a, in the client namespace: it reaches PostgreSQL over the link only."""
    return Worker(
        net.services,
        net.pg.dsn(netdb),
        topic,
        tmp_path,
        name="a",
        prefix=net.link.exec_prefix(net.link.client_ns),
        **BOUNDS,
        **settings,
    )


def _intrude(dsn: str, group: str, topic: str, partitions: list[int]) -> None:
    """Bump the epochs as a late claimer would; no row is written."""

    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await claim(conn, group, "intruder", [(topic, p) for p in partitions])
        finally:
            await conn.close()

    asyncio.run(go())


def _ingest_dsn(net: Net, name: str) -> str:
    """The worker's role over the link (the server trusts the link's addresses)."""
    return f"postgresql://ackline_ingest@{net.link.server_ip}:{net.pg.port}/{name}"


def _claim(dsn: str) -> int:
    async def go() -> int:
        conn = await asyncpg.connect(dsn)
        try:
            return (await claim(conn, GROUP, "w", [(TOPIC, 0)]))[0].epoch
        finally:
            await conn.close()

    return asyncio.run(go())


def test_commit_lost_in_a_vanished_link_ends_the_old_session_then_reconciles(
    net: Net, netdb: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer (in this process, in the client namespace) sends COMMIT into a link
    that just vanished. Its commit timeout fires while the server still holds the old
    session, idle in its transaction with the batch's row locks: the server never saw
    anything end. When the link is back, the reconcile ends that session first, then
    reads that the batch did not commit, and writes it again: exactly once."""
    caplog.set_level(logging.INFO, logger="ackline.sinks")
    observer = net.pg.socket_dsn(netdb)
    epoch = _claim(observer)
    # A long statement timeout (so the server's keepalives leave the old session alone for
    # ~20 s), a short commit timeout: the case of a COMMIT lost while the server lives on.
    database = Database(
        _ingest_dsn(net, netdb),
        connect_timeout=1,
        statement_timeout=30,
        commit_timeout=2,
        application_name="victim",
    )
    writer = BatchWriter(database, GROUP, "w", Faults("before_commit=stall", stall_seconds=1.0))

    async def write() -> int:
        try:
            return (await writer.write(batch(0, [row(1), row(2), row(3)], epoch))).inserted
        finally:
            await database.close()

    def victim(state: str) -> list[int]:
        rows = db(
            observer,
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'victim' AND state = $1",
            state,
        )
        return [int(r["pid"]) for r in rows]

    done = submit_in_namespace(net.link.client_ns, lambda: asyncio.run(write()))
    try:
        wait_until(lambda: bool(victim("idle in transaction")), 30, "the batch before COMMIT")
        old = victim("idle in transaction")
        net.link.vanish()  # the writer is in its 1 s stall; then it sends COMMIT
        wait_until(lambda: writer.retries["commit_uncertain"] == 1, 30, "the commit timeout")
        assert victim("idle in transaction") == old  # the server holds on to it
    finally:
        net.link.restore()
    assert done.result(timeout=60) == 3
    assert f"ended the dropped session (pid {old[0]})" in caplog.text
    assert "did not commit; retrying" in caplog.text
    count = (
        "SELECT (SELECT count(*) FROM ingest_batches) AS b, (SELECT count(*) FROM activity) AS a"
    )
    assert dict(db(observer, count)[0]) == {"b": 1, "a": 3}
    assert not victim("idle in transaction")


@pytest.mark.parametrize("how", ["refused", "vanished"])
def test_retrying_logs_error_after_the_bound_and_stops_on_request(
    net: Net, netdb: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL refuses connections (a closed port), or its host vanished (a connect
    that never gets an answer): retrying logs WARNING, then ERROR once the outage is older
    than its bound, tells readiness when it began, and gives up as soon as a stop is
    requested, even in the middle of an attempt (the connect timeout here is long)."""
    caplog.set_level(logging.INFO, logger="ackline.sinks.connection")
    if how == "refused":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            dsn = f"postgresql://ackline_ingest@127.0.0.1:{probe.getsockname()[1]}/{netdb}"
        ns = None
    else:
        dsn, ns = _ingest_dsn(net, netdb), net.link.client_ns
    downs: list[float | None] = []
    database = Database(dsn, connect_timeout=60, down_error_after=1.0, on_down=downs.append)
    # Refused: stop once the ERROR is out. Backoff is jittered, so the first failure past
    # the 1 s bound can come as late as ~3.5 s; a fixed stop time made this test flaky.
    # Vanished: the one attempt never ends by itself, so stop after 2.5 s.
    stop_at = time.monotonic() + (10.0 if how == "refused" else 2.5)
    asked: list[float] = []

    def stopping() -> bool:
        erred = any(
            r.levelname == "ERROR" and r.name == "ackline.sinks.connection" for r in caplog.records
        )
        if not asked and (erred or time.monotonic() > stop_at):
            asked.append(time.monotonic())
        return bool(asked)

    async def select_one(conn: asyncpg.Connection) -> int:
        return int(await conn.fetchval("SELECT 1"))

    async def run() -> float:
        try:
            await database.retrying("probe", select_one, stopping=stopping)
        except WaitStoppedError:
            return time.monotonic() - asked[0]
        raise AssertionError("retrying returned without a database")

    if how == "vanished":
        net.link.vanish()
    try:
        late = submit_in_namespace(ns, lambda: asyncio.run(run())).result(timeout=120)
    finally:
        net.link.restore()
    print(f"{how}: stopped {late:.2f}s after the stop request")
    assert late < 10  # not the 60 s connect timeout: the attempt itself was cut short
    levels = [r.levelname for r in caplog.records if r.name == "ackline.sinks.connection"]
    if how == "refused":  # fails fast: warnings, then the error past the 1 s bound
        assert "WARNING" in levels and levels.count("ERROR") == 1, levels
        assert "ACKLINE_DB_DOWN_ERROR_AFTER_S" in caplog.text
        assert len(downs) == 1 and downs[0] is not None  # readiness told once, when it began
    else:  # the one attempt never failed: it was still connecting when stopped
        assert levels == [] and downs == [], levels


# -- a processor (`ackline process`) beyond the link ----------------------------------

APPLY_GATE, PROCESSOR_COMMIT_GATE = 4243, 4244
_JOURNAL_GATES = """
CREATE TRIGGER apply_gate AFTER INSERT ON journal
    FOR EACH STATEMENT EXECUTE FUNCTION test_gate('4243');
CREATE CONSTRAINT TRIGGER journal_commit_gate AFTER INSERT ON journal
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_gate('4244');
"""
PROCESSOR_BOUNDS = {
    "ACKLINE_DB_CONNECT_TIMEOUT_S": "2",
    "ACKLINE_DB_STATEMENT_TIMEOUT_S": "3",  # TCP user timeout 3 s, keepalives 1 s x 3
    "ACKLINE_DB_CHECK_INTERVAL_S": "0.5",  # the lag watch samples every 0.5 s
}
DATABASE_UP = "ackline_processor_database_up"


def _scrape_in(ns: str, port: int) -> dict[str, float]:
    """The process's metrics, read from inside its namespace, where its endpoint is
    (nothing while it does not answer yet)."""

    def read() -> dict[str, float]:
        try:
            return scrape(port)
        except OSError:
            return {}

    return submit_in_namespace(ns, read).result(timeout=30)


@pytest.mark.parametrize("gate", [APPLY_GATE, PROCESSOR_COMMIT_GATE], ids=["apply", "commit"])
def test_a_processor_whose_reply_was_lost_in_a_vanished_link_reconnects(
    net: Net, netdb: str, tmp_path: Path, gate: int
) -> None:
    """`ackline process` follows the feed over the link. Its first batch's journal
    INSERT (``apply``), or its COMMIT, has reached the server and waits at a gate; the
    link vanishes; the gate opens, so the server finishes (for ``commit``, the batch and
    its cursor commit), its reply is lost, and the server drops the session (its
    tcp_user_timeout). Meanwhile the lag watch finds PostgreSQL gone
    (``ackline_processor_database_up`` 0). Then the link comes back. The processor finds
    its connection dead (keepalives, TCP_USER_TIMEOUT), reconnects and goes on from its
    stored cursor: every event applied exactly once. Before, the feed's connections had
    neither: the processor waited for the lost reply for ever (nothing of its own was
    unacknowledged, nothing probed), and the lag watch's sample went on being resent
    (for ~15 minutes by default), the gauge still 1."""
    observer = net.pg.socket_dsn(netdb)
    events = synthetic_runs(300, seed=4243)
    asyncio.run(_journal_with_gates(observer, events))
    app, ns = "ackline-process:a", net.link.client_ns
    port = 9400 + gate % 100  # in the client namespace: nothing else listens there
    gates = Gates(observer)
    try:
        gates.close_gate(gate)
        proc = Process(
            net.pg.dsn(netdb),
            tmp_path,
            "a",
            "tests.support.processors:JOURNAL",
            *("--instance", "a", "--batch-events", "100", "--poll-interval", "0.5"),
            prefix=net.link.exec_prefix(ns),
            ACKLINE_METRICS_PORT=str(port),
            **PROCESSOR_BOUNDS,
        )
        try:
            wait_until(lambda: backends_at(observer, gate, app), 60, "the processor at the gate")
            (held,) = backends_at(observer, gate, app)
            wait_until(lambda: _scrape_in(ns, port).get(DATABASE_UP) == 1, 30, "the lag watch")
            net.link.vanish()
            try:
                gates.open_gate(gate)  # the server finishes; its reply is lost
                wait_until(
                    lambda: not db(observer, _BACKEND, held["pid"]),
                    30,
                    "the server to drop the processor's session",
                )
                wait_until(
                    lambda: _scrape_in(ns, port).get(DATABASE_UP) == 0,
                    30,
                    "the lag watch to find PostgreSQL gone",
                )
            finally:
                net.link.restore()
            restored = time.monotonic()
            wait_until(
                lambda: "reader journal: transient error, reconnecting" in proc.log(),
                30,
                "the processor to find its connection dead",
            )
            wait_until(
                lambda: sum(_journal(observer).values()) >= len(events), 60, "every event applied"
            )
            print(f"caught up {time.monotonic() - restored:.1f}s after the link returned")
            wait_until(
                lambda: _scrape_in(ns, port).get(DATABASE_UP) == 1,
                30,
                "the lag watch to reach PostgreSQL again",
            )
            done = proc.stop()
        finally:
            proc.kill()
    finally:
        gates.close()
    assert done.code == 0, done.err[-3000:]
    assert _journal(observer) == Counter(e.event_id for e in events)  # each exactly once
    assert done.report("journal")["outcome"] == "stopped"


_BACKEND = "SELECT pid FROM pg_stat_activity WHERE pid = $1"


async def _journal_with_gates(dsn: str, events: list[Ev]) -> None:
    """The journal's table with its two gates, and ``events`` ingested."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SETUP_SQL)
        await conn.execute(_JOURNAL_GATES)
        await copy_ingest(conn, events, chunk=100)
    finally:
        await conn.close()


def _journal(dsn: str) -> Counter[uuid.UUID]:
    rows = db(dsn, "SELECT event_id FROM journal WHERE processor = 'journal'")
    return Counter(r["event_id"] for r in rows)
