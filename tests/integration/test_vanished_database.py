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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from ackline.dev.netns import Forwarder, NetnsPostgres, VanishingLink
from ackline.sinks.admin.migrate import migrate
from tests.integration.harness import Services, Worker, db, wait_until
from tests.integration.windows import produce_worker_mix, verify_ok, wait_drained

COPY_GATE, COMMIT_GATE = 4241, 4242
BOUNDS = {"db_connect_timeout_s": 2, "db_statement_timeout_s": 3, "db_commit_timeout_s": 3}
FREEZE_S = 8.0  # longer than the worker's statement and commit timeouts

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
    rows = db(
        dsn,
        "SELECT a.pid, left(a.query, 40) AS query FROM pg_stat_activity a "
        "JOIN pg_locks l ON l.pid = a.pid AND NOT l.granted AND l.locktype = 'advisory' "
        "WHERE a.application_name = $1 AND l.objid = $2",
        f"ackline:{worker}",
        gate,
    )
    return [dict(r) for r in rows]


def test_worker_recovers_from_a_vanished_database_mid_batch_and_at_commit(
    net: Net, netdb: str, topic: str, tmp_path: Path
) -> None:
    """The link vanishes twice for FREEZE_S: while the batch's COPY waits for its reply,
    then while its COMMIT does (the COMMIT commits, the reply is lost). The worker gives
    up on each wait on its own, reconnects once the link is back, re-sends what did not
    commit and reconciles what did: every event exactly once."""
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
        net.link.vanish()
        gates.open_gate(COPY_GATE)  # the server finishes the COPY; the reply is lost
        time.sleep(FREEZE_S)
        net.link.restore()
        restored = time.monotonic()

        # 2. after the database came back, the batch again, now held at COMMIT; vanish.
        wait_until(
            lambda: waiting_at(observer, COMMIT_GATE, w.name),
            60,
            "the worker, after the database came back, to write the batch again (at COMMIT)",
        )
        print(f"back at work {time.monotonic() - restored:.1f}s after the link returned")
        net.link.vanish()
        gates.open_gate(COMMIT_GATE)  # the COMMIT commits on the server; the reply is lost
        time.sleep(FREEZE_S)
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
        log = w.log()
        assert "reconciled by reading" in log, log[-4000:]  # the lost COMMIT had committed
        assert w.stop() == 0, log[-4000:]
    finally:
        gates.close()
