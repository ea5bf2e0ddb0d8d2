"""The canonical body of an event and its hash.

The *body* of an envelope is the envelope without ``event_id``: the fields ``agent_id``,
``occurred_at``, ``payload``, ``request_id``, ``schema_version``, ``txn_id`` and ``type``.
It never contains transport metadata (Kafka topic, partition, offset, key, headers,
broker timestamps). Two copies of an event with the same body are the same event, even
if their ``event_id`` differ; ``body_hash`` is how the sink tells a harmless redelivery
(same ``txn_id``, same hash) from a conflict (same ``txn_id``, different hash).

Canonical form (version 1), applied to the *validated* envelope:

1. Dump the model in pydantic JSON mode without ``event_id``. Validation has already
   normalised the values, so equivalent inputs give equal data:

   * ``occurred_at`` is converted to UTC and written ``YYYY-MM-DDTHH:MM:SS.ffffffZ``
     (always six fraction digits, upper-case ``T`` and ``Z``): ``2024-05-01T12:00:00Z``,
     ``2024-05-01T12:00:00+00:00`` and ``2024-05-01T14:00:00+02:00`` give the same text.
   * Numbers are Python ``int`` (a JSON number without fraction or exponent) or ``float``
     (with a fraction or an exponent). ``1e2``, ``100.0`` and ``1.0E2`` are the same
     float ``100.0``; ``100`` is an int and stays ``100``. Typed integer fields accept
     only ints. NaN and the infinities are rejected before this step.
   * Strings contain no NUL and no lone surrogate (rejected by validation).

2. Serialise as JSON with

   * object keys sorted by Unicode code point (Python's ``sorted`` on ``str``), at
     every depth; arrays keep their order;
   * no insignificant whitespace: separators ``,`` and ``:``;
   * strings: non-ASCII characters written as themselves; ``"`` and ``\\`` escaped as
     ``\\"`` and ``\\\\``; ``\\b \\f \\n \\r \\t`` as those two-character escapes; the
     other characters below U+0020 as ``\\u00xx`` (lower-case hex); nothing else escaped;
   * ints in decimal without leading zeros or ``+``; floats in Python's shortest
     round-trip ``repr`` (``0.1``, ``100.0``, ``1e+300``; ``-0.0`` stays ``-0.0``);
   * ``true``, ``false``, ``null``.

3. Encode as UTF-8 (no BOM). ``body_hash`` is SHA-256 of those bytes (32 bytes).

This is Python's ``json`` encoder with ``sort_keys=True, separators=(",", ":"),
ensure_ascii=False, allow_nan=False``. It is close to, but not, RFC 8785 (JCS): JCS sorts
keys by UTF-16 code units and writes numbers the ECMAScript way (``100.0`` as ``100``).

The producer SDK (:func:`hash_envelope`, :func:`canonical_body`) and the decoder both go
through :func:`canonical_texts`, so a hash computed at the source equals the one the
sink computes; :func:`body_hash` hashes an already dumped body the same way.

Changing anything in this module changes the hash of already stored events: do not,
without a new canonical-form version. ``schemas/CANONICAL.md`` restates the form with a
test vector that a unit test pins.
"""

from __future__ import annotations

import hashlib
import json
import json.encoder
from collections.abc import Callable, Mapping
from typing import Any, Final

from ackline.schemas.envelope import Envelope
from ackline.schemas.errors import SchemaError

CANONICAL_FORM_VERSION: Final = 1

_REFERENCE_ENCODER: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
"""The canonical form, by definition: Python's ``json`` encoder with these settings."""


def _no_default(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON data")


def _make_encode() -> Callable[[Any], str]:
    """A reusable C encoder with the reference settings (no per-call setup), if there is one.

    ``JSONEncoder.encode`` builds this same C encoder on every call; building it once
    saves ~2 us per value. Falls back to the reference encoder without the accelerator.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _REFERENCE_ENCODER.encode
    ref = _REFERENCE_ENCODER
    try:
        iterencode = make(
            None,  # no circular-reference check: RecursionError catches cycles
            _no_default,
            json.encoder.encode_basestring,  # ensure_ascii=False
            None,  # no indent
            ref.key_separator,
            ref.item_separator,
            ref.sort_keys,
            ref.skipkeys,
            ref.allow_nan,
        )
    except TypeError:  # a future signature: keep the documented path
        return _REFERENCE_ENCODER.encode

    def encode(value: Any) -> str:
        return "".join(iterencode(value, 0))

    return encode


_ENCODE: Final = _make_encode()
_BODY_EXCLUDE: Final[set[str]] = {"event_id"}


def canonical_text(value: Any) -> str:
    """The canonical JSON text of ``value`` (JSON data: dict with str keys, list, str, int,
    float, bool, None). Raises SchemaError for NaN/Infinity or a non-JSON type.

    Does not check strings for lone surrogates; :func:`canonical_json` does (they fail
    to encode). Values from a validated envelope never contain them.
    """
    try:
        return _ENCODE(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise SchemaError(f"value has no canonical JSON form: {exc}") from exc


def canonical_json(value: Any) -> bytes:
    """The canonical JSON form of ``value`` as UTF-8 bytes."""
    return _utf8(canonical_text(value))


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SchemaError(f"value has no canonical JSON form: {exc.reason}") from exc


def body_hash(body: Mapping[str, Any]) -> bytes:
    """SHA-256 (32 bytes) of the canonical JSON of an envelope body.

    ``body`` is the JSON-mode dump of a validated envelope without ``event_id``
    (:func:`body_dict`); passing one that still has ``event_id`` is a SchemaError.
    """
    if "event_id" in body:
        raise SchemaError("the body to hash must not contain event_id")
    return hashlib.sha256(canonical_json(body)).digest()


def body_dict(env: Envelope) -> dict[str, Any]:
    """The body of ``env``: its JSON-mode dump without ``event_id``."""
    return env.model_dump(mode="json", exclude=_BODY_EXCLUDE)


def _members(obj: Mapping[str, Any]) -> str:
    """The canonical text of ``obj`` without its braces (empty for an empty object)."""
    return canonical_text(obj)[1:-1] if obj else ""


def _text_with_member(obj: dict[str, Any], key: str, value_text: str) -> str:
    """``canonical_text(obj)`` with ``obj[key]`` replaced by the value whose canonical text
    is ``value_text`` (already computed). ``obj`` is modified.

    Fast path: encode ``obj`` with the member set to ``0`` and splice ``value_text`` in
    at the marker ``"key":0``. The member is always in the text, so if the marker occurs
    exactly once, that occurrence is the member. Otherwise (another ``"key":0...`` nested
    somewhere) fall back to joining the members sorted before and after ``key``, which is
    how the canonical text of an object is built.
    """
    marker = f"{canonical_text(key)}:0"
    obj[key] = 0
    text = canonical_text(obj)
    at = text.find(marker)
    if at >= 0 and text.find(marker, at + 1) < 0:
        return f"{text[:at]}{marker[:-1]}{value_text}{text[at + len(marker) :]}"
    del obj[key]
    before = _members({k: v for k, v in obj.items() if k < key})
    after = _members({k: v for k, v in obj.items() if k > key})
    member = f"{canonical_text(key)}:{value_text}"
    return "{" + ",".join(part for part in (before, member, after) if part) + "}"


def canonical_texts(env: Envelope) -> tuple[str, str]:
    """``(payload_text, body_text)``: the canonical JSON of the payload and of the body.

    Encodes the payload once and splices it into the body (see ``_text_with_member``);
    the result equals ``canonical_text(body_dict(env))``.
    """
    body = body_dict(env)
    payload_text = canonical_text(body["payload"])
    return payload_text, _text_with_member(body, "payload", payload_text)


def canonical_body(env: Envelope) -> bytes:
    """The canonical JSON bytes of the body of ``env`` (UTF-8)."""
    return _utf8(canonical_texts(env)[1])


def hash_envelope(env: Envelope) -> bytes:
    """The body hash of ``env``: SHA-256 of :func:`canonical_body` (32 bytes).

    The decoder computes ``Row.body_hash`` through the same :func:`canonical_texts`.
    """
    return hashlib.sha256(canonical_body(env)).digest()
