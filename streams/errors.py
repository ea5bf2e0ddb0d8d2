"""Errors of the Kafka stage; confluent-kafka errors are wrapped here at the boundary."""

from __future__ import annotations

from ackline.core.errors import AcklineError


class StreamError(AcklineError):
    """Root of the Kafka stage's errors."""


class KafkaUnavailableError(StreamError):
    """The broker cannot be reached or did not answer in time."""


class TopicError(StreamError):
    """A topic is missing or cannot be created."""


class ProduceError(StreamError):
    """A record was not acknowledged by the broker."""


class StoppingError(StreamError):
    """A wait was given up because the process is stopping (SIGTERM/SIGINT)."""


class FatalConsumerError(StreamError):
    """librdkafka reported a fatal error; the consumer cannot continue."""
