"""The hot-path decoder: one Kafka record value in, a :class:`Row` or a :class:`Rejection` out.

``decode`` is pure and never raises for bad input. It checks, in this order, and the
first failed check names the :class:`Rejection` reason (a short stable code):

==================== ====================================================================
``empty``             the value is ``None`` (a tombstone) or zero bytes
``too_large``         more than ``Limits.max_bytes`` bytes (checked before parsing)
``not_utf8``          the bytes are not valid UTF-8
``invalid_json``      not one JSON text, or the top level is not an object; also an
                      integer literal too long for Python (over 4300 digits)
``duplicate_key``     some object, at any depth, repeats a key
``non_finite_number`` a ``NaN``, ``Infinity`` or ``-Infinity`` literal
``too_deep``          nesting deeper than ``Limits.max_depth`` (the top-level object is
                      depth 1, each nested object or array adds 1). A document nested so
                      deep that the parser cannot descend into it (beyond Python's
                      recursion limit) is ``too_deep`` whatever else is wrong with it
``unknown_type``      ``type`` is a string that is not one of ``EVENT_TYPES``
``unsupported_version`` ``type`` is known but ``PAYLOADS`` has no model for its integer
                      ``schema_version``
``schema_invalid``    anything else the envelope model rejects, including a missing or
                      non-string ``type`` and a missing or non-integer ``schema_version``;
                      the detail lists ``path: message`` for the errors
==================== ====================================================================

``Rejection.detail`` is a human message of at most 500 characters. It never quotes the
input wholesale, and NUL and lone surrogates in it are escaped, so it can be stored in a
PostgreSQL text column and sent in a dead-letter record.

Unknown types and versions. An event whose ``type`` is unknown, or whose
``schema_version`` has no payload model, is *rejected* with ``unknown_type`` or
``unsupported_version``: the consumer writes a reject row and a dead-letter record that
carry the reason. It is never silently dropped and never stored untyped. A consumer
upgraded to know the new type or version can reprocess those records from the
dead-letter topic. Producers must therefore deploy a new type or version only after the
consumers that read it.

A :class:`Row` holds the typed columns, the canonical JSON of the payload (for the
``jsonb`` column), the canonical JSON of the body (for the conflicts table) and the
SHA-256 of that body text, computed by the same :func:`schemas.canonical.canonical_text`
the producer SDK uses (see :mod:`schemas.canonical`).
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from pydantic import ValidationError

from schemas.canonical import canonical_texts
from schemas.envelope import PARSED_JSON_CONTEXT, describe_validation_error, route_envelope
from schemas.errors import SchemaError

EMPTY: Final = "empty"
TOO_LARGE: Final = "too_large"
NOT_UTF8: Final = "not_utf8"
INVALID_JSON: Final = "invalid_json"
DUPLICATE_KEY: Final = "duplicate_key"
NON_FINITE_NUMBER: Final = "non_finite_number"
TOO_DEEP: Final = "too_deep"
UNKNOWN_TYPE: Final = "unknown_type"
UNSUPPORTED_VERSION: Final = "unsupported_version"
SCHEMA_INVALID: Final = "schema_invalid"

REASONS: Final[tuple[str, ...]] = (
    EMPTY,
    TOO_LARGE,
    NOT_UTF8,
    INVALID_JSON,
    DUPLICATE_KEY,
    NON_FINITE_NUMBER,
    TOO_DEEP,
    UNKNOWN_TYPE,
    UNSUPPORTED_VERSION,
    SCHEMA_INVALID,
)
"""Every rejection reason, in the order the checks run."""

MAX_DETAIL_CHARS: Final = 500


@dataclass(frozen=True, slots=True)
class Row:
    """A decoded event, ready for the events table."""

    event_id: uuid.UUID
    txn_id: str
    type: str
    agent_id: str
    request_id: str
    occurred_at: datetime
    """Timezone-aware, in UTC."""
    schema_version: int
    payload_json: str
    """Canonical JSON text of the payload (for the ``jsonb`` column)."""
    body_json: str
    """Canonical JSON text of the body: the envelope without ``event_id``."""
    body_hash: bytes
    """SHA-256 of ``body_json`` encoded as UTF-8 (32 bytes)."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a record value is not an event. ``reason`` is one of :data:`REASONS`."""

    reason: str
    detail: str


@dataclass(frozen=True)
class Limits:
    """Size and nesting limits applied before a value is parsed or validated."""

    max_bytes: int = 1_048_576
    max_depth: int = 32

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise SchemaError(f"Limits.max_bytes must be at least 1, not {self.max_bytes}")
        if self.max_depth < 1:
            raise SchemaError(f"Limits.max_depth must be at least 1, not {self.max_depth}")


DEFAULT_LIMITS: Final = Limits()


# --- parsing ----------------------------------------------------------------------------


class _DuplicateKeyError(Exception):
    pass


class _NonFiniteError(Exception):
    pass


def _first_duplicate(pairs: list[tuple[str, Any]]) -> str:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return key
        seen.add(key)
    return ""


def _strict_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _DuplicateKeyError
    return obj


def _strict_constant(name: str) -> Any:
    raise _NonFiniteError(name)


_STRICT_DECODER: Final = json.JSONDecoder(
    object_pairs_hook=_strict_pairs, parse_constant=_strict_constant
)


def _clip(text: str) -> str:
    """``text`` made safe for PostgreSQL text and cut to MAX_DETAIL_CHARS characters."""
    if not text.isascii() or "\x00" in text:
        text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= MAX_DETAIL_CHARS:
        return text
    return text[: MAX_DETAIL_CHARS - 1] + "\u2026"


def _json_error(exc: ValueError) -> Rejection:
    if isinstance(exc, json.JSONDecodeError):
        where = f"line {exc.lineno} column {exc.colno} (char {exc.pos})"
        return Rejection(INVALID_JSON, _clip(f"{exc.msg} at {where}"))
    return Rejection(INVALID_JSON, _clip(str(exc)))


_SUSPECT_ESCAPE: Final = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
"""An escape that may decode to NUL or a surrogate (false positives only cost a walk)."""

_NOT_OBJECT: Final = Rejection(INVALID_JSON, "the top level is not a JSON object")


def _classify_hook_failure(text: str) -> Rejection:
    """Re-parse a document a strict hook refused, to report the first reason in order.

    Runs only for rejected records, so the happy path keeps stateless module-level hooks.
    """
    duplicates: list[str] = []
    constants: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items) and not duplicates:
            duplicates.append(_first_duplicate(items))
        return obj

    def constant(name: str) -> Any:
        constants.append(name)
        return None

    try:
        parsed = json.JSONDecoder(object_pairs_hook=pairs, parse_constant=constant).decode(text)
    except RecursionError:
        return Rejection(TOO_DEEP, "nested too deeply to parse")
    except ValueError as exc:
        return _json_error(exc)
    if not isinstance(parsed, dict):
        return _NOT_OBJECT
    if duplicates:
        return Rejection(DUPLICATE_KEY, _clip(f"an object repeats the key {duplicates[0]!r}"))
    return Rejection(NON_FINITE_NUMBER, _clip(f"{constants[0]} is not a JSON number"))


def _deeper_than(obj: object, max_depth: int) -> bool:
    """Whether the container nesting of a parsed document exceeds max_depth (iterative)."""
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return True
        children: Iterable[object] = node.values() if isinstance(node, dict) else ()
        if isinstance(node, list):
            children = node
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def _parse(value: bytes | None, limits: Limits) -> tuple[dict[str, Any], bool] | Rejection:
    """Bytes to a JSON object, or the first failed check up to ``too_deep``."""
    if value is None:
        return Rejection(EMPTY, "the record value is null (a tombstone)")
    if len(value) == 0:
        return Rejection(EMPTY, "the record value is empty (0 bytes)")
    if len(value) > limits.max_bytes:
        return Rejection(TOO_LARGE, f"{len(value)} bytes is over the {limits.max_bytes} limit")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Rejection(NOT_UTF8, _clip(str(exc)))
    try:
        parsed = _STRICT_DECODER.decode(text)
    except (_DuplicateKeyError, _NonFiniteError):
        return _classify_hook_failure(text)
    except RecursionError:
        return Rejection(TOO_DEEP, "nested too deeply to parse")
    except ValueError as exc:
        return _json_error(exc)
    if not isinstance(parsed, dict):
        return _NOT_OBJECT
    # Nesting depth never exceeds the number of opening brackets: skip the walk if few.
    if value.count(b"{") + value.count(b"[") > limits.max_depth and _deeper_than(
        parsed, limits.max_depth
    ):
        return Rejection(TOO_DEEP, f"nesting is deeper than the {limits.max_depth} limit")
    return parsed, "\\u" not in text or _SUSPECT_ESCAPE.search(text) is None


# --- validation -------------------------------------------------------------------------


def _routing_rejection(exc: ValidationError) -> Rejection:
    errors = exc.errors(include_url=False, include_input=False)
    for reason in (UNKNOWN_TYPE, UNSUPPORTED_VERSION):
        for err in errors:
            if err["type"] == reason:
                return Rejection(reason, _clip(err["msg"]))
    return Rejection(SCHEMA_INVALID, _clip(describe_validation_error(exc, MAX_DETAIL_CHARS)))


def decode(value: bytes | None, limits: Limits = DEFAULT_LIMITS) -> Row | Rejection:
    """Decode one record value into a :class:`Row`, or say why not (never raises for it)."""
    parsed = _parse(value, limits)
    if isinstance(parsed, Rejection):
        return parsed
    obj, plain = parsed
    context = PARSED_JSON_CONTEXT if plain else None
    try:
        model = route_envelope(obj)
    except ValidationError as exc:
        return _routing_rejection(exc)
    try:
        env = model.model_validate(obj, context=context)
        payload_json, body_json = canonical_texts(env)
        digest = hashlib.sha256(body_json.encode("utf-8")).digest()
    except ValidationError as exc:
        return Rejection(SCHEMA_INVALID, _clip(describe_validation_error(exc, MAX_DETAIL_CHARS)))
    except (SchemaError, ValueError, TypeError, ArithmeticError, RecursionError) as exc:
        # Not expected after validation; rejecting beats crashing the consumer on it.
        return Rejection(SCHEMA_INVALID, _clip(f"{type(exc).__name__}: {exc}"))
    return Row(  # positional: measurably cheaper per event than keywords
        env.event_id,
        env.txn_id,
        env.type,
        env.agent_id,
        env.request_id,
        env.occurred_at,
        env.schema_version,
        payload_json,
        body_json,
        digest,
    )
