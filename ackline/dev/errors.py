"""Errors of the local development stack (``ackline dev``)."""

from __future__ import annotations

from ackline.core.errors import AcklineError


class DevStackError(AcklineError):
    """The local Kafka/PostgreSQL stack could not be fetched, started, stopped or found."""
