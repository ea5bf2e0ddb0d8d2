"""Errors of the Kafka stage; confluent-kafka errors are wrapped here at the boundary."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from ackline.core.errors import AcklineError


class StreamError(AcklineError):
    """Root of the Kafka stage's errors."""


class KafkaUnavailableError(StreamError):
    """The broker cannot be reached or did not answer in time."""


class TopicError(StreamError):
    """A topic is missing or cannot be created."""


class ProduceError(StreamError):
    """A record was not acknowledged by the broker."""


class TransientProduceError(ProduceError):
    """Nothing of a transaction was committed, for a cause that may pass: records not
    delivered within ``message.timeout.ms`` (the broker away), the connection lost.

    Send the same records again, later (docs/producing.md): nothing of them is visible, so
    the resend is their first copy.
    """


class StoppingError(StreamError):
    """A wait was given up because the process is stopping (SIGTERM/SIGINT)."""


class DeadLettersStoppedError(ProduceError):
    """A stop came while dead-letter records waited for the broker: the batch that holds
    their reject rows must not be written. A ProduceError, so a caller that treats any
    failed dead-lettering as fatal still does (the faust runtime, crash-only)."""


class FatalConsumerError(StreamError):
    """librdkafka reported a fatal error; the consumer cannot continue."""


class OutcomeUnknownError(ProduceError):
    """A transaction's commit could not be confirmed: its records may or may not be visible.

    Resend the same records (from a new producer instance with the same transactional.id
    if this one is broken): ackline counts a copy as a duplicate. Never build new events
    or a new txn_id for the same unit of work (docs/producing.md).
    """


class ProducerFencedError(OutcomeUnknownError):
    """A newer instance with the same transactional.id took over; this one can do nothing.

    Close it. Whoever owns the unit of work now resends its records if it does not know
    that they were committed.
    """


def join_refused_grace_s(session_timeout_ms: int) -> float:
    """How long a worker's group join is refused (:data:`JOIN_REFUSED`) before it gives
    up. Pure.

    A member gone without leaving (a faust worker killed while the group switches
    runtime) stays in the group until its session times out, and the protocols are
    checked against it till then: twice this worker's session timeout (the other
    runtime's comes from the same setting), at least 30 s."""
    return max(2 * session_timeout_ms / 1000, 30.0)


def mixed_group(group: str, error: str) -> str:
    """The line of a worker that cannot join ``group``: a member with another partition
    assignment protocol is in it (a worker of the other runtime). Pure."""
    return (
        f"cannot join consumer group {group}: a member of it uses another partition "
        f"assignment protocol ({error}); a worker of the other runtime (faust or "
        "confluent) or another client has ACKLINE_GROUP_ID's group: the runtimes cannot "
        "share a group, give each its own ACKLINE_GROUP_ID (or stop the others first)"
    )


JOIN_REFUSED = frozenset(
    {
        KafkaError.INCONSISTENT_GROUP_PROTOCOL,
        KafkaError.INVALID_GROUP_ID,
        KafkaError.INVALID_SESSION_TIMEOUT,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
    }
)
"""Kafka's answers to a join that no retry cures while the group or the broker stays as it
is (protocol error codes: librdkafka's ``KafkaError`` codes and aiokafka's ``errno``
alike). A worker that meets one for :func:`join_refused_grace_s` stops (exit 2); it had
joined again and again for ever, owning nothing."""


def join_refused(group: str, code: int | None, error: str, session_timeout_ms: int) -> str:
    """The line of a worker whose join of ``group`` Kafka keeps refusing with ``code``
    (``error``: the client's words), naming what to change. Pure."""
    if code == KafkaError.INCONSISTENT_GROUP_PROTOCOL:
        return mixed_group(group, error)
    if code == KafkaError.INVALID_SESSION_TIMEOUT:
        return (
            f"cannot join consumer group {group}: the broker refuses its session timeout, "
            f"ACKLINE_SESSION_TIMEOUT_MS={session_timeout_ms} ({error}): set it within the "
            "broker's group.min.session.timeout.ms and group.max.session.timeout.ms "
            "(Kafka's defaults: 6000 and 1800000)"
        )
    return f"cannot join consumer group {group}: {error}"


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The KafkaError behind ``exc`` (a KafkaException's first argument), following
    ``__cause__``/``__context__``; None when there is none (``args`` may be empty).
    confluent-kafka's asyncio producer can raise a fatal error as a ``SystemError`` whose
    cause is the ``KafkaException`` (a delivery callback ran while it was pending). Pure.
    """
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return None
        if isinstance(seen, KafkaException) and seen.args and isinstance(seen.args[0], KafkaError):
            return seen.args[0]
        seen = seen.__cause__ or seen.__context__
    return None


def error_code(exc: BaseException) -> int | None:
    """:func:`kafka_error`'s code, else None. Pure."""
    error = kafka_error(exc)
    return None if error is None else int(error.code())
