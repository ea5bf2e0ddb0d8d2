"""Topic administration at the edge: existence checks, shapes and creation.

Admin clients log through :func:`ackline.core.logs.kafka_logger`; an AdminClient hands
librdkafka's lines over only when polled, so every function here polls once when done
(:func:`drain`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, TypeVar

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from ackline.core.logs import kafka_logger
from ackline.core.signals import stops_between
from ackline.streams.errors import KafkaUnavailableError, StoppingError, TopicError, error_code

T = TypeVar("T")

_VISIBLE_WITHIN_S = 30.0  # a created topic must show in metadata within this


def admin(bootstrap: str, conf: Mapping[str, Any] | None = None) -> AdminClient:
    """An AdminClient; ``conf`` adds client properties (security: kafka_client_config)."""
    config: dict[str, Any] = {
        "logger": kafka_logger(),  # librdkafka's lines, de-duplicated (core/logs.py)
        **(conf or {}),
        "bootstrap.servers": bootstrap,
    }
    return AdminClient(config)


def drain(client: Any) -> None:
    """Hand the client's queued librdkafka log lines to the logger (admin clients and
    idle producers deliver them only when polled)."""
    with contextlib.suppress(Exception):
        client.poll(0)


@contextmanager
def admin_client(bootstrap: str, conf: Mapping[str, Any] | None = None) -> Iterator[AdminClient]:
    """:func:`admin` for one piece of work; its log lines are drained at the end."""
    client = admin(bootstrap, conf)
    try:
        yield client
    finally:
        drain(client)


TRY_S = 0.25
"""The first try of a read that :func:`answered` repeats: a stop is handled between two."""
TRY_MAX_S = 2.0
"""The longest try: a stop waits for the try under way."""
_NO_BROKER = (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT)


def answered(
    read: Callable[..., T], timeout: float, stopping: Callable[[], bool] = lambda: False
) -> T:
    """``read(timeout=seconds)`` (librdkafka's metadata and offset reads) until it answers
    or ``timeout`` has passed, in short tries, a stop request handled between them: a
    signal in the main thread (:func:`ackline.core.signals.stops_between`), elsewhere
    ``stopping()`` (then :class:`StoppingError`). These reads block in C, where Python's
    signal handlers do not run: one read with the whole timeout held SIGTERM and Ctrl-C
    for its length (a worker's stop at start-up was lost; a capture with a negative
    timeout, which librdkafka takes as none, was deaf for good). A try that timed out
    (a slow answer, which a try as short would cut again) gets twice as long the next
    time. Errors other than no broker, and the last try's, are raised as they are."""
    deadline = time.monotonic() + timeout
    each = TRY_S
    with stops_between() as check:
        while True:
            if stopping():
                raise StoppingError("stopping: gave up waiting for Kafka")
            left = deadline - time.monotonic()
            try:
                return read(timeout=max(min(each, left), 0.01))
            except KafkaException as exc:
                check()
                code = error_code(exc)
                if left <= each or code not in _NO_BROKER:
                    raise
                if code == KafkaError._TIMED_OUT:
                    each = min(each * 2, TRY_MAX_S)


def metadata(
    client: Any,
    bootstrap: str,
    timeout: float,
    topic: str | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> Any:
    """``client.list_topics`` (an AdminClient's or a Consumer's) through :func:`answered`;
    :class:`KafkaUnavailableError` when it did not answer."""
    try:
        return answered(functools.partial(client.list_topics, topic=topic), timeout, stopping)
    except KafkaException as exc:
        raise unreachable(bootstrap, exc) from exc


def partition_count(
    bootstrap: str, topic: str, timeout: float = 10.0, *, conf: Mapping[str, Any] | None = None
) -> int | None:
    """Partitions of ``topic``, or None when it does not exist."""
    client = _reaching(bootstrap, conf)
    try:
        return _partitions(client, bootstrap, topic, timeout)
    finally:
        drain(client)


def unreachable(bootstrap: str, exc: KafkaException) -> KafkaUnavailableError:
    """The error for a client that could not reach the brokers at ``bootstrap``."""
    return KafkaUnavailableError(
        f"cannot reach Kafka at {bootstrap}: {exc}: is Kafka running there? check "
        "ACKLINE_KAFKA_BOOTSTRAP (or start the local stack: `ackline dev up`)"
    )


def _reaching(bootstrap: str, conf: Mapping[str, Any] | None) -> AdminClient:
    """:func:`admin`, a client that cannot be made being :class:`KafkaUnavailableError`."""
    try:
        return admin(bootstrap, conf)
    except KafkaException as exc:
        raise unreachable(bootstrap, exc) from exc


def _partitions(
    client: AdminClient,
    bootstrap: str,
    topic: str,
    timeout: float,
    stopping: Callable[[], bool] = lambda: False,
) -> int | None:
    """:func:`partition_count` through ``client``."""
    meta = metadata(client, bootstrap, timeout, topic, stopping)
    found = meta.topics.get(topic)
    if found is None or found.error is not None:
        return None
    return len(found.partitions)


@dataclass(frozen=True, slots=True)
class TopicShape:
    """What a worker needs to know of a topic before it uses it."""

    partitions: int
    replication_factor: int  # the smallest over its partitions
    brokers: int  # in the cluster
    config: dict[str, str] | None  # None: not readable (no DescribeConfigs permission)
    config_error: str = ""


def topic_shape(
    bootstrap: str,
    topic: str,
    timeout: float = 10.0,
    *,
    conf: Mapping[str, Any] | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> TopicShape | None:
    """Partitions, replication, broker count and configuration of ``topic``; None when it
    does not exist. A configuration that cannot be read (not authorized) is None, with
    why: a worker may be allowed to use a topic without being allowed to describe it."""
    with admin_client(bootstrap, conf) as client:
        meta = metadata(client, bootstrap, timeout, topic, stopping)
        found = meta.topics.get(topic)
        if found is None or found.error is not None:
            return None
        replicas = [len(p.replicas) for p in found.partitions.values()]
        config: dict[str, str] | None = None
        error = ""
        resource = ConfigResource(ResourceType.TOPIC, topic)
        try:
            futures = client.describe_configs([resource], request_timeout=timeout)
            entries = futures[resource].result(timeout=timeout)
            config = {name: str(entry.value) for name, entry in entries.items()}
        except KafkaException as exc:
            error = str(exc)
    return TopicShape(
        partitions=len(found.partitions),
        replication_factor=min(replicas) if replicas else 0,
        brokers=len(meta.brokers),
        config=config,
        config_error=error,
    )


KAFKA_MAX_MESSAGE_BYTES = 1_048_588
"""Kafka's default ``message.max.bytes`` (a broker's, so its topics' ``max.message.bytes``)."""


def max_message_bytes(shape: TopicShape | None) -> int | None:
    """The largest record batch the topic takes (``max.message.bytes``), None when its
    configuration could not be read."""
    value = (shape.config or {}).get("max.message.bytes") if shape is not None else None
    return int(value) if value is not None and value.isdigit() else None


MISSING_TOPIC: Final = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})
"""The codes that say a topic does not exist (or is not yet visible to this client)."""


class TopicLimit(NamedTuple):
    """What a start-up read of a topic's ``max.message.bytes`` found: the limit (None
    when it cannot be known) and whether the cluster said the topic does not exist."""

    limit: int | None
    missing: bool


def topic_limit(
    bootstrap: str, topic: str, timeout: float, *, conf: Mapping[str, Any] | None = None
) -> TopicLimit:
    """The topic's ``max.message.bytes`` (its own, or the broker's it inherits), read in
    one DescribeConfigs request within ``timeout``; no limit when it cannot be known: the
    topic missing (said as ``missing``: the producer SDK warns of it at start, where a
    mistyped name otherwise shows only when a transaction fails), describing it not
    allowed, no answer in time. The producer SDK batches within it
    (:func:`ackline.streams.producer.batch_within`)."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    with admin_client(bootstrap, conf) as client:
        try:
            futures = client.describe_configs([resource], request_timeout=max(timeout, 0.1))
            entries = futures[resource].result(timeout=max(timeout, 0.1))
        except KafkaException as exc:
            return TopicLimit(None, error_code(exc) in MISSING_TOPIC)
        except (TimeoutError, concurrent.futures.TimeoutError):
            return TopicLimit(None, False)
    entry = entries.get("max.message.bytes")
    value = str(entry.value) if entry is not None else ""
    return TopicLimit(int(value) if value.isdigit() else None, False)


def topic_max_message_bytes(
    bootstrap: str, topic: str, timeout: float, *, conf: Mapping[str, Any] | None = None
) -> int | None:
    """:func:`topic_limit`'s limit alone."""
    return topic_limit(bootstrap, topic, timeout, conf=conf).limit


def broker_max_message_bytes(
    bootstrap: str, timeout: float = 10.0, *, conf: Mapping[str, Any] | None = None
) -> int:
    """A broker's ``message.max.bytes``: what a topic without its own setting takes.
    Kafka's default when it cannot be read (describing a broker is a permission of its
    own). A client that cannot be made is :class:`KafkaUnavailableError`."""
    client = _reaching(bootstrap, conf)
    try:
        brokers = sorted(metadata(client, bootstrap, timeout).brokers)
        resource = ConfigResource(ResourceType.BROKER, str(brokers[0] if brokers else 0))
        try:
            futures = client.describe_configs([resource], request_timeout=timeout)
            value = str(futures[resource].result(timeout=timeout)["message.max.bytes"].value)
        except (KafkaException, KeyError, TimeoutError):
            return KAFKA_MAX_MESSAGE_BYTES
    finally:
        drain(client)
    return int(value) if value.isdigit() else KAFKA_MAX_MESSAGE_BYTES


def topic_config_for(
    bootstrap: str, need: int | None, *, conf: Mapping[str, Any] | None = None
) -> dict[str, str] | None:
    """The configuration a new topic needs for records of ``need`` bytes (None: not known):
    ``max.message.bytes`` set only above the broker's own limit, which the topic inherits,
    so never narrower than that (the broker is asked only when it may matter)."""
    wide = (
        need is not None
        and need > KAFKA_MAX_MESSAGE_BYTES
        and need > broker_max_message_bytes(bootstrap, conf=conf)
    )
    return {"max.message.bytes": str(need)} if wide else None


def ensure_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    config: dict[str, str] | None = None,
    *,
    replication_factor: int = 1,
    conf: Mapping[str, Any] | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> int:
    """Create ``topic`` when missing; return its partition count.

    One admin client does it all (a client per metadata read connected anew each time),
    and a created topic that does not show in metadata within ``_VISIBLE_WITHIN_S``
    raises :class:`TopicError` then, not up to a read's timeout later. Every wait ends
    with :class:`StoppingError` soon after ``stopping()`` turns true."""
    client = _reaching(bootstrap, conf)  # it outlives the create's futures (they die with it)
    try:
        existing = _partitions(client, bootstrap, topic, 10.0, stopping)
        if existing is not None:
            return existing
        new = NewTopic(
            topic,
            num_partitions=partitions,
            replication_factor=replication_factor,
            config=config or {},
        )
        futures = client.create_topics([new], operation_timeout=30)
        try:
            _outcome(futures[topic], 60, stopping)
        except KafkaException as exc:
            if error_code(exc) != KafkaError.TOPIC_ALREADY_EXISTS:
                raise TopicError(f"cannot create topic {topic}: {exc}") from exc
        return wait_visible(client, bootstrap, topic, _VISIBLE_WITHIN_S, stopping)
    finally:
        drain(client)


def _outcome(future: Any, timeout: float, stopping: Callable[[], bool]) -> Any:
    """An admin request's result within ``timeout`` s, waited for in short turns so that
    ``stopping()`` ends the wait (:class:`StoppingError`)."""
    deadline = time.monotonic() + timeout
    while True:
        if stopping():
            raise StoppingError("stopping: gave up waiting for Kafka")
        try:
            return future.result(timeout=max(0.0, min(TRY_S, deadline - time.monotonic())))
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise


def wait_visible(
    client: AdminClient,
    bootstrap: str,
    topic: str,
    within: float,
    stopping: Callable[[], bool] = lambda: False,
) -> int:
    """The partition count of ``topic`` once metadata shows it, read through ``client``
    until ``within`` seconds have passed (each read bounded by the time left): then
    :class:`TopicError`, or :class:`KafkaUnavailableError` for a read not answered.

    CreateTopics answers once the controller has the topic; the broker that answers the
    metadata request may learn of it a moment later, so one read can miss it."""
    deadline = time.monotonic() + within
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TopicError(f"topic {topic} was created but is not visible after {within:g} s")
        count = _partitions(client, bootstrap, topic, min(left, 10.0), stopping)
        if count is not None:
            return count
        time.sleep(min(0.1, max(deadline - time.monotonic(), 0.0)))


def delete_topic(bootstrap: str, topic: str, *, conf: Mapping[str, Any] | None = None) -> None:
    delete_topics(bootstrap, [topic], conf=conf)


def delete_topics(
    bootstrap: str, topics: list[str], *, conf: Mapping[str, Any] | None = None
) -> None:
    """Delete ``topics`` in one request; TopicError names the first that was not deleted."""
    if not topics:
        return
    with admin_client(bootstrap, conf) as client:
        for topic, future in client.delete_topics(topics, operation_timeout=30).items():
            try:
                future.result(timeout=60)
            except KafkaException as exc:
                raise TopicError(f"cannot delete topic {topic}: {exc}") from exc
            except TimeoutError as exc:  # the future's own wait: no answer in 60 s
                raise TopicError(f"cannot delete topic {topic}: no answer in 60 s") from exc


def stable_ends(
    client: AdminClient, partitions: list[tuple[str, int]], timeout: float = 5.0
) -> dict[tuple[str, int], int]:
    """The last stable offset of each partition (what a read_committed consumer reaching
    the end stops at: records of open transactions are below it). Partitions with none
    within ``timeout`` are left out, with no second try (:func:`stable_ends_and_why`
    asks again and says why): the consumer thread's lag reports call it."""
    return stable_ends_and_why(client, partitions, timeout, again=False)[0]


LIST_AGAIN_S = 0.2
"""Between two ListOffsets of the partitions a retriable error answered."""

_END_NOT_READY = frozenset(
    {
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
    }
)


def end_not_ready(exc: KafkaException) -> bool:
    """Whether a partition's ListOffsets error is one a second ask can cure: a leader
    being elected or moving (a topic just made, a broker restarted), metadata not there
    yet, a request lost with its connection. By ``code()``: confluent-kafka's admin
    results say ``retriable()`` False whatever the error. Pure."""
    return error_code(exc) in _END_NOT_READY


def stable_ends_and_why(
    client: AdminClient,
    partitions: list[tuple[str, int]],
    timeout: float = 5.0,
    again: bool = True,
) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], str]]:
    """:func:`stable_ends`, and for each partition left out the last answer it got.

    With ``again``, an error :func:`end_not_ready` names (a leader being elected, as on
    a topic just made) is asked again until ``timeout``: it had left the partition out
    at once, and a worker with ``start_from=latest`` then started it at the log start,
    warning "within 5 s" after 0.4 s. The client's queued log lines are drained (a
    long-lived admin client would otherwise keep librdkafka's lines queued)."""
    found: dict[tuple[str, int], int] = {}
    why: dict[tuple[str, int], str] = {}
    if not partitions:
        return found, why
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    deadline = time.monotonic() + timeout
    left = list(partitions)
    while left:
        budget = max(0.1, deadline - time.monotonic())
        asked = {TopicPartition(t, p): latest for t, p in left}
        futures = client.list_offsets(
            asked, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=budget
        )
        retry: list[tuple[str, int]] = []
        for tp, future in futures.items():
            key = (tp.topic, tp.partition)
            try:
                offset = int(future.result(timeout=budget).offset)
            except KafkaException as exc:
                why[key] = str(exc)
                if again and end_not_ready(exc):
                    retry.append(key)
                continue
            except TimeoutError:  # the future's own wait ran out first
                why[key] = f"no answer within {timeout:g} s"
                continue
            if offset >= 0:  # a broker that did not answer can leave OFFSET_INVALID (-1001)
                found[key] = offset
                why.pop(key, None)
            else:
                why[key] = f"no offset in the answer ({offset})"
        if not retry or time.monotonic() + LIST_AGAIN_S >= deadline:
            break
        time.sleep(LIST_AGAIN_S)
        left = retry
    drain(client)
    return found, why
