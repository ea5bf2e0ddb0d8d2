"""Event schema v1: the envelope and one typed payload per (type, schema_version).

Every record on the agent-activity topic is one JSON object, the *envelope*::

    {"event_id": "<uuid>", "txn_id": "...", "type": "agent.started",
     "agent_id": "...", "request_id": "...", "occurred_at": "2024-05-01T12:00:00Z",
     "schema_version": 1, "payload": {...}}

* ``event_id`` identifies this copy of the event; it is *not* part of the body hash.
* ``txn_id`` is the idempotency key of the unit of work that emitted the event (e.g. for
  ``agent.started``, the request it serves).
* ``occurred_at`` is an ISO 8601 string (as ``datetime.fromisoformat`` reads it) or, in
  Python, a ``datetime``; it must carry a UTC offset (naive timestamps are invalid) and
  numbers (epoch seconds) are refused. It is normalised to UTC, so ``...T12:00:00Z``,
  ``...T12:00:00+00:00`` and ``...T14:00:00+02:00`` are the same value.
  Precision is the microsecond (further digits are cut, as ``fromisoformat`` does).
* ``payload`` is validated against ``PAYLOADS[(type, schema_version)]``.

Rules shared by every model: frozen, extra fields forbidden, strict types (``"5"`` is not
an int, ``1`` is not a bool, ``5.0`` is not an int), and every string, at any depth,
keys included, rejects NUL (U+0000; a PostgreSQL ``text``/``jsonb`` value cannot hold it)
and lone surrogates (U+D800..U+DFFF; they have no UTF-8 encoding). Identifier-like
strings (ids, ``model``, ``tool``, ``requested_by``, ``error_kind``, ``tools`` items) are
1..200 characters; counters are 0..2**63-1 (a PostgreSQL ``bigint``). ``tool.called``
``arguments`` is any JSON object with finite numbers.

Adding a payload version: write the model and add one line to :data:`PAYLOADS`, e.g.
``("agent.started", 2): AgentStartedV2``. :data:`ENVELOPES`, :data:`EVENT_TYPES`, the
decoder and the JSON Schema export all derive from that registry.

Why this module is longer than the house's ~500 lines: it is the schema, read top down —
the value types (text without NUL or lone surrogates, UTC timestamps, plain JSON), the
eight payload models, the envelope and its (type, version) registry. Split, a reader would
chase one schema across files; every part is small and pure.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal, Self, cast

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    create_model,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from ackline.schemas.errors import SchemaError
from ackline.schemas.eventid import uuid7

SCHEMA_VERSION: Final = 1
"""The schema version :func:`new_envelope` writes unless told otherwise."""

MAX_ID_CHARS: Final = 200
INT64_MAX: Final = 2**63 - 1
MAX_JSON_NESTING: Final = 600
"""Nesting cap of free-form JSON values (``tool.called`` arguments); guards against cycles.

The decoder enforces its own, smaller limit (``Limits.max_depth``) before this one."""

_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")


def _bad_text(value: str) -> str | None:
    """Why ``value`` cannot be stored as PostgreSQL text, or ``None`` if it can."""
    if value.isascii():
        return "must not contain NUL (U+0000)" if "\x00" in value else None
    found = _BAD_CHAR.search(value)
    if found is None:
        return None
    if found.group() == "\x00":
        return "must not contain NUL (U+0000)"
    return f"must not contain a lone surrogate (U+{ord(found.group()):04X})"


def _check_text(value: Any) -> Any:
    # Runs before pydantic's own str checks: its length constraints cannot read a lone
    # surrogate and would report it less clearly. Non-strings are left to pydantic.
    if isinstance(value, str):
        problem = _bad_text(value)
        if problem is not None:
            raise ValueError(problem)
    return value


Text = Annotated[str, BeforeValidator(_check_text)]
"""Free text: any length, no NUL, no lone surrogate."""

Ident = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS), BeforeValidator(_check_text)
]
"""An identifier: 1..200 characters, no NUL, no lone surrogate."""

Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
"""A non-negative integer that fits a PostgreSQL ``bigint``."""


# --- timestamps -------------------------------------------------------------------------


def _parse_timestamp(value: object) -> datetime:
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError("must be an ISO 8601 timestamp with a UTC offset") from None
    else:
        raise ValueError("must be an ISO 8601 timestamp string")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("must be timezone-aware (naive timestamps are invalid)")
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise ValueError("is out of range once converted to UTC") from None


def format_timestamp(moment: datetime) -> str:
    """The canonical text of a UTC timestamp: ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""
    if moment.tzinfo is not UTC:
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise ValueError("a naive datetime has no canonical form")
        moment = moment.astimezone(UTC)
    # isoformat pads the year to four digits; the offset of UTC is "+00:00".
    return moment.isoformat(timespec="microseconds")[:-6] + "Z"


Timestamp = Annotated[
    datetime,
    PlainValidator(_parse_timestamp),
    PlainSerializer(format_timestamp, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
"""A timezone-aware instant, held in UTC; JSON form ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""


# --- free-form JSON values --------------------------------------------------------------


def _key_path(where: str, key: str) -> str:
    shown = key if key.isidentifier() and len(key) <= 40 else repr(key[:40])
    return f"{where}.{shown}" if where else shown


def _json_copy(value: object, where: str, depth: int) -> Any:
    """A fresh copy of ``value`` made of dict/list/str/int/float/bool/None, or ValueError."""
    if value is None or isinstance(value, bool):
        return value if value is None else bool(value)
    if isinstance(value, str):
        problem = _bad_text(value)
        if problem is not None:
            raise ValueError(f"{where or 'value'}: string {problem}")
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where or 'value'}: NaN and Infinity are not JSON numbers")
        return float(value)
    if depth >= MAX_JSON_NESTING:
        raise ValueError(f"{where or 'value'}: nested too deeply (or cyclic)")
    if isinstance(value, list):
        return [_json_copy(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, dict):
        return _json_object(value, where, depth + 1)
    raise ValueError(f"{where or 'value'}: {type(value).__name__} is not a JSON value")


def _json_object(value: dict[Any, Any], where: str, depth: int) -> dict[str, Any]:
    copy: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise ValueError(f"{where or 'value'}: object key {key!r} is not a string")
        path = _key_path(where, key)
        problem = _bad_text(key)
        if problem is not None:
            raise ValueError(f"{path}: key {problem}")
        copy[str.__str__(key)] = _json_copy(item, path, depth)
    return copy


class _NotPlainJsonError(Exception):
    """Raised by the fast walker; the slow walker then converts or explains."""


def _plain_json_copy(value: Any, depth: int) -> Any:
    """Fast path of :func:`_json_copy`: exact JSON types only, no error paths built."""
    kind = type(value)
    if kind is str:
        if "\x00" in value or (not value.isascii() and _BAD_CHAR.search(value)):
            raise _NotPlainJsonError
        return value
    if kind is int or kind is bool or value is None:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise _NotPlainJsonError
        return value
    if depth >= MAX_JSON_NESTING:
        raise _NotPlainJsonError
    if kind is list:
        return [_plain_json_copy(item, depth + 1) for item in value]
    if kind is dict:
        copy: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str or _bad_text(key) is not None:
                raise _NotPlainJsonError
            copy[key] = _plain_json_copy(item, depth + 1)
        return copy
    raise _NotPlainJsonError


PARSED_JSON_CONTEXT: Final[Mapping[str, bool]] = {"schemas.parsed_json": True}
"""Validation context asserting: the input came from ``json.loads`` with NaN/Infinity
refused, and its text has no ``\\u0000`` and no ``\\uD800``..``\\uDFFF`` escape.

Then every nested value is already plain JSON: exact dict/list/str/int/float/bool/None,
finite floats, no NUL or lone surrogate in any string or key (valid UTF-8 text and the
strict parser cannot produce them otherwise). JSON objects are then taken as they are,
not walked and copied. Only :func:`ackline.schemas.decode.decode` passes it (compared by
identity), after checking those conditions.
"""


def _parse_json_object(value: object, info: ValidationInfo) -> dict[str, Any]:
    if info.context is PARSED_JSON_CONTEXT and type(value) is dict:
        return value
    if type(value) is dict:
        try:
            copy: dict[str, Any] = _plain_json_copy(value, 1)
        except (_NotPlainJsonError, RecursionError):
            pass
        else:
            return copy
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object")
    try:
        return _json_object(value, "", 1)
    except RecursionError:
        raise ValueError("nested too deeply (or cyclic)") from None


JsonObject = Annotated[
    dict[str, Any],
    PlainValidator(_parse_json_object),
    WithJsonSchema({"type": "object", "additionalProperties": True}),
]
"""A JSON object of JSON values: finite numbers only, keys and strings checked like Text."""


# --- payloads ---------------------------------------------------------------------------

_STRICT_FROZEN = ConfigDict(frozen=True, extra="forbid", strict=True)


class Payload(BaseModel):
    """Base of every typed payload: frozen, strict, no extra fields."""

    model_config = _STRICT_FROZEN


class AgentRequestedV1(Payload):
    """``agent.requested``: someone asked an agent to do something."""

    prompt: Text
    requested_by: Ident
    priority: Annotated[int, Field(ge=0, le=9)]
    tools: list[Ident]


class AgentStartedV1(Payload):
    """``agent.started``: a run began serving the request."""

    run_id: Ident
    model: Ident


class AgentStepV1(Payload):
    """``agent.step``: one reasoning step of a run."""

    run_id: Ident
    step: Count
    thought: Text


class ToolCalledV1(Payload):
    """``tool.called``: the run invoked a tool."""

    run_id: Ident
    call_id: Ident
    tool: Ident
    arguments: JsonObject


class ToolResultV1(Payload):
    """``tool.result``: a tool call returned."""

    run_id: Ident
    call_id: Ident
    ok: bool
    output: Text
    duration_ms: Count


class MessagePostedV1(Payload):
    """``message.posted``: a message was added to the conversation."""

    run_id: Ident
    role: Literal["user", "assistant", "system", "tool"]
    content: Text


class AgentFinishedV1(Payload):
    """``agent.finished``: the run completed."""

    run_id: Ident
    steps: Count
    tokens_in: Count
    tokens_out: Count
    summary: Text


class AgentFailedV1(Payload):
    """``agent.failed``: the run ended with an error."""

    run_id: Ident
    error_kind: Ident
    error: Text


PAYLOADS: dict[tuple[str, int], type[Payload]] = {
    ("agent.requested", 1): AgentRequestedV1,
    ("agent.started", 1): AgentStartedV1,
    ("agent.step", 1): AgentStepV1,
    ("tool.called", 1): ToolCalledV1,
    ("tool.result", 1): ToolResultV1,
    ("message.posted", 1): MessagePostedV1,
    ("agent.finished", 1): AgentFinishedV1,
    ("agent.failed", 1): AgentFailedV1,
}
"""The registry: (type, schema_version) -> payload model. Add a version with one line."""

EVENT_TYPES: tuple[str, ...] = tuple(dict.fromkeys(t for t, _ in PAYLOADS))
"""Every known event type, in registry order."""

_EVENT_TYPE_SET: Final = frozenset(EVENT_TYPES)


# --- envelopes --------------------------------------------------------------------------


class Envelope(BaseModel):
    """One event. Concrete subclasses, one per (type, schema_version), are in ENVELOPES.

    ``Envelope.model_validate(data)`` dispatches on ``type`` and ``schema_version`` and
    returns an instance of the matching subclass.
    """

    model_config = _STRICT_FROZEN

    event_id: Annotated[uuid.UUID, Field(strict=False)] = Field(
        description="Identity of this copy of the event; not part of the body hash."
    )
    txn_id: Ident = Field(description="Idempotency key of the unit of work that emitted the event.")
    type: str = Field(description="The event type; selects the payload model.")
    agent_id: Ident = Field(description="The agent that emitted the event.")
    request_id: Ident = Field(description="The request the event belongs to.")
    occurred_at: Timestamp = Field(description="When it happened; a UTC offset is required.")
    schema_version: int = Field(description="Version of the payload model for this type.")
    payload: Payload = Field(description="The typed payload for (type, schema_version).")

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Self:
        """Validate ``obj``; on :class:`Envelope` itself, dispatch to the concrete model.

        ``Envelope.model_validate(data)`` picks ``ENVELOPES[(type, schema_version)]``
        and returns an instance of it; an unknown type or version is a ValidationError.
        On a concrete model it is pydantic's ``model_validate``. (Only this entry point
        dispatches, not ``model_validate_json``; the hot path is ``ackline.schemas.decode``.)
        """
        if cls is Envelope and isinstance(obj, Mapping):
            model = route_envelope(obj)
            return cast(Self, model.model_validate(obj, **kwargs))
        return super().model_validate(obj, **kwargs)


def route_envelope(data: Mapping[str, Any]) -> type[Envelope]:
    """The concrete model for ``data`` by its ``type`` and ``schema_version``.

    Raises a pydantic ValidationError whose error types say why not: ``missing``,
    ``string_type`` or ``int_type`` (the fields are absent or mistyped),
    ``unknown_type`` (a string that is not in EVENT_TYPES) or ``unsupported_version``
    (a known type without a payload model for that integer version).
    """
    event_type = data.get("type")
    version = data.get("schema_version")
    if isinstance(event_type, str) and type(version) is int:
        model = ENVELOPES.get((event_type, version))
        if model is not None:
            return model
    errors: list[InitErrorDetails] = []
    if "type" not in data:
        errors.append({"type": "missing", "loc": ("type",), "input": data})
    elif not isinstance(event_type, str):
        errors.append({"type": "string_type", "loc": ("type",), "input": event_type})
    elif event_type not in _EVENT_TYPE_SET:
        unknown = PydanticCustomError(
            "unknown_type", "unknown event type {type}", {"type": repr(event_type[:100])}
        )
        errors.append({"type": unknown, "loc": ("type",), "input": event_type})
    if "schema_version" not in data:
        errors.append({"type": "missing", "loc": ("schema_version",), "input": data})
    elif type(version) is not int:
        errors.append({"type": "int_type", "loc": ("schema_version",), "input": version})
    elif not errors:
        known = ", ".join(str(v) for t, v in ENVELOPES if t == event_type)
        unsupported = PydanticCustomError(
            "unsupported_version",
            "{type} has no schema_version {version} (supported: {known})",
            {"type": event_type, "version": version, "known": known},
        )
        errors.append({"type": unsupported, "loc": ("schema_version",), "input": version})
    raise ValidationError.from_exception_data("Envelope", errors)


def _model_name(event_type: str, version: int) -> str:
    words = re.split(r"[^0-9A-Za-z]+", event_type)
    return "".join(w[:1].upper() + w[1:] for w in words) + f"V{version}Envelope"


def _envelope_model(event_type: str, version: int, payload: type[Payload]) -> type[Envelope]:
    # Literal[...] of a runtime value: the subscription is evaluated, not type-checked.
    type_literal: Any = Literal.__getitem__(event_type)
    version_literal: Any = Literal.__getitem__(version)
    return create_model(
        _model_name(event_type, version),
        __base__=Envelope,
        __module__=__name__,
        __doc__=f"Envelope of an event of type ``{event_type}``, schema_version {version}.",
        type=(type_literal, Field(description="The event type; selects the payload model.")),
        schema_version=(
            version_literal,
            Field(description="Version of the payload model for this type."),
        ),
        payload=(payload, Field(description="The typed payload for (type, schema_version).")),
    )


ENVELOPES: dict[tuple[str, int], type[Envelope]] = {
    key: _envelope_model(key[0], key[1], model) for key, model in PAYLOADS.items()
}
"""(type, schema_version) -> concrete envelope model, derived from PAYLOADS."""


def newest_version(event_type: str) -> int | None:
    """The highest schema_version registered for ``event_type`` (None: unknown type)."""
    versions = [v for t, v in ENVELOPES if t == event_type]
    return max(versions) if versions else None


def register_payloads(entries: Mapping[tuple[str, int], type[Payload]]) -> list[tuple[str, int]]:
    """Add payload versions to the registry at start; return the keys added.

    For ``ACKLINE_PAYLOAD_PLUGINS`` (:mod:`ackline.schemas.plugins`): a worker can learn a new
    version of a known type without a new build. Rules: the type is one of
    :data:`EVENT_TYPES` (a new type is added in code); the version is a positive int;
    a (type, version) already registered keeps its model (a published version never
    changes: registering the same model again is a no-op, another one is an error).
    Nothing is registered unless every entry passes. Not thread-safe: call it before
    any decoding starts.
    """
    added: dict[tuple[str, int], type[Envelope]] = {}
    for key, model in entries.items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise SchemaError(f"payload registry key {key!r} is not (type, schema_version)")
        event_type, version = key
        if event_type not in _EVENT_TYPE_SET:
            raise SchemaError(f"{event_type!r} is not a known event type; add new types in code")
        if type(version) is not int or version < 1:
            raise SchemaError(f"{event_type} schema_version {version!r} is not a positive int")
        if not (isinstance(model, type) and issubclass(model, Payload)):
            raise SchemaError(f"{event_type} v{version}: {model!r} is not a Payload model")
        if key in PAYLOADS:
            if PAYLOADS[key] is not model:
                raise SchemaError(f"{event_type} v{version} is already registered differently")
            continue
        added[key] = _envelope_model(event_type, version, model)
    for key, envelope in added.items():
        PAYLOADS[key] = entries[key]
        ENVELOPES[key] = envelope
    return list(added)


def envelope_model(type: str, schema_version: int = SCHEMA_VERSION) -> type[Envelope]:
    """The concrete envelope model for ``(type, schema_version)``; SchemaError if none."""
    model = ENVELOPES.get((type, schema_version))
    if model is None:
        if type not in _EVENT_TYPE_SET:
            raise SchemaError(f"unknown event type {type!r}; known: {', '.join(EVENT_TYPES)}")
        raise SchemaError(f"event type {type!r} has no schema_version {schema_version!r}")
    return model


def describe_validation_error(exc: ValidationError, limit: int = 500) -> str:
    """``path: message; ...`` for every error (no input values), cut to ``limit`` chars."""
    parts: list[str] = []
    size = 0
    for err in exc.errors(include_url=False, include_input=False, include_context=False):
        path = ""
        for item in err["loc"]:
            path += f"[{item}]" if isinstance(item, int) else (f".{item}" if path else item)
        part = f"{path}: {err['msg']}" if path else err["msg"]
        parts.append(part)
        size += len(part) + 2
        if size > limit:
            break
    count = exc.error_count()
    text = f"{count} validation error{'s' if count != 1 else ''}: " + "; ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def new_envelope(
    type: str,
    txn_id: str,
    agent_id: str,
    request_id: str,
    payload: Mapping[str, Any] | Payload,
    *,
    occurred_at: datetime | None = None,
    event_id: uuid.UUID | None = None,
    schema_version: int = SCHEMA_VERSION,
) -> Envelope:
    """Build and validate an envelope (the producer SDK's constructor).

    ``occurred_at`` defaults to now (UTC), ``event_id`` to a time-ordered UUIDv7 of
    ``occurred_at`` (:mod:`ackline.schemas.eventid`: keeps the key index warm). Raises
    :class:`SchemaError` (chained to the pydantic ``ValidationError``) if anything is
    invalid, or if ``(type, schema_version)`` is not in :data:`PAYLOADS`.
    """
    model = envelope_model(type, schema_version)
    at = datetime.now(UTC) if occurred_at is None else occurred_at
    if event_id is None:
        event_id = uuid7(max(0, int(at.timestamp() * 1000)))
    data = {
        "event_id": event_id,
        "txn_id": txn_id,
        "type": type,
        "agent_id": agent_id,
        "request_id": request_id,
        "occurred_at": at,
        "schema_version": schema_version,
        "payload": payload if isinstance(payload, Payload) else dict(payload),
    }
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        detail = describe_validation_error(exc)
        raise SchemaError(f"invalid {type} v{schema_version} envelope: {detail}") from exc
    except RecursionError as exc:
        raise SchemaError(f"invalid {type} v{schema_version} envelope: too deep") from exc
