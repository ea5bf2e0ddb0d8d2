"""Exact copies: a record whose bytes are an event's canonical body with its event_id put in.

Why: a replay decodes, validates and hashes every record only to learn, from the key read,
that the ledger holds it already (half of a replaying worker's CPU). The SDK and the load
generator send each event as its canonical JSON (``schemas/CANONICAL.md``), so the body
whose hash the ledger stores is the record's own bytes without the ``"event_id":"…",``
member. :func:`exact_form` finds that member and the ``txn_id`` with two anchored
regular expressions and hashes the bytes around the member, without parsing the rest.

What it returns proves nothing by itself: its hash is that of whatever bytes came. It is
used only next to the ledger: when the ledger row of ``txn_id`` stores the same hash, the
record's bytes without the member *are* that row's canonical body (SHA-256, the hash the
whole dedup already relies on), and the member is an event_id the decoder accepts
(lower-case hyphenated UUID), so :func:`ackline.schemas.decode.decode` would return a row
with this ``txn_id`` and this ``body_hash``: a layer-1 duplicate, the verdict the key read
gives (the decoder's differential test checks that over its whole corpus:
``tests/support/decode_diff.py``). The stored body was valid when it was stored; so that
today's settings judge it too, a record is not taken as an exact copy when it is over
today's ``max_bytes``, when its brackets alone could nest deeper than today's
``max_depth``, or when its ``type`` and ``schema_version`` name no model this worker knows,
plugins' included (a newer one is held, as decoded). What it does not re-check is a model
whose validation was tightened under the same type and version since the event was
stored: such a copy is a duplicate of the stored event here, where decoding would reject
it (a model that changes what it accepts takes a new ``schema_version``: docs/schema.md).
Anything else is left to the decoder: ``None`` costs nothing but the two matches.

Pure; no I/O.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final, NamedTuple

from ackline.core.tuples import builder
from ackline.schemas.decode import Limits
from ackline.schemas.envelope import ENVELOPES

# The body's first member, then the event_id member the body leaves out, then the body's
# second member: canonical keys are sorted (agent_id < event_id < occurred_at). A canonical
# string holds no unescaped '"' and no raw character below U+0020 (both are escaped with a
# backslash), so a value without '"', '\\' and controls ends at its own quote.
_HEAD: Final = re.compile(
    rb'\{"agent_id":"[^"\\\x00-\x1f]*",'
    rb'("event_id":"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",)'
    rb'"occurred_at":"'
)
# The body's last three members, in sorted order, and its end.
_TAIL: Final = re.compile(
    rb',"schema_version":(0|[1-9][0-9]{0,8}),"txn_id":"([^"\\\x00-\x1f]*)",'
    rb'"type":"([^"\\\x00-\x1f]*)"\}'
)
_TAIL_START: Final = b',"schema_version":'
_known: tuple[int, frozenset[tuple[bytes, bytes]]] = (-1, frozenset())
"""(how many models ENVELOPES held, their (type, schema_version) texts as they are
written), made again once payload plugins have registered more (:func:`_known_texts`)."""


class ExactForm(NamedTuple):
    """What a record claims to be: the ledger key and the hash of its bytes but the event_id."""

    txn_id: str
    body_hash: bytes


_new_form: Final = builder(ExactForm)


def _known_texts() -> frozenset[tuple[bytes, bytes]]:
    """The models this worker knows, plugins' included, as their texts are written."""
    global _known
    if _known[0] != len(ENVELOPES):
        _known = (len(ENVELOPES), frozenset((t.encode(), str(v).encode()) for t, v in ENVELOPES))
    return _known[1]


def event_id_span(value: bytes) -> tuple[int, int] | None:
    """Where the ``"event_id":"…",`` member of a record whose head is in the canonical
    shape starts and ends; None for any other head."""
    head = _HEAD.match(value)
    return None if head is None else head.span(1)


def exact_form(value: bytes | None, limits: Limits) -> ExactForm | None:
    """``value``'s :class:`ExactForm` if it has the canonical shape around its event_id
    (module docstring), else None (decode it)."""
    if not value or len(value) > limits.max_bytes:
        return None
    head = _HEAD.match(value)
    if head is None:
        return None
    at = value.rfind(_TAIL_START)
    if at < head.end():
        return None
    tail = _TAIL.fullmatch(value, at)
    if tail is None or value.count(b"{") + value.count(b"[") > limits.max_depth:
        return None
    if (tail[3], tail[1]) not in _known_texts():
        return None
    try:
        txn_id = tail[2].decode()
    except UnicodeDecodeError:
        return None
    start, end = head.span(1)
    digest = hashlib.sha256(value[:start])
    digest.update(value[end:])
    return _new_form((txn_id, digest.digest()))
