"""The dead-letter producer: poison goes to a topic, acknowledged before the offset moves.

Each dead-letter record keeps the original key, value and headers, and adds headers
with the reason and the source coordinates, so readers can de-duplicate the repeats
that a crash between this write and the batch commit can cause; an original header named
like one of those is dropped (a replayed dead letter carries them), so there is one of
each, with this rejection's values.

Every poison record ends in exactly one place: one reject row (written with the batch,
keeping the whole record up to the batch byte bound) pointing at one dead-letter record.
What the dead-letter topic can never take as is (over a size limit, an invalid record,
an invalid timestamp) is replaced by a stub that fits, carrying the original's length and
SHA-256: a record's own fault never stalls its partition. What no record can get past
(the topic missing, not authorized, a dead producer) is the operator's to fix: it is
retried with back-off and logged at ERROR, and never turns a record into a reject.

The rules (how an error is classified, what a stub is, what a usable dead-letter topic
is) are pure, in :mod:`ackline.streams.dlq_rules`; the headers that could crash the
worker are read and re-encoded by :mod:`ackline.streams.headers`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ackline.core.logs import kafka_logger
from ackline.sinks.ingest.batch import Coord, RejectRecord
from ackline.streams.admin import TopicShape, ensure_topic, topic_shape
from ackline.streams.dlq_rules import (
    DLQ_MAX_MESSAGE_BYTES,
    MIB,
    Action,
    DeadLetter,
    bare,
    classify,
    dlq_problems,
    kept,
    letter_headers,
    log_level,
    stub,
    weaker_than_source,
)
from ackline.streams.errors import DeadLettersStoppedError, TopicError, kafka_error
from ackline.streams.headers import Headers, headers_for_produce, headers_json, safe_headers

__all__ = [
    "DeadLetterProducer",
    "Headers",
    "Poison",
    "headers_json",
    "prepare_topics",
    "safe_headers",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Poison:
    """A consumed record that did not decode, with why."""

    coord: Coord
    reason: str
    detail: str
    key: bytes | None
    value: bytes | None
    headers: Headers


DLQ_TOPIC_CONFIG = {"max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)}
_FLUSH_GIVE_UP_S = 180.0  # no report this long (delivery.timeout.ms is 60 s): a new producer
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.5, 10.0


class Stage(IntEnum):
    """How much of a record an attempt sends; it only shrinks."""

    WHOLE = 0
    STUB = 1
    BARE = 2


@dataclass(slots=True)
class _Letter:
    """One poison record on its way to the dead-letter topic."""

    item: Poison
    record: DeadLetter
    stage: Stage = Stage.WHOLE
    alone: bool = False  # sent in a round of its own (librdkafka never splits a batch)
    why: str = ""  # why the record is not sent whole ("" while it is)
    where: tuple[int, int] | None = None  # (partition, offset) once acknowledged


@dataclass(frozen=True, slots=True)
class _Failure:
    letter: _Letter
    err: KafkaError
    alone: bool  # it was refused on its own, not maybe for its batch


@dataclass(slots=True)
class _Round:
    """Delivery reports of one round (a late report of an abandoned round lands in an
    object nobody reads any more)."""

    acked: dict[int, tuple[int, int]] = field(default_factory=dict)
    failed: dict[int, KafkaError] = field(default_factory=dict)

    def report(self, index: int) -> Callable[[KafkaError | None, Message], None]:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                self.acked[index] = (msg.partition() or 0, msg.offset() or 0)
            else:
                self.failed[index] = err

        return on_delivery


class DeadLetterProducer:
    """Idempotent producer for the dead-letter topic. Connects lazily on first send.

    ``reject_max_bytes`` bounds the raw key and value a reject row keeps (the batch byte
    bound, ``ACKLINE_BATCH_MAX_BYTES``): the value first, the key in what is left; a part
    cut keeps its first bytes, and the row's detail says how long it was and its SHA-256
    (the whole record stays in the source topic at the row's coordinates until retention).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        extra: Mapping[str, Any] | None = None,
        *,
        reject_max_bytes: int = 32 * MIB,
    ) -> None:
        self.topic = topic
        self._conf: dict[str, Any] = {
            "logger": kafka_logger(),  # librdkafka's lines, de-duplicated (core/logs.py)
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "delivery.timeout.ms": 60_000,
            "message.max.bytes": DLQ_MAX_MESSAGE_BYTES,
            "compression.type": "lz4",
            # A dead-letter topic missing from the metadata fails its records after this
            # (librdkafka's default, 30 s, kept the ERROR that says so back that long); the
            # failure is retried, never turned into a reject, so a new topic still slow
            # to propagate costs a retry, nothing more.
            "topic.metadata.propagation.max.ms": 5_000,
            **(extra or {}),
        }
        self.limit = int(self._conf["message.max.bytes"])
        self.reject_max_bytes = reject_max_bytes
        self._producer: Producer | None = None

    def _client(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(self._conf)
        return self._producer

    def send_all(
        self, poison: list[Poison], should_stop: Callable[[], bool] = lambda: False
    ) -> list[RejectRecord]:
        """Write every poison record and wait until the broker acknowledged each one;
        return their reject rows, each pointing at its dead-letter record.

        Order of effects, in rounds: produce what is pending (records that must go alone
        one at a time, each flushed), flush, read the delivery reports; then per failed
        record (:func:`classify`): a record the topic cannot take as is is sent again
        alone, then as a stub, then bare (never dropped); a transient error is retried;
        an error no record gets past (topic missing, not authorized) is logged at ERROR
        and retried with back-off, and a dead producer is replaced, forever, until
        ``should_stop`` says to give up, which raises DeadLettersStoppedError and must abandon the
        batch. Only when this returns may the batch that holds the reject rows commit. A
        crash at any point leaves at most repeated dead-letter records (readers
        de-duplicate on the source coordinates), never a lost one.
        """
        letters = [self._letter(item) for item in poison]
        pending = list(letters)
        delay = _BACKOFF_FIRST_S
        began = time.monotonic()
        while pending:
            failures = self._round(pending, should_stop)
            pending = [f.letter for f in failures]
            if not pending:
                break
            if should_stop():
                raise DeadLettersStoppedError(
                    f"stopping with {len(pending)} dead-letter records unacknowledged"
                )
            if self._handle(failures, delay, time.monotonic() - began):
                self._wait(delay, should_stop)
                delay = min(delay * 2, _BACKOFF_MAX_S)
        return [self._reject(letter) for letter in letters]

    def _letter(self, item: Poison) -> _Letter:
        """The dead letter of ``item``, a stub already when it is over the producer's own
        limit (``produce()`` would raise)."""
        original = headers_for_produce(item.headers)
        headers = letter_headers(original, item.reason, item.detail, item.coord)
        whole = DeadLetter(item.key, item.value, headers)
        letter = _Letter(item, whole)
        if whole.size > self.limit:
            why = f"{whole.size} bytes is over the dead-letter producer's limit of {self.limit}"
            self._shrink(letter, Stage.STUB, why)
        return letter

    def _round(self, letters: list[_Letter], should_stop: Callable[[], bool]) -> list[_Failure]:
        """Produce ``letters`` once (those refused before one at a time, each flushed);
        the ones not acknowledged, with their errors."""
        together = [x for x in letters if not x.alone]
        groups = [together] if together else []
        groups += [[x] for x in letters if x.alone]
        failures: list[_Failure] = []
        for group in groups:
            failures += self._send(group, should_stop)
        return failures

    def _send(self, group: list[_Letter], should_stop: Callable[[], bool]) -> list[_Failure]:
        producer = self._client()
        state = _Round()
        alone = len(group) == 1
        failures: list[_Failure] = []
        sent: list[int] = []
        for i, letter in enumerate(group):
            err = self._produce(producer, letter.record, state.report(i))
            if err is None:
                sent.append(i)
            else:  # refused by produce() itself: for this record alone
                failures.append(_Failure(letter, err, True))
        try:
            self._flush(producer, should_stop)
        except KafkaException as exc:  # fatal: what was not reported yet never will be
            self._discard()
            dead: KafkaError | None = _error_of(exc)
        else:
            dead = None
        for i in sent:
            if i in state.acked:
                group[i].where = state.acked[i]
            else:
                err = dead or state.failed.get(i) or _no_report()
                failures.append(_Failure(group[i], err, alone))
        return failures

    def _produce(
        self, producer: Producer, record: DeadLetter, report: Callable[..., None]
    ) -> KafkaError | None:
        """Hand ``record`` to librdkafka; the error when ``produce()`` refused it."""
        headers: list[tuple[str, str | bytes | None]] = list(record.headers)
        while True:
            try:
                producer.produce(
                    self.topic,
                    value=record.value,
                    key=record.key,
                    headers=headers,
                    on_delivery=report,
                )
                return None
            except BufferError:  # the local queue is full: serve reports, try again
                producer.poll(0.1)
            except KafkaException as exc:  # e.g. MSG_SIZE_TOO_LARGE, _FATAL, auth (29)
                return _error_of(exc)

    def _flush(self, producer: Producer, should_stop: Callable[[], bool]) -> None:
        """Wait for every report (librdkafka gives one within delivery.timeout.ms).

        Raises KafkaException on a fatal producer error, DeadLettersStoppedError when stopping, and
        a KafkaException of its own when no report came for far too long (the producer
        is then replaced like a dead one)."""
        started = time.monotonic()
        while producer.flush(1.0) > 0:
            if should_stop():
                raise DeadLettersStoppedError("stopping with dead-letter records unacknowledged")
            if time.monotonic() - started > _FLUSH_GIVE_UP_S:
                raise KafkaException(
                    KafkaError(KafkaError._FATAL, "no delivery report in time", fatal=True)
                )

    def _handle(self, failures: list[_Failure], delay: float, waited: float) -> bool:
        """Decide how each failed record is sent next, and log it; True when the next
        round must wait (an error that is not the record's own). A transient error is a
        WARNING until the records have ``waited`` a minute, then an ERROR (:func:`log_level`)."""
        wait = False
        blocked: Counter[tuple[Action, str]] = Counter()
        for failure in failures:
            letter, err = failure.letter, failure.err
            action = classify(err)
            if action is Action.SHRINK and not failure.alone:
                letter.alone = True  # it may only have shared a batch that was too large
                log.warning(
                    "dead letter of %s refused (%s): sending it alone",
                    letter.item.coord,
                    err.name(),
                )
                continue
            if action is Action.SHRINK and letter.stage is not Stage.BARE:
                self._shrink(letter, Stage(letter.stage + 1), f"{err.name()}: {err.str()}")
                continue
            if action is Action.SHRINK:
                action = Action.OPERATOR  # the topic refuses even a bare record: its config
            wait = True
            if action is Action.NEW_PRODUCER:
                self._discard()
            blocked[(action, f"{err.name()} ({err.str()})")] += 1
        for (action, what), count in blocked.items():
            level = log_level(action, waited)
            hint = {
                Action.RETRY: "retrying",
                Action.OPERATOR: "an operator must fix the topic, its ACLs or the brokers; "
                "retrying, nothing is rejected meanwhile",
                Action.NEW_PRODUCER: "the producer is dead; retrying with a new one",
            }[action]
            log.log(
                level,
                "dead-letter topic %s: %d records not written for %.0fs (their batch waits): "
                "%s; %s in %.1fs",
                self.topic,
                count,
                waited,
                what,
                hint,
                delay,
            )
        return wait

    def _shrink(self, letter: _Letter, stage: Stage, why: str) -> None:
        """Send ``letter`` as ``stage`` from now on."""
        item = letter.item
        letter.stage = stage
        whole = DeadLetter(item.key, item.value, letter.record.headers)
        if letter.why == "":
            letter.why = why
        if stage is Stage.STUB:
            letter.record = stub(whole, min(self.limit, MIB), why)
        else:
            letter.record = bare(whole, item.coord, why)
        log.warning(
            "dead letter of %s refused (%s): sending a %s of %d bytes instead (its reject "
            "row keeps the record)",
            item.coord,
            why,
            stage.name.lower(),
            letter.record.size,
        )

    def _reject(self, letter: _Letter) -> RejectRecord:
        p = letter.item
        assert letter.where is not None  # every letter was acknowledged
        # The value first: it is what a reader of a reject needs; the key takes the rest.
        value, value_note = kept(p.value, self.reject_max_bytes)
        key, key_note = kept(p.key, self.reject_max_bytes - len(value or b""))
        notes = [
            f"the dead letter is a {letter.stage.name.lower()}: {letter.why}" if letter.why else "",
            f"raw key kept: {key_note}" if key_note else "",
            f"raw value kept: {value_note}" if value_note else "",
        ]
        extra = "; ".join(n for n in notes if n)
        return RejectRecord(
            coord=p.coord,
            reason=p.reason,
            detail=f"{p.detail} [{extra}]" if extra else p.detail,
            raw_key=key,
            raw_value=value,
            headers=headers_json(p.headers),
            dlq_topic=self.topic,
            dlq_partition=letter.where[0],
            dlq_offset=letter.where[1],
        )

    def _wait(self, seconds: float, should_stop: Callable[[], bool]) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if should_stop():
                raise DeadLettersStoppedError("stopping with dead-letter records unacknowledged")
            time.sleep(min(left, 0.2))

    def _discard(self) -> None:
        """Drop the producer (after a fatal error): its outstanding records are purged,
        and a new one is built at the next send."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            producer.purge()
            producer.poll(0)
        except (KafkaException, RuntimeError) as exc:
            log.info("discarding the dead-letter producer: %s", str(exc))

    def close(self, timeout: float | None = None) -> None:
        """Flush what is queued (every dead letter a batch waited for is acknowledged
        already), at most ``timeout`` s (default 10), and let the client go."""
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.flush(10 if timeout is None else timeout)
            except KafkaException as exc:
                log.warning("closing the dead-letter producer: %s", str(exc))


def _error_of(exc: KafkaException) -> KafkaError:
    err = kafka_error(exc)
    return KafkaError(KafkaError._FAIL, str(exc)) if err is None else err


def _no_report() -> KafkaError:
    return KafkaError(KafkaError._MSG_TIMED_OUT, "no delivery report")


def _min_isr(shape: TopicShape) -> int:
    return int((shape.config or {}).get("min.insync.replicas", "1"))


def prepare_topics(
    bootstrap: str,
    topic: str,
    dlq_topic: str,
    conf: dict[str, Any] | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> int:
    """The source topic's partition count, once the dead-letter topic exists and is usable.

    Raises TopicError naming ``ACKLINE_TOPIC`` when the source topic does not exist (a
    worker never creates the topic it reads), and naming ``ACKLINE_DLQ_TOPIC`` when the
    dead-letter topic exists but cannot keep dead letters (:func:`dlq_problems`); logs a
    warning when it is less durable than the source (:func:`weaker_than_source`; `ackline
    doctor` says so too). Creates ``dlq_topic`` when it is missing, as durable as the
    source topic: its replication factor (capped by the broker count) and its
    min.insync.replicas, up to 3 partitions, :data:`DLQ_TOPIC_CONFIG`. A ``stopping()``
    that turns true ends the metadata waits with :class:`StoppingError`.
    """
    source = topic_shape(bootstrap, topic, conf=conf, stopping=stopping)
    if source is None:
        raise TopicError(
            f"topic {topic} does not exist on {bootstrap} (create it, or set ACKLINE_TOPIC)"
        )
    if source.config is None:
        log.warning("cannot read the configuration of %s: %s", topic, source.config_error)
    dlq = topic_shape(bootstrap, dlq_topic, conf=conf, stopping=stopping)
    if dlq is None:
        rf = max(min(source.replication_factor, source.brokers), 1)
        config = {**DLQ_TOPIC_CONFIG, "min.insync.replicas": str(min(_min_isr(source), rf))}
        ensure_topic(
            bootstrap,
            dlq_topic,
            partitions=min(source.partitions, 3),
            config=config,
            replication_factor=rf,
            conf=conf,
            stopping=stopping,
        )
        return source.partitions
    if dlq.config is None:
        log.warning("cannot read the configuration of %s: %s", dlq_topic, dlq.config_error)
        return source.partitions
    problems, warnings = dlq_problems(dlq.config)
    if problems:
        raise TopicError(
            f"dead-letter topic {dlq_topic} cannot keep dead letters: {'; '.join(problems)} "
            "(fix it, or set ACKLINE_DLQ_TOPIC)"
        )
    if source.config is not None:
        warnings += weaker_than_source(
            dlq.replication_factor,
            _min_isr(dlq),
            source.replication_factor,
            _min_isr(source),
            source.brokers,
        )
    for warning in warnings:
        log.warning("dead-letter topic %s: %s", dlq_topic, warning)
    return source.partitions
