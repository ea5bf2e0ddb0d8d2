"""Read-only Kafka facts for the operator commands: watermarks, committed offsets,
topic configuration and the timestamps of the oldest unconsumed records.

Nothing here joins a group or commits: the consumers below only ``assign`` or query,
with ``enable.auto.commit`` off. confluent-kafka errors are wrapped at this boundary.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType  # type: ignore[attr-defined]

from ackline.core.logs import kafka_logger
from ackline.streams.admin import admin, admin_client, drain, metadata, unreachable
from ackline.streams.errors import KafkaUnavailableError, error_code

Conf = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """One partition's log bounds and the group's committed offset (None: none committed).

    ``high`` is the end a read_committed reader reads to, the last stable offset: the
    consumer that asks is read_committed, and librdkafka's ListOffsets carries its
    isolation level (records of a transaction still open upstream are past it)."""

    partition: int
    low: int
    high: int
    committed: int | None


@dataclass(frozen=True, slots=True)
class TopicFacts:
    topic: str
    partitions: int
    replication_factor: int  # the smallest over the partitions
    brokers: int
    config: dict[str, str]  # retention.ms, min.insync.replicas, cleanup.policy, ...


@contextmanager
def _consumer(bootstrap: str, conf: Conf, group_id: str) -> Iterator[Consumer]:
    consumer = Consumer(
        {
            "logger": kafka_logger(),
            **conf,
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        yield consumer
    finally:
        consumer.close()


def topic_offsets(
    bootstrap: str, conf: Conf, group_id: str, topic: str, timeout: float = 10.0
) -> list[PartitionOffsets] | None:
    """Watermarks and ``group_id``'s committed offsets per partition; None if no topic."""
    try:
        with _consumer(bootstrap, conf, group_id) as consumer:
            meta = metadata(consumer, bootstrap, timeout, topic).topics.get(topic)
            if meta is None or meta.error is not None:
                return None
            tps = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
            committed = {tp.partition: tp.offset for tp in consumer.committed(tps, timeout)}
            found = []
            for tp in tps:
                low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
                offset = committed.get(tp.partition, -1)
                found.append(
                    PartitionOffsets(tp.partition, low, high, offset if offset >= 0 else None)
                )
            return found
    except KafkaException as exc:
        raise KafkaUnavailableError(
            f"cannot read offsets of {topic} at {bootstrap}: {exc}"
        ) from exc


def describe_topic(
    bootstrap: str, conf: Conf, topic: str, timeout: float = 10.0
) -> TopicFacts | None:
    """Partition count, replication factor, broker count and configuration; None if no topic."""
    client = admin(bootstrap, conf)
    try:
        meta = metadata(client, bootstrap, timeout, topic)
        found = meta.topics.get(topic)
        if found is None or found.error is not None:
            return None
        resource = ConfigResource(ResourceType.TOPIC, topic)
        futures = client.describe_configs([resource], request_timeout=timeout)
        entries = futures[resource].result(timeout=timeout)
    except KafkaException as exc:
        raise KafkaUnavailableError(f"cannot describe {topic} at {bootstrap}: {exc}") from exc
    finally:
        drain(client)
    replicas = [len(p.replicas) for p in found.partitions.values()]
    return TopicFacts(
        topic=topic,
        partitions=len(found.partitions),
        replication_factor=min(replicas) if replicas else 0,
        brokers=len(meta.brokers),
        config={name: str(entry.value) for name, entry in entries.items()},
    )


def kafka_uuid_text(most: int, least: int) -> str | None:
    """A Kafka UUID (its two signed 64-bit halves) as Kafka prints it (``kafka-topics
    --describe``: URL-safe base64, unpadded; librdkafka's own text uses the other
    alphabet), or None for the all-zero UUID, which a broker that keeps no topic IDs
    gives. Pure."""
    raw = most.to_bytes(8, "big", signed=True) + least.to_bytes(8, "big", signed=True)
    if not any(raw):
        return None
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def topic_id(bootstrap: str, conf: Conf, topic: str, timeout: float = 10.0) -> str | None:
    """The ID of ``topic``'s incarnation (:func:`kafka_uuid_text`): a topic deleted and
    made again under its name has a new one. None when the topic does not exist or the
    broker keeps no IDs. Raises KafkaUnavailableError when the broker cannot be asked or
    refuses (describe not allowed). One DescribeTopics request; reads only."""
    found = topic_incarnation(bootstrap, conf, topic, timeout)
    return None if found is None else found[0]


def topic_incarnation(
    bootstrap: str, conf: Conf, topic: str, timeout: float = 10.0
) -> tuple[str, int] | None:
    """:func:`topic_id` and the incarnation's partition count, from the same answer."""
    try:
        with admin_client(bootstrap, conf) as client:
            found = described(client, bootstrap, topic, timeout)
    except KafkaException as exc:  # the client could not be made
        raise KafkaUnavailableError(f"cannot describe {topic} at {bootstrap}: {exc}") from exc
    return None if found is None or found.topic_id is None else (found.topic_id, found.partitions)


@dataclass(frozen=True, slots=True)
class Described:
    """What DescribeTopics says of an existing topic: its ID (None: the broker keeps
    none) and its partition count."""

    topic_id: str | None
    partitions: int


def described(client: AdminClient, bootstrap: str, topic: str, timeout: float) -> Described | None:
    """One DescribeTopics of ``topic`` on a client of the caller's (a watch that asks again
    and again); None when Kafka has no such topic. Raises KafkaUnavailableError when the
    broker cannot be asked or refuses."""
    try:
        futures = client.describe_topics(TopicCollection([topic]), request_timeout=timeout)
        found = futures[topic].result(timeout=timeout)
    except KafkaException as exc:
        if error_code(exc) == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        raise KafkaUnavailableError(f"cannot describe {topic} at {bootstrap}: {exc}") from exc
    except TimeoutError as exc:  # librdkafka's own timeout may come late
        raise KafkaUnavailableError(f"cannot describe {topic} at {bootstrap}: no answer") from exc
    uid = found.topic_id
    text = (
        None
        if uid is None
        else kafka_uuid_text(uid.get_most_significant_bits(), uid.get_least_significant_bits())
    )
    return Described(text, len(found.partitions))


def reachable(bootstrap: str, conf: Conf, timeout: float = 5.0) -> int:
    """The number of brokers in the cluster metadata; raises KafkaUnavailableError."""
    try:
        with admin_client(bootstrap, conf) as client:
            return len(metadata(client, bootstrap, timeout).brokers)
    except KafkaException as exc:  # the client could not be made (a bad ssl.ca.location)
        raise unreachable(bootstrap, exc) from exc


@dataclass(frozen=True, slots=True)
class GroupMember:
    """A live member of a consumer group: its client id (ackline sets it to the worker
    id) and the partitions Kafka assigned to it."""

    client_id: str
    host: str
    partitions: tuple[tuple[str, int], ...]


RETRY_S = 0.25
"""Between two DescribeGroups while the group's coordinator is not ready."""

_COORDINATOR_NOT_READY = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    }
)


def coordinator_not_ready(exc: KafkaException) -> bool:
    """Whether ``exc`` says the group's coordinator is moving or loading: on a cluster's
    first group lookup (``__consumer_offsets`` made on demand) for some seconds, and
    after a broker restart. Asked again, it answers; librdkafka's DescribeGroups does
    not ask again by itself (a fresh stack's first worker warned of it). Pure."""
    return error_code(exc) in _COORDINATOR_NOT_READY


def group_members(
    bootstrap: str, conf: Conf, group_id: str, timeout: float = 10.0
) -> list[GroupMember]:
    """The members of ``group_id`` as the group coordinator sees them now (none when the
    group is empty or unknown). Read-only: describes the group, never joins it. A
    coordinator not ready yet (:func:`coordinator_not_ready`) is asked again within
    ``timeout``."""
    client = admin(bootstrap, conf)
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = max(0.1, deadline - time.monotonic())
            try:
                futures = client.describe_consumer_groups([group_id], request_timeout=left)
                described = futures[group_id].result(timeout=left)
                break
            except KafkaException as exc:
                if not (coordinator_not_ready(exc) and time.monotonic() + RETRY_S < deadline):
                    raise
            time.sleep(RETRY_S)
    except (KafkaException, TimeoutError) as exc:  # librdkafka's own timeout may come late
        raise KafkaUnavailableError(
            f"cannot describe group {group_id} at {bootstrap}: {exc}"
        ) from exc
    finally:
        drain(client)
    members = []
    for m in described.members or []:
        assigned = m.assignment.topic_partitions if m.assignment is not None else []
        members.append(
            GroupMember(
                client_id=str(m.client_id),
                host=str(m.host),
                partitions=tuple((tp.topic, tp.partition) for tp in assigned),
            )
        )
    return members


def scan_ranges(
    bootstrap: str,
    conf: Conf,
    topic: str,
    starts: Mapping[int, int],
    ends: Mapping[int, int],
    timeout: float = 5.0,
) -> tuple[dict[int, int], set[int]]:
    """Look into ``[starts[p], ends[p])`` as a read_committed consumer does: the first
    committed record's timestamp (ms) of each partition that holds one, and the set of
    partitions that hold none (only transaction markers or aborted records, which no
    consumer will ever be given). A partition in neither had nothing readable within
    ``timeout``. Assign only, throwaway group id: nothing is joined or committed.
    """
    if not starts:
        return {}, set()
    found: dict[int, int] = {}
    empty: set[int] = set()
    tps = [TopicPartition(topic, p, off) for p, off in starts.items()]
    try:
        with _consumer(bootstrap, conf, f"ackline-inspect-{uuid.uuid4().hex[:8]}") as consumer:
            consumer.assign(tps)
            deadline = time.monotonic() + timeout
            while len(found) + len(empty) < len(starts) and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    partition = msg.partition() or 0
                    if partition not in found and (msg.offset() or 0) < ends.get(partition, 0):
                        _, stamp = msg.timestamp()
                        found[partition] = int(stamp)
                        consumer.pause([TopicPartition(topic, partition)])
                for tp in consumer.position([TopicPartition(topic, p) for p in starts]):
                    if tp.partition not in found and tp.offset >= ends.get(tp.partition, 0):
                        empty.add(tp.partition)
    except KafkaException as exc:
        raise KafkaUnavailableError(f"cannot read {topic} at {bootstrap}: {exc}") from exc
    return found, empty - found.keys()
