"""Event schema v1, the canonical body hash and the record decoder.

* :mod:`ackline.schemas.envelope`: the pydantic models, the (type, version) -> payload registry
  and :func:`new_envelope` for producers.
* :mod:`ackline.schemas.canonical`: the canonical JSON form and the body hash (``CANONICAL.md``).
* :mod:`ackline.schemas.decode`: bytes -> :class:`Row` or :class:`Rejection`, pure and total.
* :mod:`ackline.schemas.jsonschema`: the JSON Schema export (``json/envelope.v1.schema.json``).
"""

from ackline.schemas.canonical import (
    CANONICAL_FORM_VERSION,
    body_dict,
    body_hash,
    canonical_body,
    canonical_json,
    canonical_text,
    hash_envelope,
)
from ackline.schemas.decode import (
    DEFAULT_LIMITS,
    REASONS,
    Limits,
    Rejection,
    Row,
    decode,
)
from ackline.schemas.envelope import (
    ENVELOPES,
    EVENT_TYPES,
    PAYLOADS,
    SCHEMA_VERSION,
    AgentFailedV1,
    AgentFinishedV1,
    AgentRequestedV1,
    AgentStartedV1,
    AgentStepV1,
    Envelope,
    MessagePostedV1,
    Payload,
    ToolCalledV1,
    ToolResultV1,
    envelope_model,
    new_envelope,
)
from ackline.schemas.errors import SchemaError
from ackline.schemas.jsonschema import envelope_json_schema, write_json_schema

__all__ = [
    "CANONICAL_FORM_VERSION",
    "DEFAULT_LIMITS",
    "ENVELOPES",
    "EVENT_TYPES",
    "PAYLOADS",
    "REASONS",
    "SCHEMA_VERSION",
    "AgentFailedV1",
    "AgentFinishedV1",
    "AgentRequestedV1",
    "AgentStartedV1",
    "AgentStepV1",
    "Envelope",
    "Limits",
    "MessagePostedV1",
    "Payload",
    "Rejection",
    "Row",
    "SchemaError",
    "ToolCalledV1",
    "ToolResultV1",
    "body_dict",
    "body_hash",
    "canonical_body",
    "canonical_json",
    "canonical_text",
    "decode",
    "envelope_json_schema",
    "envelope_model",
    "hash_envelope",
    "new_envelope",
    "write_json_schema",
]
