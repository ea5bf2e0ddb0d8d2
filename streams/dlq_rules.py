"""The dead-letter producer's rules, pure: what to do about a produce error, how to make
any poison record fit the dead-letter topic, and what a usable dead-letter topic is.

Facts they rest on (confluent-kafka 2.16.1 / librdkafka 2.16, reproduced against Kafka
4.1): a delivery report's ``KafkaError`` says ``retriable()`` and ``fatal()`` False
whatever happened, so errors are told apart by ``code()``; librdkafka already retried the
transient ones until ``delivery.timeout.ms``; it never splits a batch the broker refused
as too large (so a size error is first retried with the record alone); the broker checks
``max.message.bytes`` on the compressed batch, ``produce()`` checks the producer's
``message.max.bytes`` on the uncompressed record.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from confluent_kafka import KafkaError

from ackline.sinks.ingest.batch import Coord

MIB = 1_048_576
OWN_HEADERS = (
    "ackline.reason",
    "ackline.detail",
    "ackline.source.topic",
    "ackline.source.partition",
    "ackline.source.offset",
)
"""The headers ackline adds to every dead letter, in this order."""
DLQ_MAX_MESSAGE_BYTES = 10 * MIB
"""Record size limit of the dead-letter producer and of the topic it creates."""
DLQ_MIN_MESSAGE_BYTES = 16_384
"""A dead-letter topic whose ``max.message.bytes`` is below this cannot hold a stub."""


class Action(Enum):
    """What the dead-letter producer does about one failed record (:func:`classify`)."""

    RETRY = "retry"
    """Transient (librdkafka gave up after ``delivery.timeout.ms``): send it again."""
    SHRINK = "shrink"
    """The topic can never take this record as is: send a stub of it (:func:`fit`)."""
    OPERATOR = "operator"
    """No record gets through until an operator acts (topic missing, not authorized):
    retry with back-off and say so at ERROR; never reject a record for it."""
    NEW_PRODUCER = "new_producer"
    """This producer instance is dead (a fatal error): build a new one, then retry."""


RETRY_ALERT_S = 60.0
"""Records still not written after this long: a transient error is logged at ERROR, since
the batch that holds them (and, in the default runtime, every partition of the worker)
waits for them."""


def log_level(action: Action, waited_s: float) -> int:
    """The level of the line saying records were not written: a transient error is a
    WARNING until they have waited :data:`RETRY_ALERT_S`, anything else an ERROR. Pure."""
    if action is Action.RETRY and waited_s < RETRY_ALERT_S:
        return logging.WARNING
    return logging.ERROR


_SHRINK = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,  # 10: the broker (topic limit) or produce() itself
        KafkaError.RECORD_LIST_TOO_LARGE,  # 18
        KafkaError.INVALID_RECORD,  # 87: e.g. a null key to a compacted topic
        KafkaError.INVALID_TIMESTAMP,  # 32: message.timestamp.before/after.max.ms
        KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT,  # 43
        KafkaError.POLICY_VIOLATION,  # 44
        KafkaError._BAD_MSG,  # -199
        KafkaError._INVALID_ARG,  # -186: a record librdkafka refuses
    }
)
_OPERATOR = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,  # 29: then produce() raises it at once
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,  # 31
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,  # 53
        KafkaError.UNKNOWN_TOPIC_OR_PART,  # 3: after topic.metadata.propagation.max.ms
        KafkaError._UNKNOWN_TOPIC,  # -188
        KafkaError._UNKNOWN_PARTITION,  # -190
        KafkaError.INVALID_REQUIRED_ACKS,  # 21
        KafkaError.SASL_AUTHENTICATION_FAILED,  # 58
        KafkaError._AUTHENTICATION,  # -169
        KafkaError.NOT_ENOUGH_REPLICAS,  # 19: min.insync.replicas above the live brokers
    }
)
_NEW_PRODUCER = frozenset(
    {
        KafkaError._FATAL,  # -150: produce() after a fatal error
        KafkaError._FENCED,  # -144
        KafkaError.PRODUCER_FENCED,  # 90
        KafkaError._GAPLESS_GUARANTEE,  # -148
    }
)


def classify(err: KafkaError) -> Action:
    """What to do about ``err``, from a delivery report or a raised KafkaException. Pure.

    Decided on ``code()`` (and ``fatal()``, which only raised errors carry). Anything not
    listed (``_MSG_TIMED_OUT``, ``_TRANSPORT``, ``REQUEST_TIMED_OUT``, leader moves,
    ``_PURGE_*``, ...) is transient: librdkafka already retried it, the next round may
    succeed, and a record is never dropped or shrunk for it.
    """
    code = err.code()
    if err.fatal() or code in _NEW_PRODUCER:
        return Action.NEW_PRODUCER
    if code in _SHRINK:
        return Action.SHRINK
    if code in _OPERATOR:
        return Action.OPERATOR
    return Action.RETRY


# ---- making a dead letter fit -----------------------------------------------------------

RECORD_OVERHEAD = 512
"""Bytes budgeted for a record's framing (batch header, varints) on top of its data."""
STUB_VALUE_BYTES = 65_536
"""A stub keeps at most this much of the original value."""
STUB_MAX_KEY_BYTES = 1_024
"""A stub replaces a larger key by its SHA-256 digest."""
STUB_MAX_HEADER_BYTES = 4_096
"""A stub drops original headers larger than this (key and value)."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record as the dead-letter producer sends it."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]

    @property
    def size(self) -> int:
        """Its size as librdkafka checks it against ``message.max.bytes`` (uncompressed),
        plus :data:`RECORD_OVERHEAD`."""
        size = len(self.key or b"") + len(self.value or b"") + RECORD_OVERHEAD
        for name, value in self.headers:
            size += len(name.encode()) + len(value or b"") + 10
        return size


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).hexdigest().encode()


def fit(letter: DeadLetter, limit: int, why: str) -> DeadLetter:
    """``letter`` if it is under ``limit`` bytes, else a stub of it that is. Pure.

    The stub keeps the first :data:`STUB_VALUE_BYTES` of the value (fewer if ``limit``
    needs it), replaces a key over :data:`STUB_MAX_KEY_BYTES` by its SHA-256 digest,
    drops headers over :data:`STUB_MAX_HEADER_BYTES`, and says what it left out in
    headers: ``ackline.stub`` (``why``); ``ackline.value-truncated`` (the original
    length) and ``ackline.truncated.value-sha256`` when the value was cut;
    ``ackline.truncated.key-length`` and ``-key-sha256``;
    ``ackline.truncated.headers-dropped``. The reject row in PostgreSQL keeps the whole
    record.
    """
    if letter.size <= limit:
        return letter
    return stub(letter, limit, why)


def _notes(letter: DeadLetter, why: str) -> tuple[bytes | None, list[tuple[str, bytes | None]]]:
    """The key a stub of ``letter`` carries, and the headers saying why and what of the
    key was left out."""
    notes: list[tuple[str, bytes | None]] = [("ackline.stub", why.encode()[:500])]
    key = letter.key
    if key is not None and len(key) > STUB_MAX_KEY_BYTES:
        notes.append(("ackline.truncated.key-length", str(len(key)).encode()))
        notes.append(("ackline.truncated.key-sha256", _digest(key)))
        key = hashlib.sha256(key).digest()
    return key, notes


def _value_notes(value: bytes) -> list[tuple[str, bytes | None]]:
    return [
        ("ackline.value-truncated", str(len(value)).encode()),
        ("ackline.truncated.value-sha256", _digest(value)),
    ]


def stub(letter: DeadLetter, limit: int, why: str) -> DeadLetter:
    """A stub of ``letter`` under ``limit`` (see :func:`fit`), whatever its size. Pure.

    A stub replayed and stubbed again carries the first stub's notes among its headers:
    each note this stub writes replaces the one of the same name (one of each, as of
    ackline's other headers); one it does not write (the first key's length) stays.
    """
    key, notes = _notes(letter, why)
    kept = [
        (name, value)
        for name, value in letter.headers
        if len(name.encode()) + len(value or b"") <= STUB_MAX_HEADER_BYTES
    ]
    if len(kept) < len(letter.headers):
        dropped = len(letter.headers) - len(kept)
        notes.append(("ackline.truncated.headers-dropped", str(dropped).encode()))

    def headers() -> list[tuple[str, bytes | None]]:
        noted = {name for name, _ in notes}
        return [h for h in kept if h[0] not in noted] + notes

    value = letter.value
    if value is not None:
        room = min(STUB_VALUE_BYTES, limit - DeadLetter(key, None, headers()).size)
        if len(value) > room:
            notes += _value_notes(value)
            room = min(STUB_VALUE_BYTES, limit - DeadLetter(key, None, headers()).size)
            value = value[: max(0, room)]
    return DeadLetter(key, value, headers())


def bare(letter: DeadLetter, coord: Coord, why: str) -> DeadLetter:
    """The smallest dead letter of ``letter``: no value and none of the original headers,
    only ackline's (reason, detail, source coordinates, what was left out), keyed by its
    source coordinates (a compacted topic refuses a null key). Sent when the topic
    refused even a :func:`stub`. Pure."""
    _, notes = _notes(letter, why)
    if letter.value is not None:
        notes += _value_notes(letter.value)
    own = [
        (name, value)
        for name, value in letter.headers
        if name in OWN_HEADERS and len(value or b"") <= STUB_MAX_HEADER_BYTES
    ]
    key = f"{coord.topic}/{coord.partition}/{coord.offset}".encode()
    return DeadLetter(key, None, own + notes)


def letter_headers(
    original: list[tuple[str, bytes | None]], reason: str, detail: str, coord: Coord
) -> list[tuple[str, bytes | None]]:
    """The headers of a dead letter: the original record's (made safe to produce by
    ``headers_for_produce``), then ackline's own (:data:`OWN_HEADERS`): the reason, the
    detail (its first 1,000 bytes) and the source coordinates. Pure.

    An original header named like one of ackline's own is dropped: a record replayed
    from the dead-letter topic (or forged) carries them, and a reader de-duplicating on
    the first ``ackline.source.offset`` would take a stale or false one. So a dead letter
    has exactly one of each, this rejection's; the reject row keeps the original's all.
    """
    own = (
        reason.encode(),
        detail.encode("utf-8", "replace")[:1000],
        coord.topic.encode(),
        str(coord.partition).encode(),
        str(coord.offset).encode(),
    )
    others = [(name, value) for name, value in original if name not in OWN_HEADERS]
    return [*others, *zip(OWN_HEADERS, own, strict=True)]


def kept(data: bytes | None, budget: int) -> tuple[bytes | None, str]:
    """``data`` cut to ``budget`` bytes, and a note saying so ("" when whole). Pure."""
    if data is None or len(data) <= budget:
        return data, ""
    digest = hashlib.sha256(data).hexdigest()
    return data[: max(budget, 0)], f"first {max(budget, 0)} of {len(data)} bytes, sha256 {digest}"


def weaker_than_source(
    dlq_rf: int, dlq_min_isr: int, source_rf: int, source_min_isr: int, brokers: int
) -> list[str]:
    """How a dead-letter topic is less durable than the source topic it serves ([]: it is
    not). The bar is the source's replication factor (capped by the broker count) and its
    min.insync.replicas: a dead letter must survive what an ingested event survives. Pure."""
    out = []
    want_rf = max(min(source_rf, brokers), 1)
    if dlq_rf < want_rf:
        out.append(f"replication factor {dlq_rf} < {want_rf} of the source topic")
    want_isr = min(source_min_isr, want_rf)
    if dlq_min_isr < want_isr:
        out.append(f"min.insync.replicas {dlq_min_isr} < {want_isr} of the source topic")
    return out


def dlq_problems(
    config: Mapping[str, str], producer_limit: int = DLQ_MAX_MESSAGE_BYTES
) -> tuple[list[str], list[str]]:
    """(problems, warnings) of an existing dead-letter topic's ``config``. Pure.

    A problem makes the topic unusable: compaction (it deletes dead letters that share a
    key) or a ``max.message.bytes`` too small for a bare dead letter. A limit below the
    producer's only means more stubs: a warning.
    """
    problems, warnings = [], []
    policy = config.get("cleanup.policy", "delete")
    if "compact" in {p.strip() for p in policy.split(",")}:
        problems.append(
            f"cleanup.policy={policy} deletes dead letters that share a key (use delete)"
        )
    limit = int(config.get("max.message.bytes", str(producer_limit)))
    if limit < DLQ_MIN_MESSAGE_BYTES:
        problems.append(
            f"max.message.bytes={limit} cannot hold a dead letter (at least "
            f"{DLQ_MIN_MESSAGE_BYTES}; ackline creates the topic with {producer_limit})"
        )
    elif limit < producer_limit:
        warnings.append(
            f"max.message.bytes={limit}: a poison record larger than that after compression "
            "is dead-lettered as a stub (its reject row keeps it whole)"
        )
    return problems, warnings
