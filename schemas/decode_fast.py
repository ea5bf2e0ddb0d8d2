"""The decoder's fast path: it only ever accepts, and only what the reference accepts.

:func:`make_fast_decoder` wraps a reference decoder (``ackline.schemas.decode.
reference_decode``, the "slow path") and returns a decoder with the same results, field
for field and reason for reason. The fast path answers a record itself only when it can
*prove* that the reference would accept it with the same row; anything else, every
rejection included, goes to the reference unchanged (so reasons, their order and their
detail text are the reference's by construction). The fast path only has to be right
about what it accepts: a subset of what the reference accepts (argued check by check
below), for which it builds the same canonical texts.

Nothing here is a second schema. The payload checks are compiled at first use from the
pydantic models' ``model_fields`` (the registry :data:`ackline.schemas.envelope.ENVELOPES`),
by recognising the field types of ``envelope.py`` (``Text``, ``Ident``, bounded ``int``,
``bool``, a ``Literal`` of strs, ``list[Text|Ident]``, ``JsonObject``) and turned into
msgspec Struct types that accept exactly those values (strict, every field required, no
other key), so the envelope and the payload are checked while they are parsed, in C;
``event_id`` is msgspec's UUID, whose accepted texts (hyphenated or 32 hex digits, any case)
are a subset of the model's UUID type's, with the same value (pinned by a unit test); and
``occurred_at`` goes through
the model's own parser unless it is canonical UTC already (then the parser's result is
``datetime.fromisoformat``'s, which is all it costs). A model it does not recognise (a
plugin with defaults, validators or other field types) always takes the slow path:
:func:`fast_path_models` tells which. If the envelope's fields ever differ from the ones
this module assumes, the fast path is off.

Parsing is msgspec's (C): the envelope first, its payload kept as raw bytes, then the
payload with the Struct of the model its ``type`` and ``schema_version`` name. It keeps
integers exact like ``json`` (same 4300-digit limit), refuses NaN/Infinity, lone-surrogate
escapes, invalid UTF-8, BOM and leading zeros, and hands every float *literal* to
``float_hook`` (:func:`ackline.schemas.numbers.exact_float`: the number rule, the
reference's own). Encoding: strings, ints of any size, bools, None, lists and dicts with
sorted keys are written by msgspec (``order="sorted"``) exactly as the canonical encoder
writes them (pinned by unit tests for every code point and random ints); a payload holding
a float is written by the canonical encoder itself
(:func:`ackline.schemas.canonical.canonical_text`: float texts differ, ``1e+300`` vs
``1e300``). The body around the payload is a Struct of its fixed keys in sorted order,
written by msgspec around the payload's text, and hashed as those bytes.

The fast path accepts when all of these hold (each failed one means "slow path"):

1. ``value`` is non-empty and within ``limits.max_bytes`` (the reference's first checks).
2. msgspec parses it (a non-ASCII value is also checked with ``bytes.decode``, so the
   ``not_utf8`` answer never depends on msgspec), and every float literal passes the hook.
3. The top level has exactly the 8 envelope keys, each of the model's type; ``type`` and
   ``schema_version`` name a registered model with a compiled spec, whose Struct the
   payload passes.
4. No ``\\u0000`` text in the bytes: with 2., no string holds NUL or a lone surrogate.
5. No duplicate key anywhere (:func:`_no_duplicates`: a colon count, no Python walk).
6. Nesting within ``min(limits.max_depth, depth_cap)``: typed fields have a fixed depth,
   free JSON is measured while it is scanned for floats.
7. Every field passes the model's own checks (above; strict types, so exact types here).
"""

from __future__ import annotations

import hashlib
import re
import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final, Literal, Protocol, TypeVar

import annotated_types
import msgspec
from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

from ackline.schemas.canonical import canonical_text
from ackline.schemas.envelope import (
    ENVELOPES,
    MAX_ID_CHARS,
    Envelope,
    Ident,
    JsonObject,
    Payload,
    Text,
    Timestamp,
    _parse_timestamp,
    format_timestamp,
)

FAST_DEPTH_CAP: Final = 64
"""Deepest document the fast path decodes itself: realistic events nest 3-6 deep, and it
stays far below both the reference's parse cap and the depth (258) at which pydantic-core's
serializer fails in the reference (deeper documents are the reference's to judge)."""


class LimitsLike(Protocol):
    """What the fast path reads of ``ackline.schemas.decode.Limits``."""

    @property
    def max_bytes(self) -> int: ...

    @property
    def max_depth(self) -> int: ...


LimitsT = TypeVar("LimitsT", bound=LimitsLike)
ResultT = TypeVar("ResultT")

RowMaker = Callable[[tuple[Any, ...]], ResultT]
"""The Row built from one tuple: (event_id, txn_id, type, agent_id, request_id,
occurred_at, schema_version, payload_json, body_json, body_hash) (ackline.core.tuples)."""

# --- compiled payload specs -----------------------------------------------------------------

_TEXT: Final = 0
_IDENT: Final = 1
_INT: Final = 2
_BOOL: Final = 3
_LITERAL: Final = 4
_TEXT_LIST: Final = 5
_IDENT_LIST: Final = 6
_JSON_OBJECT: Final = 7

FieldSpec = tuple[str, int, Any, Any]
"""(field name, kind, a, b): the int bounds (a, b), or the literal values (a)."""


@dataclass(frozen=True, slots=True)
class PayloadSpec:
    """A payload model compiled to the checks the fast path runs: one per field, names
    distinct (so a document with as many keys, each of them found, has exactly these), and
    the msgspec Struct that runs them while parsing (:func:`_payload_struct`)."""

    fields: tuple[FieldSpec, ...]
    struct: Any


def _shape(annotation: Any) -> tuple[Any, list[Any]]:
    info = FieldInfo.from_annotation(annotation)
    return info.annotation, list(info.metadata)


_TEXT_SHAPE: Final = _shape(Text)
_IDENT_SHAPE: Final = _shape(Ident)
_JSON_OBJECT_SHAPE: Final = _shape(JsonObject)


def _field_kind(annotation: Any, metadata: list[Any]) -> tuple[int, Any, Any] | None:
    """The kind of a payload field, or None when the fast path does not know it."""
    shape = (annotation, metadata)
    if shape == _TEXT_SHAPE:
        return _TEXT, None, None
    if shape == _IDENT_SHAPE:
        return _IDENT, None, None
    if shape == _JSON_OBJECT_SHAPE:
        return _JSON_OBJECT, None, None
    if annotation is bool and not metadata:
        return _BOOL, None, None
    if annotation is int and len(metadata) == 2:
        ge, le = metadata
        if (
            isinstance(ge, annotated_types.Ge)
            and isinstance(le, annotated_types.Le)
            and type(ge.ge) is int
            and type(le.le) is int
        ):
            return _INT, ge.ge, le.le
        return None
    if typing.get_origin(annotation) is Literal and not metadata:
        values = typing.get_args(annotation)
        if values and all(type(v) is str for v in values):
            return _LITERAL, frozenset(values), None
        return None
    if typing.get_origin(annotation) is list and not metadata:
        (item,) = typing.get_args(annotation)
        item_shape = _shape(item)
        if item_shape == _TEXT_SHAPE:
            return _TEXT_LIST, None, None
        if item_shape == _IDENT_SHAPE:
            return _IDENT_LIST, None, None
    return None


def _plain_model(model: type[BaseModel]) -> bool:
    """Strict, extra=forbid, no validators/serializers/computed fields, no custom init."""
    config = model.model_config
    if config.get("strict") is not True or config.get("extra") != "forbid":
        return False
    decorators = model.__pydantic_decorators__
    for group in (
        decorators.validators,
        decorators.field_validators,
        decorators.root_validators,
        decorators.field_serializers,
        decorators.model_serializers,
        decorators.model_validators,
        decorators.computed_fields,
    ):
        if group:
            return False
    return model.model_post_init is BaseModel.model_post_init and not config.get("alias_generator")


def _compile(payload: type[Payload]) -> PayloadSpec | None:
    if not _plain_model(payload):
        return None
    fields: list[FieldSpec] = []
    for name, info in payload.model_fields.items():
        if not info.is_required() or info.alias is not None or info.validation_alias is not None:
            return None
        if info.serialization_alias is not None or info.exclude:
            return None
        kind = _field_kind(info.annotation, list(info.metadata))
        if kind is None:
            return None
        fields.append((name, *kind))
    struct = _payload_struct(fields)
    return None if struct is None else PayloadSpec(tuple(fields), struct)


_EventId = Annotated[uuid.UUID, Field(strict=False)]

_Ident: Any = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]
"""``Ident`` as msgspec checks it: ``0 < len(value) <= MAX_ID_CHARS``, in code points like
``len``."""


def _envelope_fields() -> tuple[tuple[str, tuple[Any, list[Any]], Any], ...]:
    """The envelope as the fast path hard-codes it, field by field: the name, the field's
    shape in the model (annotation, metadata) and the msgspec type it is decoded as (read
    when a decoder is made)."""
    return (
        ("event_id", _shape(_EventId), uuid.UUID),
        ("txn_id", _IDENT_SHAPE, _Ident),
        ("type", (str, []), str),
        ("agent_id", _IDENT_SHAPE, _Ident),
        ("request_id", _IDENT_SHAPE, _Ident),
        ("occurred_at", _shape(Timestamp), str),
        ("schema_version", (int, []), int),
        ("payload", (Payload, []), msgspec.Raw),
    )


def _envelope_is_as_expected() -> bool:
    """The fast path hard-codes the envelope fields: check they are still these."""
    fields = Envelope.model_fields
    expect = {name: shape for name, shape, _ in _envelope_fields()}
    if fields.keys() != expect.keys() or not _plain_model(Envelope):
        return False
    return all(
        (info.annotation, list(info.metadata)) == expect[name] for name, info in fields.items()
    )


FAST_ENABLED: Final = _envelope_is_as_expected()
"""False if the envelope model changed under this module: then every record goes slow."""

_SPECS: dict[type[Envelope], PayloadSpec | None] = {}
"""Compiled specs by envelope model. Keyed by the model, not by (type, version): the
registry is read on every record, so what the fast path accepts follows it exactly."""


def _spec_for(envelope: type[Envelope], event_type: str, version: int) -> PayloadSpec | None:
    """The compiled spec of the model registered for (type, version); None: slow path."""
    try:
        return _SPECS[envelope]
    except KeyError:
        pass
    spec = None
    if _plain_model(envelope):
        fields = envelope.model_fields
        payload = fields["payload"].annotation
        literal_ok = typing.get_args(fields["type"].annotation) == (
            event_type,
        ) and typing.get_args(fields["schema_version"].annotation) == (version,)
        if literal_ok and isinstance(payload, type) and issubclass(payload, Payload):
            spec = _compile(payload)
    _SPECS[envelope] = spec
    return spec


def _envelope_struct() -> Any:
    """The envelope as msgspec decodes it (C): exactly the eight keys (a duplicate one is
    caught by the colon count), the three ids checked, the payload left as its bytes."""
    return msgspec.defstruct(
        "Envelope",
        [(name, decoded_as) for name, _, decoded_as in _envelope_fields()],
        forbid_unknown_fields=True,
        gc=False,  # decoded JSON holds no cycle
    )


class _Body(msgspec.Struct, gc=False):
    """The canonical body around its payload: the envelope without ``event_id``, its keys
    in sorted order (msgspec writes a Struct's fields in the order declared, and its
    strings exactly as the canonical encoder does), the payload's canonical text as is."""

    agent_id: str
    occurred_at: str
    payload: msgspec.Raw
    request_id: str
    schema_version: int
    txn_id: str
    type: str


@dataclass(frozen=True, slots=True)
class TypedPayload:
    """A payload spec as a msgspec Struct decoder: typed decoding checks every field but the
    free JSON objects (``objects``: their depth and floats are scanned) and the lists' depth
    (``lists``: they need one level of room below the payload)."""

    decode: Callable[[bytes], Any]
    objects: tuple[str, ...]
    lists: bool


def _msgspec_type(kind: int, a: Any, b: Any) -> Any:
    """The msgspec type that accepts exactly what the model accepts for a field of ``kind``
    (strict: no coercion, as pydantic in strict mode), where msgspec can type it at all
    (:func:`_payload_struct` says when it cannot)."""
    if kind == _TEXT:
        return str
    if kind == _IDENT:
        return _Ident
    if kind == _INT:
        return Annotated[int, msgspec.Meta(ge=a, le=b)]
    if kind == _BOOL:
        return bool
    if kind == _LITERAL:
        return Literal[tuple(sorted(a))]
    if kind == _JSON_OBJECT:
        return dict[str, Any]
    if kind == _TEXT_LIST:
        return list[str]
    return list[_Ident]  # _IDENT_LIST, the only kind left


def _payload_struct(fields: list[FieldSpec]) -> Any:
    """The Struct of a payload's fields (strict types, every field required, no other
    key), or None where msgspec cannot type what pydantic can (int bounds beyond int64,
    field names that are not identifiers): such a model is the reference's."""
    try:
        struct = msgspec.defstruct(
            "Payload",
            [(name, _msgspec_type(kind, a, b)) for name, kind, a, b in fields],
            forbid_unknown_fields=True,
            gc=False,  # decoded JSON holds no cycle
        )
        msgspec.json.Decoder(struct)  # the bounds are checked when a decoder is made
    except (TypeError, ValueError):
        return None
    return struct


def typed_payload(spec: PayloadSpec, float_hook: Callable[[str], float]) -> TypedPayload:
    """A decoder of ``spec``'s Struct, with the free JSON objects and lists it leaves."""
    return TypedPayload(
        msgspec.json.Decoder(spec.struct, float_hook=float_hook).decode,
        tuple(name for name, kind, _, _ in spec.fields if kind == _JSON_OBJECT),
        any(kind in (_TEXT_LIST, _IDENT_LIST) for _, kind, _, _ in spec.fields),
    )


def fast_path_models() -> Mapping[tuple[str, int], bool]:
    """Which registered (type, version) the fast path handles (for a start-up log line)."""
    return {
        key: FAST_ENABLED and _spec_for(model, *key) is not None for key, model in ENVELOPES.items()
    }


# --- the checks -----------------------------------------------------------------------------

_BAD: Final = -1
_PLAIN: Final = 0
_FLOATS: Final = 1


def _json_scan(container: Any, room: int) -> int:
    """_BAD if a parsed container nests more than ``room`` levels (itself included),
    else _FLOATS if it holds a float at any depth, else _PLAIN. Values come from the
    parser: exact dict/list/str/int/float/bool/None."""
    if room < 1:
        return _BAD
    found = _PLAIN
    for item in container.values() if type(container) is dict else container:
        kind = type(item)
        if kind is float:
            found = _FLOATS
        elif kind is dict or kind is list:
            inner = _json_scan(item, room - 1)
            if inner == _BAD:
                return _BAD
            found |= inner
    return found


_CANONICAL_STAMP: Final = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", re.ASCII)
"""An occurred_at already in canonical form: once ``_parse_timestamp`` accepted it, its
canonical text is itself (every field is fixed-width; 'Z' is UTC, nothing to convert)."""

_ESCAPE: Final = re.compile(rb"\\u")
"""A ``\\u`` escape (or text with a backslash before a ``u``): rare in real traffic.
``re.search`` finds it faster than ``bytes.__contains__``."""


def _no_duplicates(value: bytes, accounted: int, escapes: bool) -> bool:
    """Whether the document ``value`` has no duplicate key, given ``accounted``: the
    number of members in the *parsed* document plus the colons inside its strings.

    Every ':' byte of a JSON text is a member separator or lies inside a string, where a
    colon can also be written ``\\u003a``/``\\u003A`` (no other escape makes one). The
    parser keeps one member per distinct key, so with M members in the text and K
    distinct ones after parsing, ``colons(text) + escaped = accounted + (M - K) +
    colons in the dropped members' strings``. Counting ``\\u003a`` sequences can only
    overcount escaped colons (e.g. in the text ``\\\\u003a``), so equality proves
    M == K; a mismatch only means "not proven" (the slow path decides).
    """
    escaped = 0
    if escapes:
        escaped = value.count(b"\\u003a") + value.count(b"\\u003A")
    return value.count(b":") + escaped == accounted


# --- the decoder ----------------------------------------------------------------------------


def make_fast_decoder(  # noqa: C901 - one flat hot function, on purpose
    slow: Callable[[bytes | None, LimitsT], ResultT],
    row: RowMaker[ResultT],
    float_hook: Callable[[str], float],
    depth_cap: int = FAST_DEPTH_CAP,
) -> Callable[[bytes | None, LimitsT], ResultT]:
    """A decoder equal to ``slow`` that answers what it can prove itself.

    ``float_hook`` must accept exactly the float literals ``slow`` accepts and raise for
    the others (``ackline.schemas.numbers.exact_float`` for the reference decoder);
    ``row`` builds ``slow``'s accepted result from the ten Row fields in order.
    """
    envelope_decode: Callable[[bytes], Any] = msgspec.json.Decoder(_envelope_struct()).decode
    dumps_sorted = msgspec.json.Encoder(order="sorted").encode
    as_dict = msgspec.structs.asdict
    sha256 = hashlib.sha256
    parse_stamp = _parse_timestamp
    canonical_stamp = _CANONICAL_STAMP.fullmatch
    find_escape = _ESCAPE.search
    from_iso = datetime.fromisoformat
    encode_body = msgspec.json.Encoder().encode
    body_struct = _Body
    raw = msgspec.Raw
    typed: dict[type[Envelope], TypedPayload | None] = {}
    envelopes = ENVELOPES  # the registry itself (plugins add to it at start)
    json_scan = _json_scan
    enabled = FAST_ENABLED

    def typed_for(model: type[Envelope], event_type: str, version: int) -> TypedPayload | None:
        spec = _spec_for(model, event_type, version)
        found = typed[model] = None if spec is None else typed_payload(spec, float_hook)
        return found

    def decode(value: bytes | None, limits: LimitsT) -> ResultT:  # noqa: C901
        """Decode one record value: a row, or ``slow``'s answer (never raises for it)."""
        if not enabled or not value or len(value) > limits.max_bytes:
            return slow(value, limits)
        try:
            env = envelope_decode(value)
        except Exception:  # msgspec's errors: not the eight keys, a type, a bad id, syntax
            return slow(value, limits)
        event_type = env.type
        version = env.schema_version
        model = envelopes.get((event_type, version))
        if model is None:
            return slow(value, limits)
        try:
            spec = typed[model]
        except KeyError:
            spec = typed_for(model, event_type, version)
        if spec is None:
            return slow(value, limits)
        if not value.isascii():
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                return slow(value, limits)
        escapes = find_escape(value) is not None
        if escapes and b"\\u0000" in value:  # a NUL escape (or the text "\\u0000")
            return slow(value, limits)
        # The envelope is depth 1, the payload 2: room below the payload object.
        depth_room = min(limits.max_depth, depth_cap) - 2
        if depth_room < 0 or (spec.lists and depth_room < 1):
            return slow(value, limits)
        txn_id = env.txn_id
        agent_id = env.agent_id
        request_id = env.request_id
        event_id = env.event_id
        raw_stamp = env.occurred_at
        try:
            payload = spec.decode(env.payload)
            found = _PLAIN
            for name in spec.objects:
                inner = json_scan(getattr(payload, name), depth_room)
                if inner == _BAD:
                    return slow(value, limits)
                found |= inner
            canonical = canonical_stamp(raw_stamp) is not None
            occurred_at: datetime = from_iso(raw_stamp) if canonical else parse_stamp(raw_stamp)
            if found == _PLAIN:
                payload_bytes = dumps_sorted(payload)
            else:  # floats: only the canonical encoder writes them canonically
                payload_bytes = canonical_text(as_dict(payload)).encode("utf-8")
        except Exception:  # msgspec's errors, a float_hook refusal, the models' own
            return slow(value, limits)
        stamp = raw_stamp if canonical else format_timestamp(occurred_at)
        body = encode_body(
            body_struct(
                agent_id, stamp, raw(payload_bytes), request_id, version, txn_id, event_type
            )
        )
        # The parsed document's members and the colons in its strings, counted on the
        # body (one count instead of seven): a ':' byte of UTF-8 is always the character
        # ':', and the body is the document's other seven members, one colon each, with
        # their strings and the payload's text, in which JSON never escapes a ':'. The
        # eighth member, event_id, has one colon and none in its UUID text; the stamp is
        # counted as it came.
        accounted = body.count(b":") + 1
        if not canonical:
            accounted += raw_stamp.count(":") - stamp.count(":")
        if not _no_duplicates(value, accounted, escapes):
            return slow(value, limits)
        return row(
            (
                event_id,
                txn_id,
                event_type,
                agent_id,
                request_id,
                occurred_at,
                version,
                payload_bytes.decode("utf-8"),
                body.decode("utf-8"),
                sha256(body).digest(),
            )
        )

    return decode
