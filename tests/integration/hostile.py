"""Hostile Kafka records for the fuzz test: hypothesis strategies draw *specs* (plain
data), :class:`Builder` turns them, in order, into records with an *intent*: the
outcomes the record may have (``insert``, ``duplicate:ledger``, ``conflict:ledger``,
``conflict:primary_key`` or ``reject:<reason>``).

Specs that refer to earlier events (redelivery, producer retry, conflicts) carry an
index that the builder resolves against the events it has built so far, so hypothesis
draws independent values and the builder keeps the state. Every record of one agent is
keyed by that agent, so it lands on one partition after the event it refers to.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import strategies as st

from ackline.schemas import Envelope, Limits, new_envelope
from ackline.streams.producer import serialize

Headers = list[tuple[str, str | bytes | None]] | None
REJECT_ANY = frozenset(
    f"reject:{r}"
    for r in (
        "empty",
        "too_large",
        "not_utf8",
        "invalid_json",
        "duplicate_key",
        "non_finite_number",
        "inexact_number",
        "too_deep",
        "unknown_type",
        "unsupported_version",
        "schema_invalid",
    )
)

# Text that PostgreSQL and the models accept: any code point but NUL and surrogates.
_TEXT_CHARS = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
TEXT = st.text(_TEXT_CHARS, max_size=24)
IDENT = st.text(_TEXT_CHARS, min_size=1, max_size=12)
JSON_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=5,
)
TYPES = (
    "agent.requested",
    "agent.started",
    "agent.step",
    "tool.called",
    "tool.result",
    "message.posted",
    "agent.finished",
    "agent.failed",
)

_HEADERS = st.one_of(
    st.just(("normal", ())),
    st.just(("none", ())),
    st.tuples(
        st.just("garbled"),
        st.lists(
            st.tuples(
                st.one_of(
                    st.text(_TEXT_CHARS, max_size=20),
                    st.integers(1_000, 8_000).map(lambda n: "h" * n),
                    st.just("a\x00b"),
                    st.just(""),
                ),
                st.one_of(st.none(), st.binary(max_size=40), st.just(b"\xff\xfe\x00\xc0\xaf")),
            ),
            min_size=1,
            max_size=4,
        ),
    ),
)

_MATERIAL = st.fixed_dictionaries(
    {
        "type": st.sampled_from(TYPES),
        "agent": st.integers(0, 29),
        "text": TEXT,
        "ident": IDENT,
        "n": st.integers(0, 2**63 - 1),
        "priority": st.integers(0, 9),
        "flag": st.booleans(),
        "tools": st.lists(IDENT, max_size=2),
        "arguments": st.dictionaries(TEXT, JSON_VALUE, max_size=3),
        "minutes": st.integers(-14 * 60, 14 * 60),
        "seconds": st.integers(0, 130 * 365 * 86_400),
        "headers": _HEADERS,
    }
)
"""What a valid event is made of."""

_BASE = st.fixed_dictionaries(
    {
        "type": st.sampled_from(TYPES),
        "agent": st.integers(0, 29),
        "text": st.sampled_from(["", "plan", "\u00e9t\u00e9", "\U0001f600", "a b"]),
        "ident": st.sampled_from(["r", "run-1", "\u8a08\u753b"]),
        "n": st.sampled_from([0, 1, 2**63 - 1]),
        "priority": st.just(1),
        "flag": st.booleans(),
        "tools": st.just([]),
        "arguments": st.just({}),
        "minutes": st.sampled_from([0, 90, -300]),
        "seconds": st.integers(0, 130 * 365 * 86_400),
        "headers": _HEADERS,
    }
)
"""The valid event a hostile record starts from (cheaper to draw than _MATERIAL)."""

_VARIANT_INDEX = st.integers(0, 10_000)

_WRONG = st.sampled_from(
    [
        ("payload.step", "5"),
        ("payload.step", 5.0),
        ("payload.step", True),
        ("payload.step", -1),
        ("payload.step", 2**63),
        ("payload.step", None),
        ("payload.thought", 7),
        ("payload.run_id", ""),
        ("payload.run_id", "r" * 201),
        ("payload.run_id", ["r"]),
        ("payload", []),
        ("payload", "x"),
        ("occurred_at", 1_700_000_000),
        ("occurred_at", "2026-11-01T12:00:00"),
        ("occurred_at", "yesterday"),
        ("occurred_at", "0001-01-01T00:00:00+01:00"),
        ("event_id", "not-a-uuid"),
        ("event_id", 5),
        ("txn_id", None),
        ("agent_id", {"a": 1}),
        ("schema_version", "1"),
        ("schema_version", 1.0),
        ("type", 7),
        ("type", None),
        ("extra_field", 1),
        ("payload.extra", "x"),
    ]
)

_UNICODE = st.sampled_from(
    [
        ("escape_lone_high", "reject:schema_invalid"),
        ("escape_lone_low", "reject:schema_invalid"),
        ("escape_nul", "reject:schema_invalid"),
        ("escape_nul_in_key", "reject:schema_invalid"),
        ("escape_pair", "insert"),
        ("raw_surrogate", "reject:not_utf8"),
        ("overlong", "reject:not_utf8"),
        ("raw_nul_in_string", "reject:invalid_json"),
        ("bom", "reject:invalid_json"),
        ("noncharacters", "insert"),
        ("bidi_combining", "insert"),
    ]
)

SPEC = st.one_of(
    st.tuples(st.just("valid"), _MATERIAL),
    st.tuples(st.just("valid"), _MATERIAL),
    st.tuples(st.just("valid"), _MATERIAL),
    st.tuples(st.just("redeliver"), _VARIANT_INDEX),
    st.tuples(st.just("retry"), _VARIANT_INDEX),
    st.tuples(st.just("conflict_ledger"), st.tuples(_VARIANT_INDEX, TEXT, st.booleans())),
    st.tuples(st.just("conflict_pk"), st.tuples(_VARIANT_INDEX, IDENT)),
    st.tuples(st.just("random_bytes"), st.tuples(st.binary(max_size=400), _HEADERS)),
    st.tuples(st.just("json_value"), JSON_VALUE),
    st.tuples(st.just("deep"), st.tuples(_BASE, st.integers(1, 2_200), st.booleans())),
    st.tuples(st.just("huge_string"), st.tuples(_BASE, st.integers(100, 12_000), TEXT)),
    st.tuples(
        st.just("non_finite"),
        st.tuples(_BASE, st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-2E+999"])),
    ),
    st.tuples(st.just("dup_key"), st.tuples(_BASE, st.integers(0, 3), st.booleans())),
    st.tuples(st.just("wrong_type"), st.tuples(_BASE, _WRONG)),
    st.tuples(st.just("unicode"), st.tuples(_BASE, _UNICODE)),
    st.tuples(st.just("oversize"), st.tuples(_BASE, st.integers(1, 30_000))),
    st.tuples(st.just("unknown_type"), st.tuples(_BASE, IDENT)),
    st.tuples(
        st.just("unsupported_version"),
        st.tuples(_BASE, st.sampled_from([0, -1, 3, 99, 2**31])),
    ),
    st.tuples(st.just("tombstone"), st.sampled_from([None, b""])),
)
"""One record's spec: (kind, parameters). Valid events are drawn about three times as
often as any single hostile kind."""


@dataclass(frozen=True, slots=True)
class Record:
    kind: str
    key: bytes | None
    value: bytes | None
    headers: Headers
    intent: frozenset[str]


T0 = datetime(1970, 1, 1, tzinfo=UTC)


class Builder:
    """Turns specs into records, in order; remembers the events it expects inserted."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.stored: list[tuple[Envelope, bytes]] = []
        self._n = 0

    # ---- valid events -------------------------------------------------------------------

    def envelope(self, m: dict[str, Any]) -> Envelope:
        self._n += 1
        kind: str = m["type"]
        text, ident, n = m["text"], m["ident"], m["n"]
        payloads: dict[str, dict[str, Any]] = {
            "agent.requested": {
                "prompt": text,
                "requested_by": ident,
                "priority": m["priority"],
                "tools": m["tools"],
            },
            "agent.started": {"run_id": ident, "model": ident},
            "agent.step": {"run_id": ident, "step": n, "thought": text},
            "tool.called": {
                "run_id": ident,
                "call_id": f"c{self._n}",
                "tool": ident,
                "arguments": m["arguments"],
            },
            "tool.result": {
                "run_id": ident,
                "call_id": f"c{self._n}",
                "ok": m["flag"],
                "output": text,
                "duration_ms": n,
            },
            "message.posted": {"run_id": ident, "role": "assistant", "content": text},
            "agent.finished": {
                "run_id": ident,
                "steps": n,
                "tokens_in": n,
                "tokens_out": 0,
                "summary": text,
            },
            "agent.failed": {"run_id": ident, "error_kind": ident, "error": text},
        }
        moment = T0 + timedelta(seconds=m["seconds"])
        offset = timedelta(minutes=m["minutes"])
        return new_envelope(
            kind,
            txn_id=f"fz-{self._n}",
            agent_id=f"agent-{m['agent']}",
            request_id=f"req-{self._n}",
            payload=payloads[kind],
            occurred_at=moment.astimezone(timezone(offset)),  # any UTC offset
        )

    def _fits(self, value: bytes) -> bool:
        return len(value) <= self.limits.max_bytes

    def _record(
        self, kind: str, env: Envelope | None, value: bytes | None, m: Any, intent: set[str]
    ) -> Record:
        key = env.agent_id.encode() if env is not None else None
        headers_spec = m["headers"] if isinstance(m, dict) else ("none", ())
        return Record(kind, key, value, headers(headers_spec, env), frozenset(intent))

    def valid(self, m: dict[str, Any]) -> Record:
        env = self.envelope(m)
        value = serialize(env)
        if self._fits(value):
            self.stored.append((env, value))
            return self._record("valid", env, value, m, {"insert"})
        return self._record("valid", env, value, m, {"reject:too_large"})

    def _earlier(self, index: int) -> tuple[Envelope, bytes] | None:
        return self.stored[index % len(self.stored)] if self.stored else None

    def variant(self, kind: str, params: Any) -> Record | None:
        index = params if isinstance(params, int) else params[0]
        found = self._earlier(index)
        if found is None:
            return None
        env, value = found
        meta = {"headers": ("normal", ())}
        if kind == "redeliver":
            return self._record(kind, env, value, meta, {"duplicate:ledger"})
        if kind == "retry":
            copy = env.model_copy(update={"event_id": uuid.uuid4()})
            return self._record(kind, copy, serialize(copy), meta, {"duplicate:ledger"})
        data = env.model_dump(mode="json")
        if kind == "conflict_ledger":
            _, extra, same_id = params
            data["request_id"] = data["request_id"] + "-changed" + "x" * (len(extra) % 3)
            if not same_id:
                data["event_id"] = str(uuid.uuid4())
            intent = "conflict:ledger"
        else:  # conflict_pk: a new unit of work reusing the stored event_id
            _, ident = params
            data["txn_id"] = f"pk-{uuid.uuid4().hex[:8]}-{len(ident)}"
            intent = "conflict:primary_key"
        raw = json.dumps(data, ensure_ascii=False).encode()
        return self._record(
            kind, env, raw, meta, {intent if self._fits(raw) else "reject:too_large"}
        )

    # ---- hostile records ----------------------------------------------------------------

    def hostile(self, kind: str, params: Any) -> Record:
        if kind == "random_bytes":
            raw, hdrs = params
            return Record(kind, raw[:8] or None, raw, headers(hdrs, None), REJECT_ANY)
        if kind == "json_value":
            raw = json.dumps(params).encode()
            return Record(kind, None, raw, None, REJECT_ANY)
        if kind == "tombstone":
            return Record(kind, b"k", params, None, frozenset({"reject:empty"}))
        m = params[0]
        env = self.envelope(m)
        data = env.model_dump(mode="json")
        raw, intent = getattr(self, f"_{kind}")(data, m, *params[1:])
        if not self._fits(raw) and raw:
            intent = {"reject:too_large"}
        return self._record(kind, env, raw, m, set(intent))

    def _deep(self, data: dict[str, Any], m: Any, depth: int, top: bool) -> tuple[bytes, set[str]]:
        nest = "[" * depth + "]" * depth
        if top:
            return nest.encode(), {"reject:too_deep", "reject:invalid_json"}
        data = {**data, "type": "tool.called"}
        data["payload"] = {"run_id": "r", "call_id": "c", "tool": "t", "arguments": {"a": None}}
        text = json.dumps(data).replace('{"a": null}', '{"a": ' + nest + "}")
        # top object 1, payload 2, arguments 3, then the arrays
        too_deep = 3 + depth > self.limits.max_depth
        return text.encode(), {"reject:too_deep"} if too_deep else {"insert"}

    def _huge_string(
        self, data: dict[str, Any], m: Any, size: int, text: str
    ) -> tuple[bytes, set[str]]:
        data = {**data, "type": "agent.step"}
        huge = ((text or "x") * size)[:size]
        data["payload"] = {"run_id": "r", "step": 1, "thought": huge}
        return json.dumps(data, ensure_ascii=False).encode(), {"insert"}

    def _non_finite(self, data: dict[str, Any], m: Any, token: str) -> tuple[bytes, set[str]]:
        data = {**data, "type": "tool.called"}
        data["payload"] = {"run_id": "r", "call_id": "c", "tool": "t", "arguments": {"x": 0}}
        text = json.dumps(data).replace('{"x": 0}', '{"x": ' + token + "}")
        return text.encode(), {"reject:non_finite_number"}  # 1e400 overflows to infinity

    def _dup_key(
        self, data: dict[str, Any], m: Any, where: int, same: bool
    ) -> tuple[bytes, set[str]]:
        text = json.dumps(data)
        if where == 0:
            text = text[:-1] + ', "type": ' + json.dumps(data["type"] if same else "x") + "}"
        elif where == 1:
            text = text.replace(
                '"payload": {', '"payload": {"k": 1, "k": ' + ("1" if same else "2") + ", ", 1
            )
        elif where == 2:
            text = '{"txn_id": "a", ' + text[1:]
        else:
            text = text[:-1] + ', "z": {"q": [], "q": []}}'
        return text.encode(), {"reject:duplicate_key"}

    def _wrong_type(
        self, data: dict[str, Any], m: Any, wrong: tuple[str, Any]
    ) -> tuple[bytes, set[str]]:
        path, value = wrong
        data = {**data, "type": "agent.step"}
        data["payload"] = {"run_id": "r", "step": 1, "thought": "t"}
        if path.startswith("payload."):
            data["payload"] = {**data["payload"], path.split(".", 1)[1]: value}
        else:
            data[path] = value
        return json.dumps(data).encode(), {"reject:schema_invalid"}

    def _unicode(
        self, data: dict[str, Any], m: Any, case: tuple[str, str]
    ) -> tuple[bytes, set[str]]:
        name, intent = case
        data = {**data, "type": "agent.step"}
        data["payload"] = {"run_id": "r", "step": 1, "thought": "MARK"}
        text = json.dumps(data)
        pieces = {
            "escape_lone_high": "a\\ud800b",
            "escape_lone_low": "\\udfff",
            "escape_nul": "x\\u0000y",
            "escape_pair": "\\ud83d\\ude00",
            "noncharacters": "\ufffe\uffff\U0010ffff",
            "bidi_combining": "\u202ee\u0301\u200d\u2066",
        }
        if name in pieces:
            raw = text.replace("MARK", pieces[name]).encode("utf-8", "surrogatepass")
        elif name == "escape_nul_in_key":
            data["payload"] = {"run_id": "r", "step": 1, "thought": "t"}
            raw = json.dumps(data).replace('"thought"', '"tho\\u0000ught"').encode()
        elif name == "raw_surrogate":
            raw = text.replace("MARK", "a\ud800b").encode("utf-8", "surrogatepass")
        elif name == "overlong":
            raw = text.encode().replace(b"MARK", b"\xc0\xaf")
        elif name == "raw_nul_in_string":
            raw = text.encode().replace(b"MARK", b"a\x00b")
        else:  # bom
            raw = b"\xef\xbb\xbf" + text.encode()
        return raw, {intent}

    def _oversize(self, data: dict[str, Any], m: Any, extra: int) -> tuple[bytes, set[str]]:
        raw = json.dumps(data).encode()
        pad = max(self.limits.max_bytes + extra - len(raw), 0)
        return raw[:-1] + b" " * pad + b"}", {"reject:too_large"}

    def _unknown_type(self, data: dict[str, Any], m: Any, name: str) -> tuple[bytes, set[str]]:
        data["type"] = "x." + name
        return json.dumps(data).encode(), {"reject:unknown_type"}

    def _unsupported_version(
        self, data: dict[str, Any], m: Any, version: int
    ) -> tuple[bytes, set[str]]:
        data["schema_version"] = version
        return json.dumps(data).encode(), {"reject:unsupported_version"}

    def build(self, spec: tuple[str, Any]) -> Record:
        kind, params = spec
        if kind == "valid":
            return self.valid(params)
        if kind in ("redeliver", "retry", "conflict_ledger", "conflict_pk"):
            found = self.variant(kind, params)
            if found is not None:
                return found
            return self.hostile("tombstone", None)
        return self.hostile(kind, params)


def headers(spec: tuple[str, Any], env: Envelope | None) -> Headers:
    mode, items = spec
    if mode == "none":
        return None
    if mode == "normal":
        if env is None:
            return [("content-type", b"application/json")]
        return [
            ("content-type", b"application/json"),
            ("ackline.type", env.type.encode()),
            ("ackline.schema-version", str(env.schema_version).encode()),
        ]
    return [(k, v) for k, v in items]


def predict(
    placed: list[tuple[int, int, bytes | None]], limits: Limits
) -> dict[tuple[int, int], str]:
    """The outcome of each (partition, offset, value), by the pure decoder and classifier.

    Records of one agent share a partition and no two partitions share a key, so
    classifying in (partition, offset) order is the order the worker commits them in.
    """
    from ackline.schemas.decode import Rejection, decode
    from ackline.sinks.ingest.batch import Coord, Incoming
    from ackline.sinks.ingest.classify import classify

    out: dict[tuple[int, int], str] = {}
    events: list[Incoming] = []
    for partition, offset, value in sorted(placed, key=lambda p: (p[0], p[1])):
        decoded = decode(value, limits)
        if isinstance(decoded, Rejection):
            out[(partition, offset)] = f"reject:{decoded.reason}"
        else:
            events.append(Incoming(Coord("", partition, offset), decoded))
    verdict = classify(events, {}, {})
    for item in verdict.inserts:
        out[(item.coord.partition, item.coord.offset)] = "insert"
    for c in verdict.conflicts:
        out[(c.incoming.coord.partition, c.incoming.coord.offset)] = f"conflict:{c.layer}"
    for item in events:
        out.setdefault((item.coord.partition, item.coord.offset), "duplicate")
    return out
