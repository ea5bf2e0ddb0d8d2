"""Errors of the ``schemas`` stage.

Bad *input* (a malformed Kafka record) is never an exception here: the decoder returns a
:class:`ackline.schemas.decode.Rejection`. :class:`SchemaError` is for programming errors in code
that builds or hashes envelopes, e.g. the producer SDK calling
:func:`ackline.schemas.envelope.new_envelope` with an invalid payload. When it wraps a pydantic
``ValidationError`` the original is chained (``raise SchemaError(...) from exc``).
"""

from __future__ import annotations

from ackline.core.errors import AcklineError


class SchemaError(AcklineError):
    """An envelope or a value to hash does not satisfy event schema v1."""
