"""Record headers that can neither crash the worker nor fail its batch.

Kafka header keys are any bytes on the wire; both Python clients assume UTF-8 and
PostgreSQL's jsonb and confluent-kafka's producer take less than that:

* confluent-kafka 2.16.1 ``Message.headers()``, for a key that is not UTF-8, leaves a C
  NULL where the key should be and returns with an exception pending: reading that key
  crashes the process (SIGSEGV). :func:`safe_headers` reads such headers safely; the key's
  bytes are lost (None keys).
* aiokafka, made lenient by :mod:`ackline.streams.faust_runtime.headers`, hands such a
  key as a ``str`` with surrogate escapes, which encode back to the exact bytes.
* confluent-kafka's ``produce(headers=...)`` crashes on a ``str`` key holding a surrogate
  and cuts a key at its first NUL; ``json.dumps`` writes a lone surrogate that jsonb
  refuses. :func:`headers_for_produce` and :func:`headers_json` never hand on such a key.

Pure but for :func:`safe_headers`, which reads a message (CPython only: it inspects a
tuple's slots with ctypes without touching what they point to).
"""

from __future__ import annotations

import base64
import ctypes
import logging
import operator
import time
from typing import Any

from confluent_kafka import Message

log = logging.getLogger(__name__)

Headers = list[tuple[str | None, str | bytes | None]]
"""A record's headers as the Kafka clients hand them: (key, value) pairs.

A key is None when the client discarded its bytes (confluent-kafka, for a key that is not
UTF-8: see :func:`safe_headers`). A ``str`` key may hold surrogate escapes (aiokafka made
lenient by :mod:`ackline.streams.faust_runtime.headers`): ``key.encode("utf-8",
"surrogateescape")`` gives its bytes on the wire."""

LOST_KEY = "ackline.raw-header-key.unknown"
"""Dead-letter header name for an original key whose bytes the client discarded."""
BAD_KEY_PREFIX = "ackline.raw-header-key.b64."
"""Dead-letter header name for an original key that is not clean UTF-8 text: this prefix
and the URL-safe base64 of the key's bytes; the header's value is the original value."""
UNDECODABLE_MARK = "ackline.headers-undecodable"
"""Dead-letter header (value: how many) added when an original key was not clean text."""

_call_headers = operator.methodcaller("headers")
"""``msg.headers()`` through ``PyObject_Call``, which always checks for a pending exception.
A plain ``msg.headers()`` call site is specialized by CPython 3.11 after a few runs, which
skips that check: the call then returns and the UnicodeDecodeError surfaces later, at an
unrelated line."""

_TUPLE_ITEMS = tuple.__basicsize__  # offsetof(PyTupleObject, ob_item)

_LOST_KEYS: list[float] = [-1e9, 0]
"""[monotonic time of the last lost-key WARNING, records with lost keys since]."""

HEADER_OVERHEAD = 160
"""What each header counts against ``batch_max_bytes`` besides its key and value: the
Python objects confluent-kafka builds for it (its tuple, the key's ``str``, the value's
``bytes``, the list's slot). By tracemalloc, 141 bytes past the key's and the value's
lengths for any value of two bytes or more (Python 3.11), plus the allocator's rounding:
so a record of a million empty headers (2 bytes each on the wire) is not counted as
nothing. It was 64: a review held 75 MB of small headers against 33.5 MB counted."""


def _slot_is_null(pair: tuple[Any, ...], index: int) -> bool:
    """True when slot ``index`` of ``pair`` holds a C NULL, read without touching it
    (CPython only: the tuple's items follow its header)."""
    address = id(pair) + _TUPLE_ITEMS + index * ctypes.sizeof(ctypes.c_void_p)
    return ctypes.c_void_p.from_address(address).value is None


def safe_headers(msg: Message) -> Headers:
    """The headers of a consumed confluent-kafka record; never raises, never crashes.

    confluent-kafka (2.16.1, ``c_headers_to_py``) does not check the conversion of a
    header key to ``str``: for a key that is not UTF-8 (a Go client or ``kcat -H`` can
    send one) ``msg.headers()`` stores a C NULL as the key, caches that list on the
    message and returns with a UnicodeDecodeError pending. Reading that key crashes the
    process (SIGSEGV), and the key's bytes are freed: they cannot be recovered. So the
    call goes through :data:`_call_headers` (which raises SystemError at once), the
    cached list is read around the NULL slots, which come back as None keys, and the
    message's headers are replaced with a clean list so no later call can crash.
    """
    try:
        raw = _call_headers(msg)
    except SystemError as exc:
        # every record's headers are read (the byte bound counts them): at most one
        # WARNING a minute, with how many came since, not one per record
        now = time.monotonic()
        _LOST_KEYS[1] += 1
        if now - _LOST_KEYS[0] >= 60.0:
            log.warning(
                "%s[%s]@%s: a header key is not UTF-8 (%r); its bytes are lost, the values "
                "kept (%d record(s) with such keys since the last such warning)",
                msg.topic(),
                msg.partition(),
                msg.offset(),
                exc.__cause__ or exc,
                _LOST_KEYS[1],
            )
            _LOST_KEYS[:] = [now, 0]
        out: Headers = []
        for pair in _call_headers(msg):
            out.append((None if _slot_is_null(pair, 0) else pair[0], pair[1]))
        msg.set_headers([(LOST_KEY if k is None else k, v) for k, v in out])
        return out
    if raw is None:
        return []
    if type(raw) is list:  # the message's own list (read on every record: no copy)
        return raw
    return list(raw.items()) if isinstance(raw, dict) else list(raw)


def headers_size(headers: Headers) -> int:
    """What ``headers`` count against ``batch_max_bytes``: each key's length and each
    value's (a ``str`` counted by characters, near enough for a bound), and
    :data:`HEADER_OVERHEAD` each. Pure."""
    n = HEADER_OVERHEAD * len(headers)
    for key, value in headers:
        n += len(key or "") + len(value or b"")
    return n


def _key_bytes(key: str | None) -> bytes | None:
    return None if key is None else key.encode("utf-8", "surrogateescape")


def _value_bytes(value: str | bytes | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return value.encode("utf-8", "surrogateescape")


def _text(raw: bytes | None) -> str | None:
    """``raw`` as text when it is UTF-8 without NUL (what jsonb and a confluent-kafka
    header key can hold), else None."""
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


def headers_json(headers: Headers) -> list[dict[str, str | None]]:
    """Headers as JSON-safe (and PostgreSQL-jsonb-safe) dicts, one per header, in order.

    ``key``: the key when it is clean text, else None, and then ``key_b64`` holds its
    bytes (None when the client discarded them: ``key_lost`` is "true"). ``value``: the
    value when it is clean text; ``b64``: the value's bytes (None: a null value). Pure.
    """
    out: list[dict[str, str | None]] = []
    for key, value in headers:
        raw_key, raw = _key_bytes(key), _value_bytes(value)
        entry: dict[str, str | None] = {"key": _text(raw_key)}
        if entry["key"] is None:
            entry["key_b64"] = None if raw_key is None else base64.b64encode(raw_key).decode()
            entry["key_lost"] = "true" if raw_key is None else None
        entry["value"] = _text(raw)
        entry["b64"] = None if raw is None else base64.b64encode(raw).decode()
        out.append(entry)
    return out


def headers_for_produce(headers: Headers) -> list[tuple[str, bytes | None]]:
    """Headers a confluent-kafka producer takes without crashing or altering them.

    Clean text keys pass unchanged. confluent-kafka would crash on a key holding a
    surrogate and cut one at its first NUL, so any other key becomes
    :data:`BAD_KEY_PREFIX` + base64url(key) (or :data:`LOST_KEY`) with the original
    value, and :data:`UNDECODABLE_MARK` gives how many. Pure.
    """
    out: list[tuple[str, bytes | None]] = []
    bad = 0
    for key, value in headers:
        raw_key = _key_bytes(key)
        text = _text(raw_key)
        if text is None:
            bad += 1
            text = (
                LOST_KEY
                if raw_key is None
                else BAD_KEY_PREFIX + base64.urlsafe_b64encode(raw_key).decode("ascii")
            )
        out.append((text, _value_bytes(value)))
    if bad:
        out.append((UNDECODABLE_MARK, str(bad).encode()))
    return out
