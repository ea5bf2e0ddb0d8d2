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
``non_finite_number`` a ``NaN``, ``Infinity`` or ``-Infinity`` literal, or a number too
                      large for a double (``1e400``: it would read as infinity)
``inexact_number``    a number literal with a fraction or an exponent whose decimal value
                      a double does not hold exactly: it differs from the value of the
                      shortest text of the double it reads as (``0.1`` and ``1E2`` are
                      fine; ``12345678901234567890.5``, ``1e-400`` and
                      ``0.10000000000000001`` are not; :mod:`ackline.schemas.numbers`).
                      Integer literals are exact and never inexact
``too_deep``          nesting deeper than ``Limits.max_depth`` (the top-level object is
                      depth 1, each nested object or array adds 1). A document whose
                      brackets (outside strings) nest deeper than ``PARSE_DEPTH_CAP`` is
                      ``too_deep`` before it is parsed, whatever else is wrong with it: so
                      the answer never depends on how deep the caller's stack is
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
consumers that read it. A version *newer* than any this process knows for a known type
is marked on the rejection (``Rejection.newer``): the consumer runtime may hold the
partition there for a while instead of rejecting, expecting a worker that knows the
version to take it over (docs/schema.md, "Evolving the schema").

A :class:`Row` holds the typed columns, the canonical JSON of the payload (for the
``jsonb`` column), the canonical JSON of the body (for the conflicts table) and the
SHA-256 of that body text, computed by the same :func:`ackline.schemas.canonical.canonical_text`
the producer SDK uses (see :mod:`ackline.schemas.canonical`).

Two decoders, one behaviour. :func:`reference_decode` is the definition: the checks
above, then the envelope model's validation and the canonical encoder. :func:`decode`,
the one the runtimes call, first tries a fast path (:mod:`ackline.schemas.decode_fast`:
msgspec parsing and checks compiled from the same pydantic models) that only ever
*accepts*, and only when it can prove the reference would accept with the same row;
everything else goes to :func:`reference_decode` unchanged. A differential test holds
them equal over more than a million generated and hostile inputs
(``tests/unit/test_decode_differential.py``, ``make decode-diff``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, NamedTuple

from pydantic import ValidationError

from ackline.core.tuples import builder
from ackline.schemas.canonical import canonical_texts
from ackline.schemas.decode_fast import FAST_DEPTH_CAP, make_fast_decoder
from ackline.schemas.envelope import (
    PARSED_JSON_CONTEXT,
    describe_validation_error,
    newest_version,
    route_envelope,
)
from ackline.schemas.errors import SchemaError
from ackline.schemas.numbers import exact_float, round_trips

EMPTY: Final = "empty"
TOO_LARGE: Final = "too_large"
NOT_UTF8: Final = "not_utf8"
INVALID_JSON: Final = "invalid_json"
DUPLICATE_KEY: Final = "duplicate_key"
NON_FINITE_NUMBER: Final = "non_finite_number"
INEXACT_NUMBER: Final = "inexact_number"
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
    INEXACT_NUMBER,
    TOO_DEEP,
    UNKNOWN_TYPE,
    UNSUPPORTED_VERSION,
    SCHEMA_INVALID,
)
"""Every rejection reason, in the order the checks run."""

MAX_DETAIL_CHARS: Final = 500


class Row(NamedTuple):
    """A decoded event, ready for the events table.

    A named tuple, not a frozen dataclass: one is made per event on the hot path, and a
    frozen dataclass costs 2-4 times as much to build (its fields are set one by one
    through ``object.__setattr__``). Immutable all the same.
    """

    event_id: uuid.UUID
    txn_id: str
    type: str
    agent_id: str
    request_id: str
    occurred_at: datetime  # timezone-aware, in UTC
    schema_version: int
    payload_json: str  # canonical JSON text of the payload (for the ``jsonb`` column)
    body_json: str  # canonical JSON text of the body: the envelope without ``event_id``
    body_hash: bytes  # SHA-256 of ``body_json`` encoded as UTF-8 (32 bytes)


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a record value is not an event. ``reason`` is one of :data:`REASONS`."""

    reason: str
    detail: str
    newer: tuple[str, int] | None = None
    """(type, schema_version) when ``reason`` is ``unsupported_version`` and the version
    is higher than every version registered for that type here."""


@dataclass(frozen=True)
class Limits:
    """Size and nesting limits applied before a value is parsed or validated.

    ``max_depth`` above 255 buys nothing: pydantic-core's serializer stops at 257 levels,
    so a deeper document is ``schema_invalid`` whatever the limit (the setting
    ``ACKLINE_MAX_JSON_DEPTH`` is capped at :data:`MAX_SUPPORTED_DEPTH` for that reason).
    """

    max_bytes: int = 1_048_576
    max_depth: int = 32

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise SchemaError(f"Limits.max_bytes must be at least 1, not {self.max_bytes}")
        if self.max_depth < 1:
            raise SchemaError(f"Limits.max_depth must be at least 1, not {self.max_depth}")


DEFAULT_LIMITS: Final = Limits()

MAX_SUPPORTED_DEPTH: Final = 255
"""The deepest document every path decodes (a test pins it): the cap of the setting."""


# --- parsing ----------------------------------------------------------------------------


class _DuplicateKeyError(Exception):
    pass


class _NonFiniteError(Exception):
    pass


class _InexactError(Exception):
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


def _strict_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # overflow: 1e400 reads as infinity, which no JSON column holds
        raise _NonFiniteError(text)
    if not round_trips(text, value):  # 1e-400 reads as 0.0, 1.00000000000000001 as 1.0
        raise _InexactError(text)
    return value


_STRICT_DECODER: Final = json.JSONDecoder(
    object_pairs_hook=_strict_pairs, parse_constant=_strict_constant, parse_float=_strict_float
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
    inexact: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items) and not duplicates:
            duplicates.append(_first_duplicate(items))
        return obj

    def constant(name: str) -> Any:
        constants.append(name)
        return None

    def number(literal: str) -> Any:
        value = float(literal)
        if math.isinf(value):
            constants.append(literal[:40])
        elif not inexact and not round_trips(literal, value):
            inexact.append(literal)
        return value

    try:
        parsed = json.JSONDecoder(
            object_pairs_hook=pairs, parse_constant=constant, parse_float=number
        ).decode(text)
    except RecursionError:
        return Rejection(TOO_DEEP, "nested too deeply to parse")
    except ValueError as exc:
        return _json_error(exc)
    if not isinstance(parsed, dict):
        return _NOT_OBJECT
    if duplicates:
        return Rejection(DUPLICATE_KEY, _clip(f"an object repeats the key {duplicates[0]!r}"))
    if constants:
        return Rejection(NON_FINITE_NUMBER, _clip(f"{constants[0]} is not a finite JSON number"))
    literal = inexact[0]
    shown = literal if len(literal) <= 60 else f"{literal[:40]}... ({len(literal)} chars)"
    return Rejection(
        INEXACT_NUMBER,
        _clip(f"{shown} is not exactly a double (it would read as {float(literal)!r})"),
    )


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


PARSE_DEPTH_CAP: Final = 512
"""Documents nested deeper than this are not parsed (see ``too_deep``); at least the
largest ``max_json_depth`` the settings allow, and far below Python's recursion limit."""

_JSON_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKET: Final = re.compile(rb"[\[\]{}]")


def _bracket_depth_over(value: bytes, cap: int) -> bool:
    """Whether brackets outside JSON strings nest deeper than ``cap``, parser-free.

    Without it, a document nested close to the recursion limit was ``too_deep`` when the
    caller's stack was deep and ``invalid_json`` (or accepted) when it was shallow: the
    worker thread and a test process disagreed on the same bytes.
    """
    depth = 0
    for bracket in _BRACKET.findall(_JSON_STRING.sub(b"", value)):
        if bracket in (b"[", b"{"):
            depth += 1
            if depth > cap:
                return True
        else:
            depth -= 1
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
    brackets = value.count(b"{") + value.count(b"[")
    if brackets > PARSE_DEPTH_CAP and _bracket_depth_over(value, PARSE_DEPTH_CAP):
        return Rejection(TOO_DEEP, f"nesting is deeper than {PARSE_DEPTH_CAP}: not parsed")
    try:
        parsed = _STRICT_DECODER.decode(text)
    except (_DuplicateKeyError, _NonFiniteError, _InexactError):
        return _classify_hook_failure(text)
    except RecursionError:
        return Rejection(TOO_DEEP, "nested too deeply to parse")
    except ValueError as exc:
        return _json_error(exc)
    if not isinstance(parsed, dict):
        return _NOT_OBJECT
    # Nesting depth never exceeds the number of opening brackets: skip the walk if few.
    if brackets > limits.max_depth and _deeper_than(parsed, limits.max_depth):
        return Rejection(TOO_DEEP, f"nesting is deeper than the {limits.max_depth} limit")
    return parsed, "\\u" not in text or _SUSPECT_ESCAPE.search(text) is None


# --- validation -------------------------------------------------------------------------


def _routing_rejection(exc: ValidationError, obj: dict[str, Any]) -> Rejection:
    errors = exc.errors(include_url=False, include_input=False)
    for reason in (UNKNOWN_TYPE, UNSUPPORTED_VERSION):
        for err in errors:
            if err["type"] == reason:
                return Rejection(reason, _clip(err["msg"]), _newer(reason, obj))
    return Rejection(SCHEMA_INVALID, _clip(describe_validation_error(exc, MAX_DETAIL_CHARS)))


def _newer(reason: str, obj: dict[str, Any]) -> tuple[str, int] | None:
    if reason != UNSUPPORTED_VERSION:
        return None
    event_type, version = obj.get("type"), obj.get("schema_version")
    if not isinstance(event_type, str) or type(version) is not int:
        return None
    newest = newest_version(event_type)
    return (event_type, version) if newest is not None and version > newest else None


def reference_decode(value: bytes | None, limits: Limits = DEFAULT_LIMITS) -> Row | Rejection:
    """Decode one record value into a :class:`Row`, or say why not (never raises for it).

    The reference decoder: the checks above, in order, then the envelope model's own
    validation and :func:`ackline.schemas.canonical.canonical_texts`. It defines every
    result of :func:`decode`, which answers through it whatever its fast path does not
    accept (and the differential test holds the two equal).
    """
    parsed = _parse(value, limits)
    if isinstance(parsed, Rejection):
        return parsed
    obj, plain = parsed
    context = PARSED_JSON_CONTEXT if plain else None
    try:
        model = route_envelope(obj)
    except ValidationError as exc:
        return _routing_rejection(exc, obj)
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


_FAST: Final = make_fast_decoder(reference_decode, builder(Row), exact_float, FAST_DEPTH_CAP)


def decode(value: bytes | None, limits: Limits = DEFAULT_LIMITS) -> Row | Rejection:
    """Decode one record value into a :class:`Row`, or say why not (never raises for it).

    The same results as :func:`reference_decode`, field for field and reason for reason
    (detail text included), about 2.5 times faster on realistic events: a fast path
    (:mod:`ackline.schemas.decode_fast`, derived from the models) answers the events it
    can prove the reference would accept with the same row, and hands everything else,
    every rejection included, to :func:`reference_decode` unchanged.
    """
    return _FAST(value, limits)
