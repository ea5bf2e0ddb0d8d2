"""A worker whose link to PostgreSQL connects but carries nothing, the others' not.

Worker a reaches PostgreSQL through a relay, b directly. Once a has written (its
connections are open) its relay goes silent, b joins and records arrive. a must leave
the consumer group past ``db_leave_after_s`` so that b drains every partition while a's
relay is still silent; otherwise a keeps its share, unwritten, for as long as the relay
stays so. Two relays: Toxiproxy's black hole (a connect then gets no answer to its
handshake), and a relay that carries the login and nothing after it (a connection pooler
whose server is gone: every connect succeeds, no statement is ever answered).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from ackline.dev.netns import Forwarder
from ackline.dev.ports import pick_free_port
from ackline.dev.toxiproxy import ToxiproxyServer
from tests.integration.harness import Services, Worker, wait_until
from tests.integration.windows import Item, Scenario, produce_mix, step, verify_ok, wait_drained

BOUNDS = {"db_connect_timeout_s": 2, "db_statement_timeout_s": 3, "db_commit_timeout_s": 3}


def test_a_black_hole_past_the_leave_bound_hands_the_partitions_over(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Toxiproxy's ``timeout`` toxic (bytes dropped both ways, both TCP legs open): a's
    statements time out, and each reconnect's TCP connect succeeds but its handshake gets
    no answer, which counts as failing to connect."""
    pg = urlsplit(dsn)
    with ToxiproxyServer.start() as server:
        proxy = server.create_proxy("pg", upstream=f"{pg.hostname}:{pg.port}")
        relayed = dsn.replace(f"{pg.hostname}:{pg.port}", proxy.listen)

        def silence(on: bool) -> None:
            if on:
                proxy.add_timeout("hole", 0, "both")
            else:
                proxy.remove_toxic("hole")

        _silent_link_hands_over(services, dsn, relayed, topic, tmp_path, silence, seed=2101)


def test_a_link_that_logs_in_and_answers_nothing_hands_the_partitions_over(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """A relay that carries each connection's login and nothing after it: every reconnect
    succeeds, no statement is answered. Before, only a failed connect counted, so a kept
    its partitions for as long as the relay was so (b drained nothing of them); now a
    connection whose first statement gets no answer counts as not reached."""
    pg = urlsplit(dsn)
    assert pg.hostname is not None and pg.port is not None
    with Forwarder(("127.0.0.1", pick_free_port()), (pg.hostname, pg.port)) as relay:
        relayed = dsn.replace(f"{pg.hostname}:{pg.port}", f"127.0.0.1:{relay.port}")
        _silent_link_hands_over(services, dsn, relayed, topic, tmp_path, relay.mute, seed=2102)


def _silent_link_hands_over(
    services: Services,
    dsn: str,
    relayed: str,
    topic: str,
    tmp_path: Path,
    silence: Callable[[bool], None],
    seed: int,
) -> None:
    group = f"g-{topic}"
    a = Worker(
        services, relayed, topic, tmp_path, name="a", db_leave_after_s=5, revoke_wait_s=2, **BOUNDS
    )
    first = produce_mix(services, topic, tmp_path, 600, seed=seed)
    wait_drained(dsn, first, group, [a])  # its connections are open
    silence(True)
    sc = Scenario(services.bootstrap, topic, tmp_path / "more.jsonl.gz", base=first)
    try:
        b = Worker(services, dsn, topic, tmp_path, name="b", **BOUNDS)
        wait_until(lambda: "assigned [" in b.log(), 60, "b to join")
        sc.send([Item.event(step(1000 + i), partition=i % 3) for i in range(90)])
        manifest = sc.write()
        wait_drained(dsn, manifest, group, [a, b], timeout=90)
        assert "leaving the consumer group" in a.log(), a.log()[-4000:]
    finally:
        sc.close()
        silence(False)
    wait_until(lambda: "joining the consumer group again" in a.log(), 90, "a to join again")
    verify_ok(dsn, manifest, group)
    assert a.stop() == 0 and b.stop() == 0, a.log()[-4000:]
