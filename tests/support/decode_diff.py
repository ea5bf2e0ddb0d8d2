"""Differential test of the decoder: the fast path against the reference, input for input.

``ackline.schemas.decode.decode`` (the fast path in front of the reference) must return
exactly what ``reference_decode`` returns: for a Row every field (event_id as a UUID,
occurred_at by ``repr`` so its tzinfo must match too, payload_json, body_json,
body_hash); for a Rejection its reason, detail and ``newer``. Any difference is a
mismatch; the run fails on one.

Sources, scaled by ``scale`` (1.0: about 1.1 million inputs):

* ``realistic``: every record value of ``load.generate`` (six seeds, 50,000 events each,
  poison and aborted copies included): what a worker decodes;
* ``poison``: ``load.generate.make_poison`` of every kind, on realistic envelopes;
* ``mut:*``: valid events mutated (tests/support/jsontree.py): restyled (key order,
  whitespace, escapes), a duplicate key at any depth, odd number literals, odd strings,
  raw escapes (surrogates, NUL, escaped colons), odd field values (UUID and timestamp
  forms, ids at the length limits, type and version), deep nesting, damaged bytes;
* ``random_args``: random JSON as ``tool.called`` arguments;
* ``limits``: other ``max_depth`` and ``max_bytes`` (boundaries included);
* ``bytes``: random bytes, ``None`` and ``b""``;
* ``hypothesis``: hypothesis-drawn JSON trees (duplicate keys, any code point, number
  literals from a regex) put into real envelopes.

The same run checks exact copies (``ackline.schemas.exact``), which let a replaying worker
skip the decoder for a record whose bytes, but for the event_id member, hash to what the
ledger stores: for every input that :func:`~ackline.schemas.exact.exact_form` accepts,
whenever the bytes around its event_id member are the canonical body of a record the
decoder accepts (so a ledger could store that hash), the decoder must accept the input
itself with that ``txn_id`` and ``body_hash`` (:meth:`Differential.check_exact`). Each
accepted input's own canonical record is checked the same way, with valid and invalid
event ids put in and, for some, under tighter limits.

Run it whole with ``make decode-diff`` (``python -m tests.support.decode_diff``);
``tests/unit/test_decode_differential.py`` runs a small sample in ``make test``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import math
import random
import string
import struct
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ackline.core.progress import Progress
from ackline.core.tuples import builder
from ackline.load.generate import POISON_KINDS, Knobs, generate, make_poison
from ackline.schemas import exact
from ackline.schemas.decode import (
    DEFAULT_LIMITS,
    Limits,
    Rejection,
    Row,
    decode,
    reference_decode,
)
from ackline.schemas.decode_fast import make_fast_decoder
from ackline.schemas.envelope import Envelope
from ackline.schemas.numbers import exact_float
from tests.support import jsontree as jt

Decoder = Callable[[bytes | None, Limits], Row | Rejection]
FastFactory = Callable[[Decoder], Decoder]
"""Builds the fast decoder under test over a (counting) slow path."""


def default_fast(slow: Decoder) -> Decoder:
    """The fast decoder exactly as ``ackline.schemas.decode`` builds it."""
    return make_fast_decoder(slow, builder(Row), exact_float)


def norm(result: Row | Rejection) -> tuple[Any, ...]:
    if isinstance(result, Rejection):
        return ("rej", result.reason, result.detail, result.newer)
    fields = tuple(result)
    return ("row", type(result.event_id), *fields[:5], repr(result.occurred_at), *fields[6:])


# --- input sources ---------------------------------------------------------------------------

ODD_NUMBERS = [
    "0", "-0", "1", "-1", "9223372036854775807", "9223372036854775808",
    "-9223372036854775808", "-9223372036854775809", "18446744073709551615",
    "18446744073709551616", "123456789012345678901234567890", "1" + "0" * 4299,
    "1" + "0" * 4300, "0.0", "-0.0", "0e0", "-0e0", "0E-400", "1e2", "1E2", "1e+2", "1.0E2",
    "100.0", "100.00", "1e5", "1e16", "1e15", "1e-4", "1e-5", "1e-7", "1.0e-7", "1e-07",
    "1E-7", "1e300", "1e308", "1.7976931348623157e308", "1.7976931348623158e308",
    "1.7976931348623159e308", "1e400", "-1e400", "1e-400", "-1e-400", "5e-324", "2.5e-324",
    "2.4703282292062328e-324", "2.4703282292062327e-324", "0.1", "0.10000000000000001",
    "0.1000000000000000055511151231257827021181583404541015625", "12345678901234567890.5",
    "12345678901234567000.0", "9007199254740993.0", "9007199254740993", "1.5",
    "-1.5e-10", "3.14159", "0.30000000000000004", "0.3", "NaN", "Infinity", "-Infinity",
    "01", "1.", ".5", "+1", "1e", "--1", "0x10", "1_000", "2e-1", "20e-2", "0.000001",
    "1e-6", "123e-2", "1.23", "4.35", "4.3500000000000001", "1e22", "1e23",
    "1.0000000000000001e23", "9.999999999999999e22", "1e-99999999999999999999",
    "0e-99999999999999999999", "1e99999999999999999999", "-0.000e-99999999999999999999",
]  # fmt: skip

TIMESTAMPS = [
    "2024-05-01T12:00:00Z", "2024-05-01T12:00:00+00:00", "2024-05-01T14:00:00+02:00",
    "2024-05-01T12:00:00.000000Z", "2024-05-01T12:00:00.1234567Z", "2024-05-01 12:00:00Z",
    "2024-05-01T12:00:00", "2024-05-01", "2024-05-01T12:00:00z", "2024-05-01T12:00:00,5Z",
    "2024-05-01T12:00:00.123Z", "20240501T120000Z", "0001-01-01T00:00:00.000000Z",
    "0001-01-01T00:30:00+01:00", "9999-12-31T23:59:59.999999Z", "9999-12-31T23:00:00-01:00",
    "2024-02-30T00:00:00.000000Z", "2024-05-01T24:00:00.000000Z", "2024-05-01T23:59:60.000000Z",
    "2024-05-01T12:00:00.123456+05:30", "2024-05-01T12:00:00.123456-00:00",
    "2024-W18-3T12:00:00Z", "\uff12\uff10\uff12\uff14-05-01T12:00:00Z",  # full-width digits
    "2024-05-01T12:00:00.123456Z ",
    "2024-05-01T12:00:00.123456+0100", "2024-05-01T12:00:00.123456+01", "",
]  # fmt: skip


def uuid_forms(u: uuid.UUID) -> list[Any]:
    h = u.hex
    return [
        str(u), str(u).upper(), h, "{" + str(u) + "}", "urn:uuid:" + str(u), " " + str(u),
        str(u)[:-1], str(u) + "0", "+" + str(u)[1:], str(u).replace("-", "_"),
        h[:8] + "-" + h[8:], 12, None, str(u)[:8] + "-" + h[8:12] + h[12:16] + "-" + h[16:],
        "00000000-0000-0000-0000-000000000000", str(u).replace("a", "\u0430"),
    ]  # fmt: skip


def odd_strings(rng: random.Random) -> list[str]:
    return [
        "", "a", "x" * 200, "x" * 201, "😀" * 200, "😀" * 201, "é" * 201, "e\u0301" * 100,
        "a:b", 'a":b', "a\\", "\u2028", "\x7f", "\x00", "\ud800", "a\udc00", "\ufeff",
        "\\u0000", "\\u003a", ":" * 5, "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(8)),
    ]  # fmt: skip


def random_double(rng: random.Random) -> float:
    while True:
        value: float = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(value):
            return value


def random_number(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.3:
        return rng.choice(ODD_NUMBERS)
    if roll < 0.45:
        return repr(rng.uniform(-1e6, 1e6))
    if roll < 0.55:
        return repr(random_double(rng))
    if roll < 0.6:
        return f"{random_double(rng):.17g}"  # a C producer: often not the shortest
    if roll < 0.8:
        digits = "".join(rng.choice(string.digits) for _ in range(rng.randint(1, 25)))
        digits = digits.lstrip("0") or "0"
        frac = "".join(rng.choice(string.digits) for _ in range(rng.randint(1, 22)))
        exp = rng.choice(["", f"e{rng.randint(-330, 330)}", f"E+{rng.randint(0, 30)}"])
        return f"{rng.choice(['', '-'])}{digits}.{frac}{exp}"
    return str(rng.randint(-(2**70), 2**70))


def random_text(rng: random.Random, n: int) -> str:
    pools = [
        string.ascii_letters + string.digits + ' :/-_.,"\\{}[]',
        "".join(chr(c) for c in range(0x80)),
        "éßü€😀中文\u2028\u0301\ufeff\U0010ffff",
    ]
    pool = rng.choice(pools)
    return "".join(rng.choice(pool) for _ in range(n))


def random_json(rng: random.Random, depth: int = 0) -> jt.Node:
    roll = rng.random()
    if depth < 4 and roll < 0.25:
        obj = jt.Obj()
        for _ in range(rng.randint(0, 4)):
            key = random_text(rng, rng.randint(0, 5))
            obj.append((key, random_json(rng, depth + 1)))
        if obj and rng.random() < 0.05:
            obj.append((rng.choice(obj)[0], random_json(rng, depth + 1)))  # duplicate
        return obj
    if depth < 4 and roll < 0.4:
        return jt.Arr(random_json(rng, depth + 1) for _ in range(rng.randint(0, 4)))
    if roll < 0.6:
        return jt.Num(random_number(rng))
    if roll < 0.85:
        return random_text(rng, rng.randint(0, 12))
    return rng.choice([True, False, None])


def random_style(rng: random.Random) -> jt.Style:
    if rng.random() < 0.5:
        return jt.Style(rng=rng)
    return jt.Style(
        item_sep=rng.choice([",", ", ", " ,", ",\n", ",\t"]),
        key_sep=rng.choice([":", ": ", " : ", ":\r\n"]),
        indent=rng.choice([None, None, "  ", "\t"]),
        ws=rng.choice(["", " ", "\n", "\r\n\t "]),
        escape_rate=rng.choice([0.0, 0.0, 0.02, 0.3, 1.0]),
        ascii_only=rng.random() < 0.3,
        upper_hex=rng.random() < 0.5,
        slash=rng.random() < 0.2,
        rng=rng,
    )


def shuffled(node: jt.Node, rng: random.Random) -> jt.Node:
    if isinstance(node, jt.Obj):
        items = [(k, shuffled(v, rng)) for k, v in node]
        rng.shuffle(items)
        return jt.Obj(items)
    if isinstance(node, list):
        return jt.Arr(shuffled(v, rng) for v in node)
    return node


def nest(rng: random.Random, inner: jt.Node, levels: int) -> jt.Node:
    """``levels`` nested arrays/objects around ``inner``, pre-written as text (a tree
    that deep would exhaust the writer's recursion)."""
    opens, closes = [], []
    for _ in range(levels):
        if rng.random() < 0.5:
            opens.append("[")
            closes.append("]")
        else:
            opens.append('{"k":')
            closes.append("}")
    return jt.Raw("".join(opens) + jt.write(inner) + "".join(reversed(closes)))


# --- mutations of a valid event --------------------------------------------------------------


def _payload(tree: jt.Obj) -> jt.Obj | None:
    try:
        payload = jt.member(tree, "payload")
    except KeyError:
        return None
    return payload if isinstance(payload, jt.Obj) else None


def _arguments(payload: jt.Obj | None) -> jt.Obj | None:
    if payload is None:
        return None
    try:
        arguments = jt.member(payload, "arguments")
    except KeyError:
        return None
    return arguments if isinstance(arguments, jt.Obj) else None


def m_restyle(rng: random.Random, tree: jt.Obj) -> str:
    return jt.write(shuffled(tree, rng) if rng.random() < 0.7 else tree, random_style(rng))


def m_duplicate(rng: random.Random, tree: jt.Obj) -> str:
    objs = [node for _, node in jt.containers(tree) if isinstance(node, jt.Obj) and node]
    target = rng.choice(objs)
    key, value = rng.choice(target)
    how = rng.random()
    if how < 0.4:
        new = value  # same key, same value
    elif how < 0.7:
        new = random_json(rng)
    else:
        new = jt.copy(value)
    target.insert(rng.randrange(len(target) + 1), (key, new))
    style = random_style(rng)
    if rng.random() < 0.3:
        style.escape_rate = 0.5  # "a" and "\\u0061": the same key, spelt differently
    return jt.write(tree, style)


def m_number(rng: random.Random, tree: jt.Obj) -> str:
    payload = _payload(tree)
    roll = rng.random()
    literal = jt.Num(random_number(rng))
    arguments = _arguments(payload)
    if arguments is not None and roll < 0.5:
        arguments.insert(rng.randrange(len(arguments) + 1), (random_text(rng, 3), literal))
        return jt.write(tree, random_style(rng))
    spots = [(c, i) for c, i in jt.scalars(tree) if isinstance(jt.get(c, i), jt.Num)]
    container, index = rng.choice(spots if spots and roll < 0.8 else jt.scalars(tree))
    jt.put(container, index, literal)
    return jt.write(tree, random_style(rng))


def m_string(rng: random.Random, tree: jt.Obj) -> str:
    spots = [(c, i) for c, i in jt.scalars(tree) if isinstance(jt.get(c, i), str)]
    container, index = rng.choice(spots)
    old = jt.get(container, index)
    new = rng.choice(odd_strings(rng))
    if rng.random() < 0.4:
        at = rng.randrange(len(old) + 1)
        new = old[:at] + new + old[at:]
    jt.put(container, index, new)
    if rng.random() < 0.2:  # the same in a key
        objs = [node for _, node in jt.containers(tree) if isinstance(node, jt.Obj) and node]
        target = rng.choice(objs)
        i = rng.randrange(len(target))
        target[i] = (target[i][0] + rng.choice(odd_strings(rng)), target[i][1])
    return jt.write(tree, random_style(rng))


def m_escape_text(rng: random.Random, tree: jt.Obj) -> str:
    """Raw-text escapes the tree writer does not make: lone/reversed surrogates, NUL."""
    text = jt.write(tree, random_style(rng))
    spots = [i for i, ch in enumerate(text) if ch == '"']
    if len(spots) < 2:
        return text
    at = rng.choice(spots[1:]) if rng.random() < 0.9 else spots[0] + 1
    insert = rng.choice(
        [
            "\\ud800", "\\udfff", "\\uDC00\\uD800", "\\ud83d\\ude00", "\\uD83D\\uDE00",
            "\\u0000", "\\\\u0000", "\\u003a", "\\u003A", "\\\\u003a", '\\":', "\\ud800\\u0041",
            "\\u00e9", "\\u", "\\uZZZZ", "\\x41", "\\'", "\\U0001F600", "\\/",
        ]
    )  # fmt: skip
    return text[:at] + insert + text[at:]


def m_field(rng: random.Random, tree: jt.Obj) -> str:
    """Change one envelope or payload field to an odd but type-plausible value."""
    roll = rng.random()
    payload = _payload(tree)
    if roll < 0.2:
        event_id = jt.member(tree, "event_id")
        u = uuid.UUID(event_id) if isinstance(event_id, str) else uuid.uuid4()
        jt.set_member(tree, "event_id", jt.from_python(rng.choice(uuid_forms(u))))
    elif roll < 0.4:
        jt.set_member(tree, "occurred_at", rng.choice(TIMESTAMPS))
    elif roll < 0.5:
        jt.set_member(
            tree,
            rng.choice(["txn_id", "agent_id", "request_id"]),
            rng.choice([*odd_strings(rng), jt.Num("5"), None, True, jt.Arr()]),
        )
    elif roll < 0.6:
        jt.set_member(
            tree,
            "schema_version",
            rng.choice([jt.Num("1"), jt.Num("2"), jt.Num("0"), jt.Num("1.0"), jt.Num("-1"),
                        jt.Num(str(2**70)), jt.Num("1e0"), "1", True, None]),
        )  # fmt: skip
    elif roll < 0.7:
        jt.set_member(
            tree,
            "type",
            rng.choice(["agent.paused", "AGENT.STARTED", "", "x" * 300, "tool.called",
                        "agent.started", "agent.step", "message.posted", jt.Num("7"), None]),
        )  # fmt: skip
    elif roll < 0.8 and payload:
        key, _ = rng.choice(payload)
        jt.set_member(
            payload,
            key,
            rng.choice(
                [jt.Num("0"), jt.Num("-1"), jt.Num("9223372036854775807"),
                 jt.Num("9223372036854775808"), jt.Num("5.0"), jt.Num("1e2"), jt.Num("10"),
                 jt.Num("9"), True, False, None, "user", "assistant", "tool", "robot", "",
                 "x" * 200, "x" * 201, jt.Arr(), jt.Arr(["a"]), jt.Arr([""]), jt.Obj(),
                 jt.Obj([("a", jt.Num("1"))])]
            ),
        )  # fmt: skip
    elif roll < 0.9:
        target = payload if payload is not None and rng.random() < 0.5 else tree
        if target and rng.random() < 0.5:
            del target[rng.randrange(len(target))]
        else:
            target.append((rng.choice(["extra", "event_id", "kafka_offset", "Type"]), "x"))
    else:
        jt.set_member(
            tree,
            "payload",
            rng.choice([None, jt.Arr(), "x", jt.Obj(), jt.Num("1"), random_json(rng)]),
        )
    return jt.write(tree, random_style(rng))


DEEP_LEVELS = [
    1, 5, 20, 27, 28, 29, 30, 31, 40, 58, 59, 60, 61, 62, 63, 64, 200, 251, 252, 253, 254, 255,
    256, 300, 507, 508, 509, 510, 511, 600, 1100,
]  # fmt: skip


def m_deep(rng: random.Random, tree: jt.Obj) -> str:
    """Nest containers: mostly inside tool.called arguments (a valid event, rejected only
    for its depth), else in an extra payload or envelope member."""
    payload = _payload(tree)
    inner = nest(rng, jt.Num("1"), rng.choice(DEEP_LEVELS))
    arguments = _arguments(payload)
    roll = rng.random()
    if arguments is not None and roll < 0.8:
        arguments.append(("deep", inner))
    elif payload is not None and roll < 0.9:
        payload.append(("deep", inner))
    else:
        tree.append(("deep", inner))
    return jt.write(tree, random_style(rng))


def m_bytes(rng: random.Random, raw: bytes) -> bytes:
    """Byte-level damage: non-UTF-8, truncation, trailing data, BOM, control bytes."""
    roll = rng.random()
    data = bytearray(raw)
    if roll < 0.25:
        bad = rng.choice(
            [b"\xff", b"\xc3", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80",
             b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3\xa9", b"\xef\xbb\xbf", b"\x00", b"\x7f"]
        )  # fmt: skip
        at = rng.randrange(len(data) + 1)
        return bytes(data[:at]) + bad + bytes(data[at:])
    if roll < 0.5:
        return bytes(data[: rng.randrange(len(data))])
    if roll < 0.6:
        return raw + rng.choice([b" ", b"\n", b"x", b"{}", raw, b"\x00", b"\x0b", b"\xc2\xa0"])
    if roll < 0.7:
        return rng.choice([b"\xef\xbb\xbf", b"\x0b", b"\xc2\xa0", b" "]) + raw
    if roll < 0.8:
        return raw.decode("utf-8").encode(rng.choice(["latin-1", "utf-16", "utf-8-sig"]), "replace")
    data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


TREE_MUTATIONS: list[tuple[str, Callable[[random.Random, jt.Obj], str], float]] = [
    ("restyle", m_restyle, 3.0),
    ("duplicate", m_duplicate, 2.0),
    ("number", m_number, 3.0),
    ("string", m_string, 2.0),
    ("escape_text", m_escape_text, 1.5),
    ("field", m_field, 3.0),
    ("deep", m_deep, 1.0),
]


def mutated(rng: random.Random, values: list[bytes], count: int) -> Iterator[tuple[str, bytes]]:
    names = [m[0] for m in TREE_MUTATIONS] + ["bytes"]
    weights = [m[2] for m in TREE_MUTATIONS] + [1.5]
    funcs = {name: fn for name, fn, _ in TREE_MUTATIONS}
    for _ in range(count):
        raw = rng.choice(values)
        name = rng.choices(names, weights)[0]
        if name == "bytes":
            yield "mut:bytes", m_bytes(rng, raw)
            continue
        text = funcs[name](rng, jt.load(raw))
        if rng.random() < 0.15:  # a second mutation on top
            try:
                again = jt.load(text)
            except (ValueError, RecursionError):
                again = None
            if isinstance(again, jt.Obj) and again:
                _, other, _ = rng.choice(TREE_MUTATIONS)
                # (it may need what the first mutation removed)
                with contextlib.suppress(KeyError, ValueError, IndexError, TypeError):
                    text = other(rng, again)
        yield f"mut:{name}", text.encode("utf-8", "surrogatepass")


def random_envelopes(rng: random.Random, values: list[bytes], count: int) -> Iterator[bytes]:
    """Valid envelopes whose arguments are random JSON."""
    called = [v for v in values if b'"type":"tool.called"' in v]
    for _ in range(count):
        tree = jt.load(rng.choice(called))
        payload = _payload(tree)
        assert payload is not None
        args = random_json(rng)
        if not isinstance(args, jt.Obj) and rng.random() < 0.8:
            args = jt.Obj([("v", args)])
        jt.set_member(payload, "arguments", args)
        yield jt.write(tree, random_style(rng)).encode("utf-8", "surrogatepass")


def random_bytes(rng: random.Random, count: int) -> Iterator[bytes]:
    alphabet = b'{}[]":,0123456789.eE+-truefalsnul \\abc\n\t\x00\xff\xc3\xa9'
    for _ in range(count):
        n = rng.randint(0, 60)
        if rng.random() < 0.5:
            yield bytes(rng.randrange(256) for _ in range(n))
        else:
            yield bytes(rng.choice(alphabet) for _ in range(n))


def poison(rng: random.Random, values: list[bytes], count: int) -> Iterator[bytes]:
    """The load generator's poison of every kind (oversize kept rare: 1 MiB each)."""
    envelopes = [Envelope.model_validate(json.loads(v)) for v in values[:500]]
    kinds = [k for k in POISON_KINDS if k != "too_large"]
    knobs = Knobs()
    for _ in range(count):
        kind = "too_large" if rng.random() < 0.01 else rng.choice(kinds)
        yield make_poison(kind, rng, rng.choice(envelopes), knobs)


def hypothesis_inputs(values: list[bytes], count: int, seed: int) -> list[bytes]:
    """Documents drawn by hypothesis: JSON trees with duplicate keys, any code point
    (NUL, lone surrogates), number literals from a regex, put into real envelopes."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    literal = st.from_regex(r"\A-?(0|[1-9][0-9]{0,30})(\.[0-9]{1,25})?([eE][-+]?[0-9]{1,3})?\Z")
    text = st.text(st.characters(codec=None), max_size=12)
    scalar = (
        st.none()
        | st.booleans()
        | literal.map(jt.Num)
        | text
        | st.sampled_from(ODD_NUMBERS).map(jt.Num)
    )
    tree = st.recursive(
        scalar,
        lambda inner: (
            st.lists(inner, max_size=4).map(jt.Arr)
            | st.lists(st.tuples(text, inner), max_size=4).map(jt.Obj)
        ),
        max_leaves=12,
    )
    bases = [jt.load(v) for v in values[:2000]]
    out: list[bytes] = []

    @hypothesis_seed(seed)
    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )
    @given(
        base=st.integers(0, len(bases) - 1),
        where=st.sampled_from(["arguments", "payload_field", "top_field", "whole"]),
        key=st.sampled_from(
            ["arguments", "run_id", "txn_id", "occurred_at", "event_id", "step", "x", "type"]
        ),
        value=tree,
        escape=st.sampled_from([0.0, 0.0, 0.3, 1.0]),
        ascii_only=st.booleans(),
    )
    def draw(
        base: int, where: str, key: str, value: jt.Node, escape: float, ascii_only: bool
    ) -> None:
        doc = jt.copy(bases[base])
        payload = _payload(doc)
        if where == "whole":
            doc = value
        elif where == "arguments" and payload is not None:
            jt.set_member(payload, "arguments", value)
        elif where == "payload_field" and payload is not None:
            jt.set_member(payload, key, value)
        else:
            jt.set_member(doc, key, value)
        style = jt.Style(escape_rate=escape, ascii_only=ascii_only, rng=random.Random(base))
        out.append(jt.write(doc, style).encode("utf-8", "surrogatepass"))

    draw()
    return out


# --- the run ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Tally:
    inputs: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    fast_hits: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    outcomes: collections.Counter[tuple[str, str]] = dataclasses.field(
        default_factory=collections.Counter
    )
    mismatches: list[tuple[str, bytes, Any, Any]] = dataclasses.field(default_factory=list)
    exact_checked: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    """Inputs per source whose exact form was judged against a body the decoder accepts."""

    @property
    def total(self) -> int:
        return sum(self.inputs.values())


class Differential:
    """Decodes each input with the reference and with the fast decoder under test."""

    def __init__(self, fast: FastFactory = default_fast) -> None:
        self.slow_calls = 0
        self.fast = fast(self._counted)
        self.public = fast is default_fast  # then also check decode() itself
        self.tally = Tally()

    def _counted(self, value: bytes | None, limits: Limits) -> Row | Rejection:
        self.slow_calls += 1
        return reference_decode(value, limits)

    def check(self, source: str, value: bytes | None, limits: Limits = DEFAULT_LIMITS) -> None:
        tally = self.tally
        before = self.slow_calls
        want = norm(reference_decode(value, limits))
        got = norm(self.fast(value, limits))
        tally.inputs[source] += 1
        if self.slow_calls == before:
            tally.fast_hits[source] += 1
        tally.outcomes[(source, want[1] if want[0] == "rej" else "row")] += 1
        if got != want:
            tally.mismatches.append((source, value or b"", want, got))
        elif self.public and (public := norm(decode(value, limits))) != want:
            tally.mismatches.append((source, value or b"", want, public))
        self.check_exact(source, value, limits)

    def check_exact(self, source: str, value: bytes | None, limits: Limits) -> None:
        """An exact form may stand for the decoder only where a ledger could vouch for it.

        If ``value``'s bytes without its event_id member (``body``) are the canonical body
        of a record the decoder accepts under any limits (a worker of another day's
        settings may have stored it: that record, with a known-good id put in its place,
        decodes to exactly ``body``; the choice of a valid id changes nothing),
        then the decoder must accept ``value`` itself with the exact form's txn_id and
        hash. Where ``body`` is no accepted body, no ledger stores its hash (SHA-256), and
        the exact form is never taken. For an accepted ``value``, its own canonical record
        is checked too (:func:`canonical_records`)."""
        made = canonical_records(value, limits)
        for n, (record, record_limits) in enumerate([(value, limits), *made]):
            form = exact.exact_form(record, record_limits)
            span = exact.event_id_span(record) if record else None
            if form is None or record is None or span is None:
                continue
            start, end = span
            body = record[:start] + record[end:]
            known = record[:start] + _GOOD_ID + record[end:]
            vouched = decode(known, _ANY_LIMITS)
            if not isinstance(vouched, Row) or vouched.body_json.encode() != body:
                if n > 0:  # a stored body, by construction: canonical text must be a fixed point
                    self.tally.mismatches.append(
                        (f"exact-idempotence:{source}", record, ("row", body), norm(vouched))
                    )
                continue
            self.tally.exact_checked[source] += 1
            got = decode(record, record_limits)
            if not (
                isinstance(got, Row)
                and (got.txn_id, got.body_hash) == (form.txn_id, form.body_hash)
            ):
                self.tally.mismatches.append(
                    (f"exact:{source}", record, ("exact", *form), norm(got))
                )


# Limits no stored body can have been past (MAX_SUPPORTED_DEPTH would not do: a worker
# set deeper decodes a few levels more before pydantic's own cap).
_ANY_LIMITS = Limits(max_bytes=1 << 30, max_depth=1 << 16)
_GOOD_ID = b'"event_id":"00000000-0000-4000-8000-000000000000",'
_EXACT_IDS = (
    "0190c6a2-7b1e-7c3d-9e4f-a5b6c7d8e9f0",  # valid
    "ffffffff-ffff-ffff-ffff-ffffffffffff",  # valid
    "0190C6A2-7B1E-7C3D-9E4F-A5B6C7D8E9F0",  # valid for the decoder; not an exact form
    "0190c6a2-7b1e-7c3d-9e4f-a5b6c7d8e9fg",  # not a UUID
    "0190c6a2-7b1e-7c3d-9e4f-a5b6c7d8e9f",  # too short
)


def canonical_records(value: bytes | None, limits: Limits) -> list[tuple[bytes, Limits]]:
    """What an SDK sends for the event ``value`` decodes to (its canonical body with an
    event_id member put in, one of :data:`_EXACT_IDS` chosen by the value's bytes), under
    ``limits`` and, for one value in four, under limits just too tight for it; [] for a
    value the decoder rejects."""
    row = decode(value, limits) if value else None
    if not isinstance(row, Row) or value is None:
        return []
    prefix = '{"agent_id":' + json.dumps(row.agent_id, ensure_ascii=False) + ","
    if not row.body_json.startswith(prefix):
        return []
    pick = value[len(value) // 2] if value else 0
    member = f'"event_id":"{_EXACT_IDS[pick % len(_EXACT_IDS)]}",'
    text = prefix + member + row.body_json[len(prefix) :]
    record = text.encode("utf-8", "surrogatepass")
    out = [(record, limits)]
    if pick % 4 == 0:
        depth = record.count(b"{") + record.count(b"[")
        out.append((record, Limits(max_bytes=max(1, len(record) - 1), max_depth=limits.max_depth)))
        out.append((record, Limits(max_bytes=limits.max_bytes, max_depth=max(1, depth - 1))))
        out.append((record, Limits(max_bytes=limits.max_bytes, max_depth=2)))
    return out


def planned(scale: float) -> dict[str, int]:
    """Inputs per source at ``scale`` (realistic: events per seed, about 1.07 values each)."""
    return {
        "realistic": int(50_000 * scale),
        "poison": int(20_000 * scale),
        "mutations": int(560_000 * scale),
        "random_args": int(100_000 * scale),
        "limits": int(20_000 * scale),
        "bytes": int(20_000 * scale),
        "hypothesis": max(1, int(50_000 * scale)),
    }


SEEDS = (1, 2, 3, 4, 5, 6)


def run(
    scale: float = 1.0,
    seed: int = 7,
    fast: FastFactory = default_fast,
    progress: Progress | None = None,
) -> Tally:
    """Run every source at ``scale`` through a :class:`Differential`; return its tally."""
    diff = Differential(fast)
    check = diff.check
    rng = random.Random(seed)
    plan = planned(scale)

    def advance() -> None:
        if progress is not None:
            progress.update(diff.tally.total)

    pool: list[bytes] = []
    for s in SEEDS:
        for send in generate(plan["realistic"], seed=s):
            check("realistic", send.value)
            if send.poison_reason is None and len(send.value) < 5000:
                pool.append(send.value)
        advance()
    valid = [v for v in pool if isinstance(reference_decode(v, DEFAULT_LIMITS), Row)]
    for value in poison(rng, valid, plan["poison"]):
        check("poison", value)
    advance()
    for i, (source, value) in enumerate(mutated(rng, valid, plan["mutations"])):
        check(source, value)
        if i % 5000 == 0:
            advance()
    for value in random_envelopes(rng, valid, plan["random_args"]):
        check("random_args", value)
    advance()
    for _ in range(plan["limits"]):
        tree = jt.load(rng.choice(valid))
        text = m_deep(rng, tree) if rng.random() < 0.5 else m_restyle(rng, tree)
        data = text.encode("utf-8", "surrogatepass")
        limits = Limits(
            max_bytes=rng.choice([len(data) - 1, len(data), 1_048_576]),
            max_depth=rng.choice(
                [1, 2, 3, 4, 8, 32, 63, 64, 65, 254, 255, 256, 257, 258, 300, 512, 513, 2000]
            ),
        )
        check("limits", data, limits)
    check("bytes", None)
    check("bytes", b"")
    for value in random_bytes(rng, plan["bytes"]):
        check("bytes", value)
    advance()
    for value in hypothesis_inputs(valid, plan["hypothesis"], seed):
        check("hypothesis", value)
    advance()
    return diff.tally


def report(tally: Tally, seconds: float) -> str:
    lines = [f"{tally.total:,} inputs in {seconds:.0f} s; mismatches: {len(tally.mismatches)}"]
    lines.append(f"{'source':16s} {'inputs':>9s} {'fast path':>9s}  reference outcomes")
    by_source: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for (source, what), n in tally.outcomes.items():
        by_source[source][what] = n
    for source, n in sorted(tally.inputs.items()):
        outcomes = ", ".join(f"{w}={k}" for w, k in sorted(by_source[source].items()))
        lines.append(f"{source:16s} {n:9,d} {tally.fast_hits[source] / n:9.1%}  {outcomes}")
    checked = sum(tally.exact_checked.values())
    by = ", ".join(f"{s}={n}" for s, n in sorted(tally.exact_checked.items()))
    lines.append(f"exact forms judged against an accepted body: {checked:,} ({by})")
    for source, value, want, got in tally.mismatches[:10]:
        lines.append(f"MISMATCH {source} {value[:300]!r}")
        lines.append(f"  reference: {str(want)[:300]}")
        lines.append(f"  fast:      {str(got)[:300]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--scale", type=float, default=1.0, help="1.0: about 1.1M inputs")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, help="also write the counts here as JSON")
    args = parser.parse_args(argv)
    plan = planned(args.scale)
    expected = sum(plan.values()) + (len(SEEDS) * 1.07 - 1) * plan["realistic"]
    progress = Progress("decode", int(expected), "inputs")
    started = time.monotonic()
    tally = run(args.scale, args.seed, progress=progress)
    progress.update(tally.total)
    progress.close()
    seconds = time.monotonic() - started
    print(report(tally, seconds))
    if args.out is not None:
        args.out.write_text(
            json.dumps(
                {
                    "inputs": tally.total,
                    "seconds": round(seconds, 1),
                    "seed": args.seed,
                    "scale": args.scale,
                    "by_source": dict(tally.inputs),
                    "fast_path": dict(tally.fast_hits),
                    "exact_checked": dict(tally.exact_checked),
                    "mismatches": len(tally.mismatches),
                },
                indent=1,
            )
            + "\n"
        )
    return 1 if tally.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
