"""The producer SDK: validated envelopes on a transactional, idempotent producer.

An event is stamped once (``event_id``, ``occurred_at``) by :func:`schemas.new_envelope`
and turned into an :class:`Outgoing` record once, by :func:`prepare`: its key, value and
headers are fixed bytes from then on. Every retry sends that same object, so a copy that
reaches ackline twice (a retry after an unknown outcome, a resend by a new instance) has
the same ``txn_id``, ``event_id`` and body, and ackline counts it as a duplicate. Building
the envelope again for a retry would stamp a new ``occurred_at``: a conflict instead.
``docs/producing.md`` is the guide; :mod:`ackline.streams.aio_producer` is the asyncio
twin of :class:`ActivityProducer` and shares this module's code.

Usage::

    records = [prepare(envelope)]          # once, before the first attempt
    producer = ActivityProducer(bootstrap, "agent-activity", transactional_id="svc-1")
    producer.start()
    producer.send_transaction(records)     # begin, send, commit; retries, same bytes
    producer.close()
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ackline.core.logs import kafka_logger
from ackline.schemas.canonical import canonical_json
from ackline.schemas.decode import DEFAULT_LIMITS, Rejection, decode
from ackline.schemas.envelope import Envelope
from ackline.schemas.errors import SchemaError
from ackline.streams.admin import MISSING_TOPIC, topic_limit, topic_max_message_bytes
from ackline.streams.errors import (
    OutcomeUnknownError,
    ProduceError,
    ProducerFencedError,
    TransientProduceError,
    kafka_error,
)

log = logging.getLogger(__name__)

DeliveryHook = Callable[[KafkaError | None, Message], None]
KeyBy = Literal["agent", "request"]
Headers = tuple[tuple[str, bytes], ...]
CONTENT_TYPE = b"application/json"
RETRY_PAUSE_S = 0.1
"""Pause between two attempts of a transactional call that failed retriably."""
LIBRDKAFKA_MESSAGE_MAX_BYTES: Final = 1_000_000
"""librdkafka's own default ``message.max.bytes``: the largest record a client left at its
default sends (it refuses larger ones itself, before the broker sees them). Not Kafka's
topic default (:data:`ackline.streams.admin.KAFKA_MAX_MESSAGE_BYTES`, 1,048,588)."""
SDK_MESSAGE_MAX_BYTES: Final = DEFAULT_LIMITS.max_bytes + 65_536
"""librdkafka's ``message.max.bytes`` in the SDK's producers: every value ackline's decoder
accepts by default (1 MiB) fits with its key and headers. librdkafka's own default
(:data:`LIBRDKAFKA_MESSAGE_MAX_BYTES`) refused, before they reached the broker, events
that :func:`prepare` had accepted."""
LIBRDKAFKA_BATCH_SIZE: Final = 1_000_000
"""librdkafka's default ``batch.size``: the most bytes it puts in one batch of several
records (a record larger than that goes out alone)."""
_CONNECTION_PREFIXES: Final = (
    "bootstrap.",
    "security.",
    "ssl.",
    "sasl.",
    "client.",
    "socket.",
    "broker.",
    "enable.ssl.",
    "enable.sasl.",  # enable.sasl.oauthbearer.unsecure.jwt
    "oauth_cb",  # an OAUTHBEARER token from Python: without it the admin client has none
    "error_cb",
    "metadata.broker.list",  # bootstrap.servers' alias
    "logger",
)
"""The settings of a producer's configuration that say how to reach and talk to the
cluster (address, security, logging): what the admin client that reads the topic's
limit needs of it, and nothing producer-only (``transactional.id`` would make it a
transactional client)."""
TOPIC_LOOK_S: Final = 1.0
"""How long a send whose deadline has passed asks the cluster whether its topic exists
(the caller's timeout is spent already: the answer is worth a second, not more)."""
_TRANSIENT: Final = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._QUEUE_FULL,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
    }
)
"""Delivery errors of a broker that is away or busy, not of a record it refuses."""
_CONSEQUENCES: Final = frozenset(
    {KafkaError._STATE, KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}
)
"""Delivery errors that follow a transaction's failure and never cause it: produce() refused
in librdkafka's abortable-error state (``_STATE``), records purged when it entered that
state or by the abort (``_PURGE_*``)."""


def serialize(envelope: Envelope) -> bytes:
    """The wire form of an envelope: its canonical JSON (sorted keys, no whitespace)."""
    return canonical_json(envelope.model_dump(mode="json"))


def record_key(envelope: Envelope, key_by: KeyBy) -> bytes:
    """Partition key: every event of one agent (or one request) stays in order."""
    return (envelope.agent_id if key_by == "agent" else envelope.request_id).encode()


def envelope_headers(envelope: Envelope) -> Headers:
    """Informational headers (ackline reads none of them: the envelope says it all)."""
    return (
        ("content-type", CONTENT_TYPE),
        ("ackline.type", envelope.type.encode()),
        ("ackline.schema-version", str(envelope.schema_version).encode()),
    )


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One event ready for the wire; every attempt to send it sends these same bytes."""

    key: bytes
    value: bytes
    headers: Headers
    event_id: uuid.UUID
    txn_id: str
    body_hash: bytes
    """What ackline will compute for it (``schemas/CANONICAL.md``)."""


def prepare(envelope: Envelope, key_by: KeyBy = "agent") -> Outgoing:
    """Serialize ``envelope`` once and check it the way an ackline worker will.

    The bytes go through :func:`ackline.schemas.decode.decode` with the default limits,
    so an event the worker would reject (too deep, over 1 MiB, a model built without
    validation) raises :class:`SchemaError` here instead of becoming a reject row.
    """
    if not isinstance(envelope, Envelope):
        raise SchemaError(f"expected an Envelope (see new_envelope), got {type(envelope).__name__}")
    value = serialize(envelope)
    row = decode(value)
    if isinstance(row, Rejection):
        raise SchemaError(
            f"ackline would reject this {envelope.type} event: {row.reason}: {row.detail}"
        )
    return Outgoing(
        record_key(envelope, key_by),
        value,
        envelope_headers(envelope),
        row.event_id,
        row.txn_id,
        row.body_hash,
    )


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where a record of a committed transaction landed."""

    partition: int
    offset: int


def record_size(record: Outgoing) -> int:
    """What librdkafka weighs against ``message.max.bytes``: key, value and headers."""
    return (
        len(record.key)
        + len(record.value)
        + sum(len(name.encode()) + len(value) for name, value in record.headers)
    )


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """What librdkafka in a producer made from a configuration refuses in the client."""

    message_max_bytes: int
    """``message.max.bytes``: one record, key, value and headers."""
    queue_max_messages: int
    """``queue.buffering.max.messages``: records waiting in the local queue."""
    queue_max_bytes: int
    """``queue.buffering.max.kbytes`` in bytes: one record over it never gets in."""


def client_limits(conf: dict[str, Any]) -> ClientLimits:
    """The limits of a producer made from ``conf`` (librdkafka's defaults when unset)."""
    values = []
    for name, default in (
        ("message.max.bytes", SDK_MESSAGE_MAX_BYTES),
        ("queue.buffering.max.messages", 100_000),
        ("queue.buffering.max.kbytes", 1_048_576),
    ):
        raw = conf.get(name, default)
        try:
            value = int(raw)
        except (TypeError, ValueError):
            value = 0
        if value < 1:
            raise ProduceError(f"{name} must be a positive count, not {raw!r}")
        values.append(value)
    return ClientLimits(values[0], values[1], values[2] * 1024)


def connection_config(conf: dict[str, Any]) -> dict[str, Any]:
    """The settings of ``conf`` an admin client beside the producer needs (reaching the
    cluster, security, logging), none of the producer's own. Pure."""
    return {k: v for k, v in conf.items() if k.startswith(_CONNECTION_PREFIXES)}


def batch_within(conf: dict[str, Any], topic_max_bytes: int | None) -> dict[str, Any]:
    """``conf`` with librdkafka's ``batch.size`` lowered to the topic's
    ``max.message.bytes`` when that is below the batches the producer would build (the
    smaller of ``batch.size`` and ``message.max.bytes``); ``conf`` itself otherwise (the
    limit unknown, or nothing to lower). Pure.

    Why: the broker weighs each record batch against the topic's limit, and librdkafka
    fills a batch of several records up to ``batch.size`` (the whole request it builds
    counted, headers included) and never splits one the broker refused: every record of
    it failed with ``MSG_SIZE_TOO_LARGE``, records that each fit, which a caller told
    "refused" would drop. Within the limit, a batch of several records always fits (its
    compressed form is never sent when larger than the plain one); a record too large for
    the topic goes out alone, and only it is refused.
    """
    if topic_max_bytes is None or topic_max_bytes < 1 or topic_max_bytes >= batch_bytes(conf):
        return conf
    return {**conf, "batch.size": topic_max_bytes}


def batch_bytes(conf: dict[str, Any]) -> int:
    """The most bytes librdkafka puts in a batch of several records for a producer made
    from ``conf``: the smaller of ``batch.size`` and ``message.max.bytes``. Pure."""
    return min(
        _positive(conf.get("batch.size"), LIBRDKAFKA_BATCH_SIZE),
        _positive(conf.get("message.max.bytes"), SDK_MESSAGE_MAX_BYTES),
    )


def _positive(raw: object, default: int) -> int:
    """``raw`` as a positive count, ``default`` when unset or not one (librdkafka refuses
    such a value when the client is made, which says so better). Pure."""
    try:
        value = int(raw) if raw is not None else default  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return default
    return value if value > 0 else default


def within_topic_limit(conf: dict[str, Any], topic: str, timeout: float) -> dict[str, Any]:
    """``conf`` batching within ``topic``'s ``max.message.bytes`` (:func:`batch_within`),
    the limit read from the cluster within ``timeout`` (both SDKs' ``start()``, before the
    client is made: librdkafka takes ``batch.size`` only then). Unknown (the topic missing
    yet, describing it not allowed, no answer), ``conf`` is left as it is. The limit is
    read once: one lowered later reaches a new instance, not this one.

    A topic the cluster says does not exist is a WARNING here, not an error: it may be
    created after the producer starts (its records then go through), but a mistyped name
    would otherwise show only when the first transaction fails, up to
    ``topic.metadata.propagation.max.ms`` later."""
    found = topic_limit(conf["bootstrap.servers"], topic, timeout, conf=connection_config(conf))
    if found.missing:
        log.warning(
            "topic %s does not exist (or is not yet visible to this producer) on %s: its "
            "transactions fail as transient until it does (unless the cluster creates "
            "topics on first use); check its name, or create it",
            topic,
            conf["bootstrap.servers"],
        )
    out = batch_within(conf, found.limit)
    if out is not conf:
        log.info(
            "topic %s takes record batches of at most %d bytes (max.message.bytes): "
            "batch.size set to it",
            topic,
            found.limit,
        )
    return out


def check_fits(records: Sequence[Outgoing], limits: ClientLimits) -> None:
    """Raise :class:`ProduceError` if a record is over ``message.max.bytes`` or larger
    than the whole local queue, naming the setting.

    Checked before anything is sent: librdkafka refuses such a record in the client (or,
    for the queue, never takes it), so the broker's transaction never learns of it and
    would commit the others.
    """
    for i, record in enumerate(records):
        check_fit(record, record_size(record), limits, i)


def check_fit(record: Outgoing, size: int, limits: ClientLimits, index: int = 0) -> None:
    """:func:`check_fits` for one record (number ``index``) whose size is known."""
    for setting, limit in (
        ("message.max.bytes", limits.message_max_bytes),
        ("queue.buffering.max.kbytes", limits.queue_max_bytes),
    ):
        if size > limit:
            raise ProduceError(
                f"record {index} (event {record.event_id}) is {size:,} bytes with its key "
                f"and headers, over this producer's {setting} ({limit:,} bytes): "
                "nothing of the transaction was sent"
            )


def start_failed(err: KafkaError, bootstrap: object) -> ProduceError:
    """The error for ``init_transactions`` failing with ``err``: transient when the broker
    did not answer (a new instance may start later), else a refusal (configuration,
    authorization). It names ``bootstrap``: a timeout is most often the wrong address."""
    text = f"cannot initialise transactions with {bootstrap}: {err.name()}: {err.str()}"
    if err.code() in _TRANSIENT or err.retriable():
        return TransientProduceError(f"{text}; start a new instance again later")
    return ProduceError(text)


def abort_failed(exc: BaseException) -> ProduceError:
    """The error for ``abort_transaction`` failing with ``exc``, for a transaction whose
    commit was never requested: nothing of it is committed whatever happened, and the
    broker aborts it (its timeout, or the next instance's ``init_transactions``). Pure."""
    err = kafka_error(exc)
    if err is None:
        return unexplained(exc, "abort_transaction", asked=False)
    if txn_action(err) == "fenced":
        return ProducerFencedError(f"abort_transaction: fenced by a newer instance: {err.str()}")
    return TransientProduceError(
        f"abort_transaction not confirmed ({err.name()}: {err.str()}); nothing of the "
        "transaction was committed: close this instance, then send the same records again "
        "from a new one"
    )


def call_failed(exc: BaseException, what: str) -> tuple[ProduceError, bool]:
    """The SDK's error for a transactional call ``what`` that raised ``exc``, and whether
    it leaves the instance unusable (fenced, or librdkafka's fatal state). Pure."""
    err = kafka_error(exc)
    if err is None:
        return ProduceError(f"{what} failed: {exc!r}"), False
    return settle(err, what), txn_action(err) in ("fenced", "fatal")


def unexplained(exc: BaseException, what: str, asked: bool) -> ProduceError:
    """The error for a transactional call that failed with no KafkaError behind it (a
    SystemError confluent-kafka raised from a delivery report served inside the call):
    after a commit was requested its outcome is unknown; before, nothing was committed.
    Either way the instance is unusable. Pure."""
    if asked:
        return OutcomeUnknownError(f"{what} failed, outcome unknown: {exc!r}")
    return TransientProduceError(
        f"{what} failed ({exc!r}), no commit asked for: nothing of the transaction was "
        "committed; close this instance, then send the same records again from a new one"
    )


def failure_causes(errors: Sequence[KafkaError]) -> list[KafkaError]:
    """The delivery errors among ``errors`` that can have failed the transaction (not the
    refusals and purges that follow; judged as refusals, they made a broker's absence look
    like bad records)."""
    return [err for err in errors if err.code() not in _CONSEQUENCES]


def not_committed(
    errors: Sequence[KafkaError], topic: str = "", batch: tuple[int, int] | None = None
) -> ProduceError:
    """The error for a transaction aborted because ``errors`` records were not delivered
    (their :func:`failure_causes`, at least one): :class:`TransientProduceError` when every
    one is the broker's absence, not a refusal, or ``topic`` missing (librdkafka fails the
    records of a topic it never saw after ``topic.metadata.propagation.max.ms``), which
    says so: the same records go through once the topic exists. Pure.

    ``batch``, when the broker refused records as too large: the topic's
    ``max.message.bytes`` read after the refusal and the producer's :func:`batch_bytes`.
    A limit below the batches the producer builds (lowered after its ``start()``, which
    batches within the limit it reads) may have refused a batch of records that each fit
    (librdkafka fails them all): transient, from a new instance, which batches within the
    limit; a record too large alone is then refused by itself."""
    first = errors[0]
    text = (
        f"transaction aborted, nothing committed: {len(errors)} record(s) not delivered, "
        f"first: {first.name()}: {first.str()}"
    )
    codes = {err.code() for err in errors}
    resend = ""
    if KafkaError.MSG_SIZE_TOO_LARGE in codes and batch is not None and batch[0] < batch[1]:
        resend = (
            f"the topic {topic} takes record batches of at most {batch[0]:,} bytes "
            f"(max.message.bytes), less than this producer puts in one ({batch[1]:,}): the "
            "records may each fit. Close this instance and send the same records again "
            "from a new one, which batches within the topic's limit"
        )
        # transient only beside other passing causes: a refusal in the same abort (the
        # topic's authorization) no new instance cures, and was retried for ever
        if codes <= {KafkaError.MSG_SIZE_TOO_LARGE} | _TRANSIENT | MISSING_TOPIC:
            return TransientProduceError(f"{text}; {resend}")
    if codes & MISSING_TOPIC and codes <= MISSING_TOPIC | _TRANSIENT:
        return TransientProduceError(f"{text}; {topic_missing_text(topic, new_instance=False)}")
    if codes <= _TRANSIENT:
        return TransientProduceError(f"{text}; send the same records again")
    return ProduceError(f"{text}; {resend}" if resend else text)


def too_large(causes: Sequence[KafkaError]) -> bool:
    """Whether the broker refused records of ``causes`` as too large. Pure."""
    return any(err.code() == KafkaError.MSG_SIZE_TOO_LARGE for err in causes)


def refusal_batch(conf: dict[str, Any], topic: str, batch_bytes: int) -> tuple[int, int] | None:
    """After records were refused as too large (:func:`too_large`): ``topic``'s
    ``max.message.bytes`` read now (an admin request, on that path only) and the
    producer's ``batch_bytes``, which :func:`not_committed` weighs; None when the limit
    cannot be read."""
    limit = topic_max_message_bytes(
        conf["bootstrap.servers"], topic, 5.0, conf=connection_config(conf)
    )
    return None if limit is None else (limit, batch_bytes)


def topic_missing_text(topic: str, *, new_instance: bool) -> str:
    """What an error says of ``topic`` the cluster does not have: the records were not
    refused, so its class is transient (a caller told "refused" drops them). Pure."""
    again = " from a new instance (close this one)" if new_instance else ""
    return (
        f"topic {topic} does not exist (or is not yet visible to this producer); create "
        f"it (or wait for it), then send the same records again{again}"
    )


def topic_missing(topic: str) -> TransientProduceError:
    """The error of a transaction not confirmed in time for want of its topic: none of
    its records was written, so nothing can be committed; the instance is left unusable
    (its commit, or its flush, goes on in librdkafka). Pure."""
    return TransientProduceError(
        "not confirmed in time, and nothing of the transaction was committed: "
        + topic_missing_text(topic, new_instance=True)
    )


def topic_absent(meta: Any, topic: str) -> bool:
    """Whether ``meta`` (a metadata answer for ``topic``: ``list_topics(topic)``) says the
    topic does not exist. Pure."""
    found = meta.topics.get(topic)
    return found is None or (found.error is not None and found.error.code() in MISSING_TOPIC)


def send_failed(first: BaseException) -> ProduceError:
    """The error for a ``transaction()`` block that went on after a send in it raised
    ``first``, once the transaction was aborted: a commit would lack that send's record.
    :class:`TransientProduceError` when ``first`` was no fault of the record's (no room
    in time, an outcome not known, the send cancelled: a caller's timeout around it), as
    the abort left nothing committed: send the same again. Else :class:`ProduceError`,
    a refusal (too large, invalid), which a caller may act on by dropping the record."""
    return _after_failed_send(
        first, "transaction aborted, nothing committed: its block went on after a send raised"
    )


def send_refused(first: BaseException, transient: bool | None = None) -> ProduceError:
    """The error for a send in a ``transaction()`` block after an earlier send in it
    raised ``first``: the record is not queued, as the transaction can no longer commit
    (the block's end aborts it); the class as :func:`send_failed` says, so a block that
    lets this one out learns what the commit step would have said. ``transient``, when
    given, is that verdict instead (``first`` a ``_STATE`` refusal, which is none: the
    block's end judges by the delivery errors)."""
    return _after_failed_send(
        first,
        "not sent: this transaction cannot commit and is aborted at the end of its block, "
        "since an earlier send in it raised",
        transient,
    )


def _after_failed_send(
    first: BaseException, text: str, transient: bool | None = None
) -> ProduceError:
    """:func:`send_failed` and :func:`send_refused`: ``text`` and ``first`` named; transient
    (unless ``transient`` says) only when ``first`` was no verdict on its record."""
    text = f"{text} {type(first).__name__}: {first}"
    if transient is None:
        transient = isinstance(
            first, TransientProduceError | OutcomeUnknownError | asyncio.CancelledError
        )
    return TransientProduceError(text) if transient else ProduceError(text)


# --- what a transactional error means ---------------------------------------------------

TxnAction = Literal["retry", "abort", "fenced", "fatal", "unknown"]


def not_open(sdk: str, closed: bool) -> ProduceError:
    """The error of a call on an instance that has no client: never started (or its
    start() failed), or closed (close() was called, or the asyncio start() failed and
    closed it). Pure."""
    if closed:
        return ProduceError(
            f"this {sdk} was closed (close() was called, or start() failed); start a new "
            "instance with the same transactional.id"
        )
    return ProduceError(f"{sdk}.start() was not called, or did not succeed")


def started_twice(sdk: str) -> ProduceError:
    """The error of a second start() on an open instance: a second client would replace
    the first, which nothing could close any more (its threads and connections, and a
    transaction it had open). Pure."""
    return ProduceError(f"{sdk}.start() was already called; a new instance starts another client")


def unheld(exc: BaseException) -> None:
    """Drop the traceback of a SystemError out of confluent-kafka's client (both SDKs catch
    them), keeping its text as a note.

    Such an error (a fatal one wrapped, :func:`kafka_error`, or a call that returned with
    an exception set) out of the asyncio client was never freed: no collection freed it,
    and no Python object but its own traceback's frames referred to it, so the reference
    is held in C. Those frames hold the caller's client, whose librdkafka threads and
    connections then lived until the interpreter exited (the "Connection refused" lines
    after a test run). Its message, its cause and where it was raised (the note) stay."""
    if isinstance(exc, SystemError) and exc.__traceback__ is not None:
        where = "".join(traceback.format_tb(exc.__traceback__))
        exc.add_note(f"raised at (traceback dropped: its frames held the client):\n{where}")
        exc.with_traceback(None)


def txn_action(err: KafkaError) -> TxnAction:
    """What to do after a transactional call (commit, abort, begin) failed with ``err``.

    ``retry``: call the same API again (librdkafka: "retry call to resume"); never resend.
    ``abort``: abort the transaction; nothing of it is visible; send the same records again.
    ``fenced``: another instance with this transactional.id took over; stop this one.
    ``fatal``: this instance can do nothing more; a new one must resend.
    ``unknown``: anything else; the outcome cannot be known from here.
    """
    if err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED):
        return "fenced"
    if err.fatal():
        return "fatal"
    if err.txn_requires_abort():
        return "abort"
    if err.retriable():
        return "retry"
    return "unknown"


def settle(err: KafkaError, what: str) -> ProduceError:
    """The exception for a commit that ended with ``err`` (not a retry, not an abort)."""
    action = txn_action(err)
    if action == "fenced":
        return ProducerFencedError(
            f"{what}: fenced by a newer instance with the same transactional.id: {err.str()}"
        )
    return OutcomeUnknownError(f"{what} failed ({err.name()}), outcome unknown: {err.str()}")


CALLBACKS: Final = ("error_cb", "throttle_cb", "stats_cb")
"""The callbacks a service may set in ``extra`` that librdkafka serves inside the SDK's
transactional calls (besides ``on_delivery``, which each SDK handles itself)."""


def is_async_callable(callback: object) -> bool:
    """Whether calling ``callback`` returns a coroutine: a coroutine function, or an
    object whose ``__call__`` is one (``inspect.iscoroutinefunction`` says no to such an
    object, and AIOProducer awaits it all the same). Pure."""
    while isinstance(callback, functools.partial):
        callback = callback.func
    call = inspect.getattr_static(type(callback), "__call__", None)
    return inspect.iscoroutinefunction(callback) or inspect.iscoroutinefunction(call)


def shielded(callback: Callable[..., Any], what: str) -> Callable[..., Any]:
    """``callback``, with what it raises (an Exception) logged with its traceback instead;
    a coroutine function stays one (confluent-kafka's AIOProducer awaits its callbacks).

    confluent-kafka lets a callback's exception out of the call that served it
    (``commit_transaction``, ``abort_transaction``, ``flush``, ``poll``) in place of that
    call's result, so a service's failing callback would stand in for the outcome of a
    transaction it does not decide. Kafka's Java producer logs its callbacks' exceptions
    too. KeyboardInterrupt and SystemExit still come out: the calls that serve callbacks
    treat them as an interruption (the instance unusable)."""

    if is_async_callable(callback):

        async def acall(*args: Any) -> None:
            try:
                await callback(*args)
            except Exception:
                log.exception("the producer's %s raised; logged, not raised", what)

        return acall

    def call(*args: Any) -> None:
        try:
            callback(*args)
        except Exception:
            log.exception("the producer's %s raised; logged, not raised", what)

    return call


def check_callbacks(extra: dict[str, Any] | None, *, coroutines: bool) -> None:
    """Refuse an ``error_cb``, ``throttle_cb`` or ``stats_cb`` of the wrong kind: the
    asyncio SDK's AIOProducer awaits them (a plain function fails with a TypeError inside
    the call that served it: a commit), the synchronous one calls them (a coroutine is
    never awaited: the callback silently never runs). Pure."""
    for name in CALLBACKS:
        callback = (extra or {}).get(name)
        if callback is not None and is_async_callable(callback) != coroutines:
            kind, sdk = (
                ("a coroutine function (async def)", "asyncio")
                if coroutines
                else ("a plain function, not a coroutine function", "synchronous")
            )
            raise ProduceError(
                f"{name} in extra must be {kind} for the {sdk} producer: {callback!r}"
            )


def transactional_config(
    bootstrap: str, transactional_id: str, extra: dict[str, Any] | None
) -> dict[str, Any]:
    """The producer settings both SDK producers use; ``extra`` overrides (security...).

    ``extra``'s ``error_cb``, ``throttle_cb`` and ``stats_cb`` are :func:`shielded`.
    ``delivery.report.only.error`` is refused: both SDKs learn that a record was delivered
    from its report (a transaction whose reports do not all say so is not called
    committed), so without the reports of delivered records a committed transaction could
    never be confirmed."""
    extra = dict(extra or {})
    if str(extra.get("delivery.report.only.error", "false")).lower() not in ("false", "f", "0"):
        raise ProduceError(
            "delivery.report.only.error is not supported by the SDK producers: they confirm "
            "each record from its delivery report; leave it unset"
        )
    for name in CALLBACKS:
        if callable(extra.get(name)):
            extra[name] = shielded(extra[name], name)
    return {
        "bootstrap.servers": bootstrap,
        "transactional.id": transactional_id,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 10,
        "compression.type": "lz4",
        "transaction.timeout.ms": 60_000,
        "message.max.bytes": SDK_MESSAGE_MAX_BYTES,
        **extra,
    }


def warn_dropped(
    logger: logging.Logger,
    failed: BaseException | None,
    dropped: int,
    timeout: float,
    queued: int,
    unreported: int,
    interrupted: BaseException | None = None,
) -> None:
    """close()'s WARNING (both SDKs): the ``dropped`` records, and why: ``interrupted``,
    what ended the flush early (Ctrl-C, a cancel); ``failed``, the
    flush's error (the client can no longer deliver); else, with records still ``queued``
    (librdkafka's out-queue), the ``timeout`` ran out; else the flush ended with nothing
    queued and the records were failed, ``unreported`` of them with no report at all (a
    fenced client, or one in librdkafka's fatal state, delivers no more). The error goes
    in as text: a record that kept the exception would keep its traceback, whose frames
    hold the client."""
    if interrupted is not None:
        if dropped:
            logger.warning(
                "closing the producer was interrupted (%s): %d record(s) not delivered, dropped",
                type(interrupted).__name__,
                dropped,
            )
    elif failed is not None:
        logger.warning(
            "closing a producer that cannot deliver (%s): %d record(s) dropped",
            str(kafka_error(failed) or failed),
            dropped,
        )
    elif dropped and queued:
        logger.warning(
            "closing the producer: %d record(s) not delivered in %g s, dropped",
            dropped,
            timeout,
        )
    elif dropped:
        logger.warning(
            "closing the producer: %d record(s) not delivered, dropped: the flush ended "
            "with nothing queued; %d had a failed delivery report, %d none",
            dropped,
            dropped - unreported,
            unreported,
        )


def default_hook(conf: dict[str, Any]) -> DeliveryHook | None:
    """The ``on_delivery`` a configuration sets (confluent-kafka's default delivery
    callback), taken out of ``conf``: librdkafka calls it only for a record produced
    without a callback, and the SDK gives every record one (its bookkeeping), so the SDK
    calls it itself, last, for each record sent without a hook of its own."""
    hook = conf.pop("on_delivery", None)
    if hook is not None:
        check_hook(hook)
    return hook  # type: ignore[no-any-return]


def check_hook(hook: object) -> None:
    """Refuse an ``on_delivery`` hook the synchronous SDK cannot call: not callable, or a
    coroutine function (its coroutine would never be awaited: the hook silently never
    runs). Pure."""
    if not callable(hook) or is_async_callable(hook):
        raise ProduceError(
            f"on_delivery must be a plain callable(err, msg), not a coroutine function: {hook!r}"
        )


class ActivityProducer:
    """A transactional producer of activity envelopes. Nothing connects until start()."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        transactional_id: str,
        *,
        key_by: KeyBy = "agent",
        extra: dict[str, Any] | None = None,
    ) -> None:
        check_callbacks(extra, coroutines=False)
        self.topic = topic
        self.key_by: KeyBy = key_by
        # librdkafka's lines through Python logging, de-duplicated (``extra`` may replace
        # it with the service's own logger)
        self._conf = {
            "logger": kafka_logger(),
            **transactional_config(bootstrap, transactional_id, extra),
        }
        self._limits = client_limits(self._conf)
        self._default_hook = default_hook(self._conf)
        """``on_delivery`` of ``extra``: the hook of each record sent without its own."""
        self._producer: Producer | None = None
        self._closed = False
        self._reports: list[tuple[KafkaError | None, Message | None]] | None = None
        """Delivery reports of the records sent in the open :meth:`transaction` block."""
        self._failed: BaseException | None = None
        """The first error a send raised since the open transaction began (reset at
        begin): :meth:`transaction` aborts instead of committing without its record."""
        self._broken: ProduceError | None = None
        """Why this instance can do no more (an abort not confirmed, fenced)."""
        self._batch_bytes = batch_bytes(self._conf)
        """The most bytes librdkafka puts in one batch of this instance's client."""
        self._room_s = 60.0
        """How long a send waits for room in the local queue: the open transaction's
        timeout (the broker away, the queue holds until ``message.timeout.ms`` otherwise)."""
        self._unreported = 0
        """Records produced whose delivery report has not been served."""
        self._delivered = 0
        """Delivery reports served that said delivered. What close() drops is the records
        unreported when it began less those it delivered (librdkafka's out-queue length,
        ``len(producer)``, also counts each report and log line waiting to be served)."""

    def start(self, timeout: float = 30.0) -> None:
        """Connect and fence older producers with the same transactional.id.

        Order of effects: the topic's ``max.message.bytes`` is read (an admin request;
        :func:`within_topic_limit`: the producer batches within it), then the client is
        made and ``init_transactions`` fences; both within ``timeout``. A crash between
        them leaves nothing: a read changes nothing. A transaction an older instance
        left open is finished by the broker first (committed if its commit had begun,
        aborted otherwise). A second start() on an
        open instance, or a start() after close(), raises :class:`ProduceError` and
        changes nothing: an instance starts once (a closed one may have been marked
        unusable, which a new client would not undo). A start() that fails leaves it
        closed, as the asyncio SDK's.
        """
        if self._closed:
            raise not_open("ActivityProducer", closed=True)
        if self._producer is not None:
            raise started_twice("ActivityProducer")
        began = time.monotonic()
        conf = within_topic_limit(self._conf, self.topic, min(5.0, timeout / 2))
        self._batch_bytes = batch_bytes(conf)
        producer = Producer(conf)
        try:
            producer.init_transactions(max(timeout - (time.monotonic() - began), 0.1))
        except (KafkaException, SystemError) as exc:
            unheld(exc)
            self._closed = True
            err = kafka_error(exc)
            bootstrap = self._conf["bootstrap.servers"]
            if err is None:
                raise ProduceError(
                    f"cannot initialise transactions with {bootstrap}: {exc!r}"
                ) from exc
            raise start_failed(err, bootstrap) from exc
        self._producer = producer

    @property
    def client(self) -> Producer:
        if self._producer is None:
            raise not_open("ActivityProducer", self._closed)
        if self._broken is not None:
            raise type(self._broken)(
                f"this producer instance is unusable ({self._broken}); close it and resend "
                "the same records from a new instance"
            )
        return self._producer

    def send_transaction(
        self, records: Sequence[Outgoing], *, timeout: float = 60.0, rounds: int = 3
    ) -> list[Delivery]:
        """Send ``records`` in one transaction and commit it; the deliveries, in order.

        Order of effects: begin; produce every record; commit (which flushes). ``timeout``
        also bounds each wait for room in the local queue: past it the transaction is
        aborted and :class:`TransientProduceError` raised, as by the asyncio producer. A
        commit that fails retriably is called again until ``timeout`` (never a resend).
        One that requires an abort is aborted and the same records go out in a new
        transaction, up to ``rounds`` times. Raises :class:`OutcomeUnknownError` when the
        commit could not be confirmed (resend the same records, from a new instance if this
        one is fenced or broken: ackline drops the copies), :class:`ProducerFencedError`
        when a newer instance took over, :class:`ProduceError` when nothing was committed (a
        record refused: over ``message.max.bytes``, or by the broker for good), and its
        subclass :class:`TransientProduceError` when nothing was committed because the
        broker was away (send the same records again, later), the topic does not exist
        (the error names it), or the broker refused a batch over a ``max.message.bytes``
        lowered after :meth:`start` (from a new instance). A produce() refused because
        the transaction already failed (records timed out behind a full local queue) is
        an abort too: the abort comes first, then the records' delivery errors say which
        error it is. A crash anywhere before the commit marker leaves nothing visible to
        ackline.
        """
        check_fits(records, self._limits)
        for attempt in range(1, rounds + 1):
            with self._failures_as_outcome("begin_transaction"):
                self.client.begin_transaction()
            self._room_s = timeout
            self._failed = None
            reports: list[tuple[KafkaError | None, Message | None]] = [(None, None)] * len(records)
            try:
                for i, record in enumerate(records):
                    self.send_record(record, _chain(_collect(reports, i), self._default_hook))
            except _TxnFailed as exc:
                failed = exc.err
            except BaseException:
                self.abort(timeout)
                raise
            else:
                try:
                    self._commit(time.monotonic() + timeout)
                except _AbortRequired as exc:
                    failed = exc.err
                else:
                    if any(err is None and msg is None for err, msg in reports):
                        self.client.flush(10)  # commit delivered them; serve their callbacks
                    return _deliveries(reports)
            self.abort(timeout)  # its flush serves the purged records' delivery reports
            causes = failure_causes(_errors(reports))
            if causes:
                raise self._not_committed(causes) from None
            if attempt == rounds:
                raise ProduceError(f"transaction aborted, nothing committed: {failed.str()}")
            log.warning("transaction aborted (%s); sending the same records again", failed)
        raise AssertionError("unreachable")

    @contextmanager
    def transaction(self, timeout: float = 60.0) -> Iterator[None]:
        """Begin; run the block; commit only if every send in it succeeded, else abort.

        The transaction is whole or absent: an exception out of the block aborts it, and
        so does a send in the block that raised even when the block caught the error and
        went on (a commit would lack that record; Kafka's Java producer refuses it too).
        Every later send in the block then raises at once, its record not queued:
        :func:`send_refused`, which names the first error and is transient as
        :func:`send_failed` would be.

        Order of effects: begin_transaction (a failure raises as a commit's does, the block
        not run: :class:`ProducerFencedError` on an instance a newer one fenced, else
        :class:`OutcomeUnknownError`); the block's sends; then commit_transaction,
        which flushes and waits for every record and the commit marker, or, after an
        exception or a failed send, abort_transaction (purge, abort marker) and an error.
        A crash before the commit marker is written leaves the records invisible to
        read_committed consumers (the broker aborts the transaction when it times out or
        the id is re-initialised); a crash in the abort leaves the same.

        Commit errors raise as in :meth:`send_transaction` (an abortable one is aborted
        and raised as :class:`ProduceError`, or :class:`TransientProduceError` when every
        undelivered record met the broker's absence: the block is not run again). So does
        a send in the block that librdkafka refused because the transaction had already
        failed (``_STATE``), caught or not, and a later send's :func:`send_refused` after
        it that the block lets out. Another send the block caught raises here, after the
        abort, as :func:`send_failed` (:class:`TransientProduceError` for one that found no
        room in the local queue within ``timeout``). An abort not confirmed (the broker
        away: likely after a queue that did not drain) raises its own error instead, and
        the instance is done (:meth:`abort`). After a confirmed abort the next transaction
        starts clean.
        """
        with self._failures_as_outcome("begin_transaction"):
            self.client.begin_transaction()
        self._room_s = timeout
        self._failed = None
        reports: list[tuple[KafkaError | None, Message | None]] = []
        self._reports = reports
        try:
            yield
        except _TxnFailed as exc:
            failed = exc.err
        except BaseException as exc:
            first = self._failed
            if not (isinstance(first, _TxnFailed) and _refused_after(exc, first)):
                self.abort(timeout)
                raise
            failed = first.err  # a later send's refusal: judged as the _STATE one
        else:
            first = self._failed
            if isinstance(first, _TxnFailed):
                failed = first.err  # judged by the delivery reports, as if it got out
            elif first is not None:
                self.abort(timeout)
                raise send_failed(first) from first
            else:
                try:
                    self._commit(time.monotonic() + timeout)
                    return
                except _AbortRequired as exc:
                    failed = exc.err
        finally:
            self._reports = None
        self.abort(timeout)  # its flush serves the purged records' delivery reports
        causes = failure_causes(_errors(reports))
        if causes:
            raise self._not_committed(causes) from None
        raise ProduceError(f"transaction aborted, nothing committed: {failed.str()}")

    def _commit(self, deadline: float) -> None:
        """commit_transaction, again while it fails retriably and time is left.

        An outcome it cannot confirm leaves this instance unusable, as the asyncio SDK's:
        the commit may have completed, so neither an abort nor a new transaction may be
        asked of it (an abort said "nothing was committed", untrue here). So does anything
        else that comes out of the call or its retry pause: a KeyboardInterrupt or
        SystemExit (raised as it came) stops librdkafka's flush inside the commit, which
        may or may not have completed before it surfaced."""
        try:
            self._commit_until(deadline)
        except (_AbortRequired, ProduceError):
            raise
        except BaseException as exc:
            self._broken = unexplained(exc, "commit_transaction", asked=True)
            if isinstance(exc, Exception):
                raise self._broken from exc
            raise

    def _commit_until(self, deadline: float) -> None:
        producer = self.client
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._broken = self._not_confirmed(producer)
                raise self._broken
            try:
                producer.commit_transaction(left)
                return
            except (KafkaException, SystemError) as exc:
                unheld(exc)
                found = kafka_error(exc)
                if found is None:  # a bare SystemError: _commit calls the outcome unknown
                    raise
                err: KafkaError = found
                action = txn_action(err)
                if action == "abort":
                    raise _AbortRequired(err) from exc
                if action != "retry":
                    self._broken = settle(err, "commit_transaction")
                    raise self._broken from exc
                log.warning("commit_transaction retriable error, retrying: %s", err)
            time.sleep(RETRY_PAUSE_S)

    def _not_committed(self, causes: list[KafkaError], final: bool = True) -> ProduceError:
        """:func:`not_committed` for this instance's aborted transaction; records the
        broker refused as too large are weighed against the topic's limit read now (an
        admin request, on this path only). A verdict that a new instance must resend
        leaves this one unusable, once ``final`` (the abort done): it would build the
        same batches."""
        batch = None
        if too_large(causes):
            batch = refusal_batch(self._conf, self.topic, self._batch_bytes)
        error = not_committed(causes, self.topic, batch)
        if final and batch is not None and isinstance(error, TransientProduceError):
            # a refusal beside it (a ProduceError) leaves the instance usable, as on the
            # asyncio SDK: its records are refused whatever the batches, and a later
            # batch refused as too large alone breaks it here
            self._broken = error
        return error

    def _not_confirmed(self, producer: Producer) -> ProduceError:
        """The error of a commit not confirmed by its deadline, which leaves the instance
        unusable (the commit goes on in librdkafka). Most often the outcome is unknown;
        but when the topic does not exist (librdkafka holds its records, waiting for it to
        appear, up to ``topic.metadata.propagation.max.ms``, 30 s), none of them was
        written, so nothing can be committed: :class:`TransientProduceError` naming the
        topic. Order of effects: the metadata read; the records still queued are purged
        (none can reach the topic and be committed later, and close() need not wait for
        them); the error. A crash at any step leaves nothing committed."""
        try:
            absent = topic_absent(
                producer.list_topics(self.topic, timeout=TOPIC_LOOK_S), self.topic
            )
        except (KafkaException, SystemError) as exc:  # no answer: it cannot say
            unheld(exc)
            absent = False
        if not absent:
            return OutcomeUnknownError("commit not confirmed in time, outcome unknown")
        try:
            producer.purge(in_queue=True, in_flight=False)
        except (KafkaException, SystemError) as exc:
            unheld(exc)
            log.warning("purging the records of the missing topic %s failed: %s", self.topic, exc)
        return topic_missing(self.topic)

    @contextmanager
    def _failures_as_outcome(self, what: str) -> Iterator[None]:
        """A begin_transaction's failure as the SDK's error; fenced or fatal, it leaves the
        instance unusable, as the asyncio SDK's."""
        try:
            yield
        except (KafkaException, SystemError) as exc:
            unheld(exc)
            settled, broken = call_failed(exc, what)
            if broken:
                self._broken = settled
            raise settled from exc

    def abort(self, timeout: float = 60.0) -> None:
        """Abort the open transaction, whose commit was not requested: none of its records
        become visible. Order of effects: librdkafka purges what is queued, then the
        broker writes the abort marker. Not confirmed in ``timeout`` (the broker away) or
        fenced: this instance is unusable (:class:`TransientProduceError` or
        :class:`ProducerFencedError`), and the broker aborts the transaction itself (its
        timeout, or the next instance's ``init_transactions``): a crash anywhere here
        leaves nothing visible. So is an abort a KeyboardInterrupt or SystemExit stopped
        (out of a hook its flush served; raised as it came): librdkafka holds it half-way,
        and a next transaction would meet it in progress."""
        client = self.client
        try:
            client.abort_transaction(timeout)
        except (KafkaException, SystemError) as exc:
            unheld(exc)
            self._broken = abort_failed(exc)
            raise self._broken from exc
        except BaseException as exc:
            self._broken = unexplained(exc, "abort_transaction", asked=False)
            raise

    def send(self, envelope: Envelope, on_delivery: DeliveryHook | None = None) -> None:
        """Queue one validated envelope inside the current transaction (a
        :class:`SchemaError` from :func:`prepare` is a failed send too)."""
        with self._sending():
            self._send_record(prepare(envelope, self.key_by), on_delivery)

    def send_record(self, record: Outgoing, on_delivery: DeliveryHook | None = None) -> None:
        """Queue one prepared record inside the current transaction.

        Raises :class:`ProduceError` for a record over ``message.max.bytes`` before it is
        queued; inside :meth:`transaction` that transaction is then aborted whole, whether
        the block lets the error out or not.
        """
        with self._sending():
            self._send_record(record, on_delivery)

    def send_bytes(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        on_delivery: DeliveryHook | None = None,
    ) -> None:
        """Queue raw bytes (tests and load generation use this to send poison).

        A full local queue is waited out, up to the open transaction's ``timeout``: past
        it :class:`TransientProduceError`, which the transactional methods abort (nothing
        of the transaction is committed). ``_STATE`` is no verdict on the record:
        librdkafka refuses every produce() once the transaction has failed (records timed
        out while the queue was full, the broker away), so it raises :class:`_TxnFailed`,
        which the transactional methods abort and judge by the delivery reports. Whatever
        it raises, the open transaction can no longer commit, and in a
        :meth:`transaction` block every later send raises :func:`send_refused`.
        """
        with self._sending():
            self._produce(key, value, headers, self._hook(on_delivery))

    @contextmanager
    def _sending(self) -> Iterator[None]:
        """Around each public send, once (they do not call one another): keep the first
        error a send raised in the open transaction, whose commit must not happen (the
        record is missing from it) even if the caller goes on; in a :meth:`transaction`
        block, refuse every later send at once with :func:`send_refused` (queued, its
        record would only go to a transaction bound to be aborted), as the block's
        docstring and docs/producing.md say."""
        first = self._failed
        if first is not None and self._reports is not None:
            raise self._refusal(first, self._reports) from first
        try:
            yield
        except BaseException as exc:
            if self._failed is None:
                self._failed = exc
            raise

    def _refusal(
        self, first: BaseException, reports: list[tuple[KafkaError | None, Message | None]]
    ) -> ProduceError:
        """:func:`send_refused` for a send after ``first`` in the open block. After a
        ``_STATE`` refusal (no verdict on any record) its class is what the block's end
        will say, judged as it judges: by the delivery errors served by now (those
        waiting are served first), transient when every cause was the broker's absence."""
        if not isinstance(first, _TxnFailed):
            return send_refused(first)
        _serve(self.client)
        causes = failure_causes(_errors(reports))
        judged = self._not_committed(causes, final=False) if causes else None
        return send_refused(first, isinstance(judged, TransientProduceError))

    def _send_record(self, record: Outgoing, on_delivery: DeliveryHook | None) -> None:
        """:meth:`send_record` without the bookkeeping of :meth:`_sending`; a record
        without a hook of its own gets the configuration's default."""
        check_fits([record], self._limits)
        self._produce(record.key, record.value, list(record.headers), self._hook(on_delivery))

    def _hook(self, on_delivery: DeliveryHook | None) -> DeliveryHook | None:
        """The delivery hook of one record a public send queues: the caller's own (checked
        before the SDK wraps it) or the configuration's default; in a :meth:`transaction`
        block, after keeping the report there, by which the block's end judges a failed
        transaction (transient when every record met the broker's absence)."""
        if on_delivery is not None:
            check_hook(on_delivery)
        on_delivery = on_delivery or self._default_hook
        if self._reports is not None:
            on_delivery = _collect_into(self._reports, on_delivery)
        return on_delivery

    def _produce(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]] | None,
        on_delivery: DeliveryHook | None,
    ) -> None:
        """produce(), waiting for room in the local queue (:meth:`send_bytes`)."""
        producer = self.client
        deadline: float | None = None
        report = self._counted(on_delivery)  # the SDK's own hook replaces the config's
        while True:
            try:
                producer.produce(
                    self.topic, value=value, key=key, headers=headers or [], on_delivery=report
                )
                self._unreported += 1
                return
            except BufferError:
                now = time.monotonic()
                deadline = now + self._room_s if deadline is None else deadline
                if now >= deadline:
                    raise TransientProduceError(
                        f"the local queue had no room for {self._room_s:g} s (the "
                        "transaction's timeout); nothing of the transaction is committed: "
                        "send the same records again"
                    ) from None
                producer.poll(min(0.05, deadline - now))
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                text = f"{err.name()}: {err.str()}"
                if err.code() == KafkaError._STATE:
                    raise _TxnFailed(err) from exc
                raise ProduceError(f"produce refused the record: {text}") from exc

    def _counted(self, then: DeliveryHook | None) -> DeliveryHook:
        """A delivery hook that counts the report served (:attr:`_unreported`,
        :attr:`_delivered`), then calls the caller's own hook ``then``.

        ``then`` is :func:`shielded`: librdkafka serves reports inside commit_transaction
        and abort_transaction, and a hook's exception let out there would stop the call
        and stand in for its result."""
        hook = None if then is None else shielded(then, "on_delivery hook")

        def report(err: KafkaError | None, msg: Message) -> None:
            self._unreported -= 1
            self._delivered += err is None
            if hook is not None:
                hook(err, msg)

        return report

    def close(self, timeout: float = 30.0) -> None:
        """Deliver what is queued (up to ``timeout``), drop the rest, release the client.

        Order of effects: the instance lets go of its client first (later calls raise
        :class:`ProduceError`); flush; what is still queued, or all of it when the flush
        raises (fenced, librdkafka's fatal state), is logged at WARNING with its count
        (the records sent through this instance that were not delivered when it began and
        that it did not deliver: not librdkafka's out-queue length, which also counts each
        report and log line waiting to be served) and purged; the client is freed. Never
        raises for a fenced or broken instance, as the asyncio ``close()``: nothing is left
        to save, and a ``finally: close()`` must not replace the error the caller acts on.
        A KeyboardInterrupt during the flush (Ctrl-C) is not lost either: the same steps
        run, then it is raised again.
        No commit is asked for: a transaction left open stays invisible and the broker
        aborts it (its timeout, or the next instance's ``init_transactions``), so a crash
        at any step leaves nothing of it visible.
        """
        producer, self._producer = self._producer, None
        self._closed = True
        if producer is None:
            return
        pending, delivered = self._unreported, self._delivered
        failed: BaseException | None = None
        interrupted: BaseException | None = None
        try:
            queued: int | None = producer.flush(timeout)
        except (KafkaException, SystemError) as exc:
            # SystemError: confluent-kafka's flush once came out as "returned NULL without
            # setting an exception" on a fenced instance (a delivery callback had run while
            # the fatal error was pending), as its asyncio producer's calls can
            unheld(exc)
            queued, failed = None, exc
        except (KeyboardInterrupt, SystemExit) as exc:  # Ctrl-C: the flush is interruptible
            queued, interrupted = None, exc  # say what is dropped, purge, then let it out
        _serve(producer)  # reports that came as the flush gave up, or behind its error
        if queued is None:
            queued = len(producer)
        dropped = pending - (self._delivered - delivered)
        warn_dropped(log, failed, dropped, timeout, queued, self._unreported, interrupted)
        if queued or dropped:
            try:
                producer.purge()
                producer.poll(0)  # serves the purged records' delivery reports
            except (KafkaException, SystemError) as exc:  # SystemError: as the flush's
                unheld(exc)
                log.warning("closing the producer: purge failed: %s", str(exc))
        if interrupted is not None:
            del producer  # the traceback keeps this frame: not the client with it
            raise interrupted


def _serve(producer: Producer) -> None:
    """Serve the delivery reports (and log lines) queued now; a client in librdkafka's
    fatal state may raise its error again (as a SystemError too, as the flush in close()):
    it is known already."""
    try:
        producer.poll(0)
    except (KafkaException, SystemError) as exc:
        unheld(exc)


class _AbortRequired(Exception):
    """A commit failed with an error that requires abort_transaction."""

    def __init__(self, err: KafkaError) -> None:
        super().__init__(err.str())
        self.err = err


class _TxnFailed(ProduceError):
    """produce() refused with ``_STATE``: no open transaction, or it has failed (librdkafka's
    abortable-error state) and only an abort is left. A :class:`ProduceError` for callers of
    :meth:`ActivityProducer.send_bytes` in a transaction of their own."""

    def __init__(self, err: KafkaError) -> None:
        super().__init__(
            f"produce refused: {err.name()}: {err.str()} (no open transaction, or it failed "
            "earlier: abort it, nothing of it can be committed)"
        )
        self.err = err


def _refused_after(exc: BaseException, first: _TxnFailed) -> bool:
    """Whether ``exc``, out of a block, is a send's refusal after the ``_STATE`` one
    ``first`` (:meth:`ActivityProducer._sending` raises it ``from first``)."""
    return isinstance(exc, ProduceError) and exc.__cause__ is first


def _collect(reports: list[tuple[KafkaError | None, Message | None]], i: int) -> DeliveryHook:
    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        reports[i] = (err, msg)

    return on_delivery


def _errors(reports: list[tuple[KafkaError | None, Message | None]]) -> list[KafkaError]:
    """The delivery errors among ``reports``."""
    return [err for err, _ in reports if err is not None]


def _collect_into(
    reports: list[tuple[KafkaError | None, Message | None]], then: DeliveryHook | None
) -> DeliveryHook:
    """A delivery hook keeping the report of a record :meth:`transaction` sends, then
    calling the caller's own hook ``then``."""
    reports.append((None, None))
    return _chain(_collect(reports, len(reports) - 1), then)


def _chain(first: DeliveryHook, then: DeliveryHook | None) -> DeliveryHook:
    """A delivery hook calling ``first``, then ``then`` (if any)."""
    if then is None:
        return first

    def both(err: KafkaError | None, msg: Message) -> None:
        first(err, msg)
        then(err, msg)

    return both


def _deliveries(reports: list[tuple[KafkaError | None, Message | None]]) -> list[Delivery]:
    out = []
    for err, msg in reports:
        if err is not None or msg is None:
            raise OutcomeUnknownError(f"committed, but a delivery report is missing: {err}")
        out.append(Delivery(msg.partition() or 0, msg.offset() or 0))
    return out
