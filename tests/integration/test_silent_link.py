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

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from confluent_kafka import Consumer, Producer, TopicPartition

from ackline.dev.netns import Forwarder
from ackline.dev.ports import pick_free_port
from ackline.dev.toxiproxy import ToxiproxyServer
from ackline.streams.kafkainfo import group_members
from tests.integration.harness import Services, Worker, relay_postgresql, wait_until
from tests.integration.windows import (
    Item,
    Scenario,
    fired,
    produce_mix,
    step,
    verify_ok,
    wait_drained,
)

BOUNDS = {"db_connect_timeout_s": 2, "db_statement_timeout_s": 3, "db_commit_timeout_s": 3}


def test_a_black_hole_past_the_leave_bound_hands_the_partitions_over(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Toxiproxy's ``timeout`` toxic (bytes dropped both ways, both TCP legs open): a's
    statements time out, and each reconnect's TCP connect succeeds but its handshake gets
    no answer, which counts as failing to connect."""
    with ToxiproxyServer.start() as server:
        proxy, relayed = relay_postgresql(server, dsn)

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


def test_a_rejoin_does_not_cancel_a_leave_that_a_rebalance_postponed(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """librdkafka (classic protocol) postpones an unsubscribe made during a rebalance until
    the rebalance's assignment operations are done, and a subscribe clears a postponed
    unsubscribe (rdkafka_cgrp.c, rd_kafka_cgrp_subscribe). a decides to leave (its link to
    PostgreSQL silent past ``db_leave_after_s``; the ``before_leave`` stall holds it
    there) while b stops, so its unsubscribe meets the assign of b's partitions still
    unserved. Out of the group, a does not claim them; confluent-kafka assigns them
    itself, without offsets, and their committed-offset fetch is still under way (a
    transaction left open with the group's offsets makes the broker answer it
    UNSTABLE_OFFSET_COMMIT, and librdkafka retries: the window held open) when a's probe,
    its link back, answers. A subscribe then cancelled the leave: no revoke came, and b's
    partitions stayed assigned to a, never claimed, their records dropped: the group
    stalled there until another rebalance (60 s here: the drain timed out)."""
    group = f"g-{topic}"
    with ToxiproxyServer.start() as server:
        proxy, relayed = relay_postgresql(server, dsn)
        a = Worker(
            services,
            relayed,
            topic,
            tmp_path,
            name="a",
            db_leave_after_s=3,
            faults="before_leave=stall",
            fault_stall_seconds=120,
            **BOUNDS,
        )
        wait_until(lambda: "assigned [" in a.log(), 60, "a to be assigned the partitions")
        b = Worker(services, dsn, topic, tmp_path, name="b", **BOUNDS)
        wait_until(lambda: "assigned [" in b.log(), 60, "b to share the partitions")
        first = produce_mix(services, topic, tmp_path, 300, seed=2103)
        wait_drained(dsn, first, group, [a, b])  # a's connections are open
        sc = Scenario(services.bootstrap, topic, tmp_path / "more.jsonl.gz", base=first)
        try:
            proxy.add_timeout("hole", 0, "both")
            sc.send([Item.event(step(1000 + i), partition=i % 3) for i in range(30)])
            wait_until(lambda: fired(a, "before_leave"), 90, "a to decide to leave")
            proxy.remove_toxic("hole")  # a's probe will answer at once
            with _offsets_in_a_transaction(services.bootstrap, group, topic, 3):
                assert b.stop() == 0, b.log()[-4000:]
                wait_until(lambda: _alone_with(services, group, "a", 3), 60, "a to get all")
                time.sleep(1)  # a's client has the assignment; its callback waits for a
                a.release_stall("before_leave")
                wait_until(lambda: "not claiming" in a.log(), 30, "a's assign out of the group")
                waits = "joining the consumer group once the leave has revoked partitions"
                wait_until(lambda: waits in a.log(), 30, "a's probe to answer, the revoke not")
                time.sleep(2)  # a subscribe made now would meet the postponed unsubscribe
            sc.send([Item.event(step(2000 + i), partition=i % 3) for i in range(90)])
            manifest = sc.write()
            wait_drained(dsn, manifest, group, [a], timeout=60)
        finally:
            sc.close()
    verify_ok(dsn, manifest, group)
    log = a.log()
    waited = log.index(waits)  # the case under test: the probe answered before the revoke
    revoked = log.index("revoked [", waited)
    assert log.index("joining the consumer group again", waited) > revoked, log[-4000:]
    assert a.stop() == 0, a.log()[-4000:]


def _alone_with(services: Services, group: str, worker: str, partitions: int) -> bool:
    members = group_members(services.bootstrap, {}, group)
    return [m.client_id for m in members] == [worker] and len(members[0].partitions) == partitions


@contextmanager
def _offsets_in_a_transaction(
    bootstrap: str, group: str, topic: str, partitions: int
) -> Iterator[None]:
    """A transaction left open with offsets of ``group`` for ``topic``'s partitions:
    until it ends, the broker answers a read_committed client's fetch of the group's
    committed offsets UNSTABLE_OFFSET_COMMIT (KIP-447), and librdkafka fetches again, so
    a partition assigned without an offset stays an assignment operation under way.
    Aborted on exit: the group's committed offsets stay as they were."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"hold-{uuid.uuid4().hex[:8]}",
            "transaction.timeout.ms": 180_000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        offsets = [TopicPartition(topic, p, 0) for p in range(partitions)]
        producer.send_offsets_to_transaction(offsets, member.consumer_group_metadata(), 30)
    finally:
        member.close()
    try:
        yield
    finally:
        producer.abort_transaction(30)
