"""A three-broker Kafka cluster (KRaft, combined roles) from the same Maven jars.

Each node is a :class:`ackline.dev.kafka.KafkaNode` under ``<state_dir>/kafka<id>/`` with
one cluster id and a three-voter ``controller.quorum.voters``. Besides ``PLAINTEXT``
(direct clients and inter-broker traffic) and ``CONTROLLER``, every node has one listener
per *client slot* (``CLIENT<n>``): the broker binds it on a port of its own and
**advertises** another port, where a fault proxy listens (ackline.dev.infra). A broker
answers metadata with the advertised address of the listener a request came in on, so a
client that bootstraps through slot n's proxies keeps going through them, to every broker,
and a fault on those proxies hits that client alone.

Topics get replication factor 3 and ``min.insync.replicas=2`` by default (the broker
settings below), so one broker can die without losing an acknowledged record.
:class:`KafkaCluster` finds partition leaders and the active controller, kills and
restarts nodes, waits for a full ISR, and rolls the cluster one node at a time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import ElectionType, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from ackline.dev.errors import DevStackError
from ackline.dev.kafka import KafkaNode, new_cluster_id
from ackline.dev.ports import HOST, pick_free_port

SIZE = 3
READY_TIMEOUT_S = 240.0
"""Three JVMs starting at once on two busy cores take a while (measured 11-24 s idle)."""


@dataclass(frozen=True)
class ClientListener:
    """Client slot ``slot``'s listener on one broker: bound here, advertised there."""

    slot: int
    bind_port: int
    advertised_port: int

    @property
    def name(self) -> str:
        return f"CLIENT{self.slot}"


@dataclass(frozen=True)
class NodeLayout:
    node_id: int
    port: int
    controller_port: int
    clients: tuple[ClientListener, ...]


@dataclass(frozen=True)
class ClusterLayout:
    """Every port of a cluster, chosen once and recorded (``cluster.json``)."""

    cluster_id: str
    nodes: tuple[NodeLayout, ...]

    @classmethod
    def plan(cls, size: int = SIZE, client_slots: int = 0) -> ClusterLayout:
        taken: list[int] = []

        def port() -> int:
            chosen = pick_free_port(exclude=taken)
            taken.append(chosen)
            return chosen

        nodes = tuple(
            NodeLayout(
                node_id=i + 1,
                port=port(),
                controller_port=port(),
                clients=tuple(ClientListener(s, port(), port()) for s in range(client_slots)),
            )
            for i in range(size)
        )
        return cls(new_cluster_id(), nodes)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ClusterLayout:
        nodes = tuple(
            NodeLayout(
                node_id=int(n["node_id"]),
                port=int(n["port"]),
                controller_port=int(n["controller_port"]),
                clients=tuple(ClientListener(**c) for c in n["clients"]),
            )
            for n in raw["nodes"]
        )
        return cls(str(raw["cluster_id"]), nodes)


def cluster_properties(node: NodeLayout, layout: ClusterLayout, data_dir: Path) -> dict[str, str]:
    """The broker configuration of one node of ``layout``."""
    voters = ",".join(f"{n.node_id}@{HOST}:{n.controller_port}" for n in layout.nodes)
    clients = [(c.name, c.bind_port, c.advertised_port) for c in node.clients]
    listeners = [f"PLAINTEXT://{HOST}:{node.port}", f"CONTROLLER://{HOST}:{node.controller_port}"]
    listeners += [f"{name}://{HOST}:{bind}" for name, bind, _ in clients]
    advertised = [f"PLAINTEXT://{HOST}:{node.port}"]
    advertised += [f"{name}://{HOST}:{adv}" for name, _, adv in clients]
    protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
    protocols += [f"{name}:PLAINTEXT" for name, _, _ in clients]
    rf = str(min(3, len(layout.nodes)))
    isr = "2" if len(layout.nodes) >= 3 else "1"
    return {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": voters,
        "listeners": ",".join(listeners),
        "advertised.listeners": ",".join(advertised),
        "listener.security.protocol.map": ",".join(protocols),
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        "unclean.leader.election.enable": "false",
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
        "group.consumer.min.session.timeout.ms": "3000",
        "group.consumer.session.timeout.ms": "10000",
        "group.consumer.min.heartbeat.interval.ms": "500",
        "group.consumer.heartbeat.interval.ms": "1000",
        "group.min.session.timeout.ms": "3000",
        # A crashed broker is fenced (and its partitions get new leaders) after this.
        "broker.session.timeout.ms": "4000",
        "broker.heartbeat.interval.ms": "1000",
    }


class ClusterNode(KafkaNode):
    """One node of a :class:`KafkaCluster` (home ``<state_dir>/kafka<id>``)."""

    def __init__(self, state_dir: Path, node: NodeLayout, layout: ClusterLayout) -> None:
        super().__init__(
            state_dir,
            node.port,
            node.controller_port,
            home=Path(state_dir) / f"kafka{node.node_id}",
            cluster_id=layout.cluster_id,
        )
        self.node_id = node.node_id
        self.layout = node
        self._cluster = layout

    def __repr__(self) -> str:
        return f"ClusterNode({self.node_id}, port={self.port})"

    def properties(self) -> str:
        settings = cluster_properties(self.layout, self._cluster, self.data_dir)
        lines = ["# Written by ackline.dev.cluster on every start; edits are overwritten."]
        lines += [f"{key}={value}" for key, value in settings.items()]
        return "\n".join(lines) + "\n"

    def quorum_leader(self) -> int | None:
        """The active controller as this node last recorded it (None: unknown)."""
        path = self.data_dir / "__cluster_metadata-0" / "quorum-state"
        try:
            leader = int(json.loads(path.read_text(encoding="utf-8"))["leaderId"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return leader if leader >= 0 else None


class KafkaCluster:
    """The nodes of ``layout`` under ``state_dir``; construction does no I/O."""

    def __init__(self, state_dir: Path, layout: ClusterLayout) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.layout = layout
        self.nodes = [ClusterNode(self.state_dir, n, layout) for n in layout.nodes]

    @property
    def bootstrap(self) -> str:
        """Direct (``PLAINTEXT``) bootstrap servers: never through a proxy."""
        return ",".join(n.bootstrap for n in self.nodes)

    def client_bootstrap(self, slot: int) -> str:
        """Slot ``slot``'s bootstrap servers: its advertised (proxy) port on each node."""
        return ",".join(
            f"{HOST}:{c.advertised_port}"
            for n in self.layout.nodes
            for c in n.clients
            if c.slot == slot
        )

    def node(self, node_id: int) -> ClusterNode:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise DevStackError(f"no broker {node_id} in the cluster")

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 5000})

    # -- lifecycle -----------------------------------------------------------------

    def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Launch every node not running (they boot in parallel), wait until each serves
        and the cluster's metadata lists every broker."""
        for n in self.nodes:
            if not n.is_running():
                n.launch()
        for n in self.nodes:
            n.wait_ready(timeout)
        self.wait_brokers(timeout)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def kill(self) -> None:
        for n in self.nodes:
            n.kill()

    def wait_brokers(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        client = self.admin()
        while True:
            try:
                if len(client.list_topics(timeout=5).brokers) >= len(self.nodes):
                    return
            except KafkaException:
                pass
            if time.monotonic() > deadline:
                raise DevStackError(f"the cluster does not list {len(self.nodes)} brokers")
            time.sleep(0.5)

    def restart_node(self, node_id: int, hard: bool, timeout: float = READY_TIMEOUT_S) -> None:
        """SIGKILL (``hard``) or stop (SIGTERM: controlled shutdown, leaders moved away
        first) one node, start it again and wait until it serves."""
        node = self.node(node_id)
        if hard:
            node.kill()
        else:
            node.stop(timeout=120)
        node.start(timeout)

    # -- what the cluster looks like -------------------------------------------------

    def active_controller(self) -> int | None:
        """The KRaft leader, read from a running node's quorum-state file."""
        for n in self.nodes:
            if n.is_running():
                leader = n.quorum_leader()
                if leader is not None:
                    return leader
        return None

    def leaders(self, topic: str, timeout: float = 5.0) -> dict[int, int]:
        """Partition -> leader broker id (-1: none now)."""
        md = self.admin().list_topics(topic, timeout=timeout)
        found = md.topics.get(topic)
        if found is None or found.error is not None:
            raise DevStackError(f"topic {topic} is not in the metadata")
        return {p.id: p.leader for p in found.partitions.values()}

    def under_replicated(self, timeout: float = 5.0) -> list[str]:
        """Partitions of every topic whose ISR is short of their replicas, or leaderless."""
        md = self.admin().list_topics(timeout=timeout)
        bad = []
        for t in md.topics.values():
            if t.error is not None:
                bad.append(f"{t.topic}: {t.error}")
                continue
            for p in t.partitions.values():
                if p.leader < 0 or set(p.isrs) != set(p.replicas):
                    bad.append(f"{t.topic}[{p.id}] leader={p.leader} isr={p.isrs}")
        return bad

    def wait_full_isr(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        last: list[str] = []
        while True:
            try:
                last = self.under_replicated()
                if not last:
                    return
            except KafkaException as exc:
                last = [str(exc)]
            if time.monotonic() > deadline:
                raise DevStackError(f"ISR not full after {timeout:.0f}s: {last[:5]}")
            time.sleep(0.3)

    def wait_leader(self, topic: str, partition: int, not_on: int, timeout: float = 60.0) -> int:
        """Wait until ``partition`` has a leader other than broker ``not_on``; its id."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                leader = self.leaders(topic, timeout=2).get(partition, -1)
            except (KafkaException, DevStackError):
                leader = -1
            if leader not in (-1, not_on):
                return leader
            if time.monotonic() > deadline:
                raise DevStackError(f"{topic}[{partition}] has no new leader after {timeout:.0f}s")
            time.sleep(0.1)

    def preferred_election(self, topics: Sequence[str]) -> int:
        """Move leadership back to each partition's preferred replica (a roll leaves the
        node restarted last leading nothing); returns how many partitions moved."""
        client = self.admin()
        md = client.list_topics(timeout=10)
        tps = [
            TopicPartition(t, p.id)
            for t in topics
            if t in md.topics
            for p in md.topics[t].partitions.values()
            if p.replicas and p.leader != p.replicas[0]
        ]
        if not tps:
            return 0
        try:
            client.elect_leaders(ElectionType.PREFERRED, tps).result(60)
        except KafkaException:
            return 0  # best effort: leadership is only unbalanced, never unsafe
        return len(tps)

    def roll(
        self, before_each: Callable[[ClusterNode], None] | None = None, timeout: float = 240.0
    ) -> list[int]:
        """Restart every node, one at a time (the active controller last): a clean stop
        (controlled shutdown), start, and a full ISR before the next. Returns the order."""
        controller = self.active_controller()
        order = sorted(self.nodes, key=lambda n: n.node_id == controller)
        for n in order:
            self.wait_full_isr(timeout)
            if before_each is not None:
                before_each(n)
            n.stop(timeout=120)
            n.start(timeout)
        self.wait_full_isr(timeout)
        return [n.node_id for n in order]


__all__ = [
    "SIZE",
    "ClientListener",
    "ClusterLayout",
    "ClusterNode",
    "KafkaCluster",
    "NodeLayout",
    "cluster_properties",
]
