"""A pure, seeded plan of realistic agent activity with every fault kind.

:func:`generate` yields :class:`Send` items: the records to produce, in order, each with
the transaction it belongs to. Same arguments, same plan, byte for byte (the only source
of randomness is ``random.Random(seed)``; no clock, no I/O).

Traffic is made of whole agent runs, many agents interleaved. A run serves one request::

    agent.requested   txn_id req:<request_id>
    agent.started     txn_id start:<request_id>     (one request, one agent)
    per step: agent.step, often tool.called + tool.result, sometimes message.posted
    agent.finished    (most)  |  agent.failed (some)

Every other event's ``txn_id`` is ``<run_id>:<seq>``: one unit of work, one event. The
Kafka key is the ``agent_id``, so an agent's events stay on one partition, in order. An
agent serves one run at a time; ``Knobs.agents`` agents run concurrently.

Faults, as fractions of originals (each original draws each fault independently):

``redelivery``      the exact same bytes again (same event_id): a layer-1 duplicate.
``retry``           same txn_id and body, new event_id: a layer-1 duplicate.
``conflict_ledger`` same txn_id, changed body, new event_id: a layer-1 conflict.
``conflict_pk``     same event_id, new txn_id and changed body: a layer-2 conflict.
``poison``          bytes the decoder rejects; :data:`POISON_KINDS` maps each kind to
                    the ``ackline.schemas.decode`` reason it must produce.

A variant always has its original's key and comes after it: immediately (often in the
same consumer batch), a few records later, or much later (``Knobs.far_max``).

Transactions: the plan is cut into chunks of ``txn_size`` records; each chunk is one
committed transaction. A fraction ``Knobs.abort`` of chunks is first attempted and
aborted: a prefix of the chunk is sent in a transaction that is aborted, then the whole
chunk (the same bytes) goes out in the next, committed, transaction. So every record of
an aborted transaction has a committed copy right after it, and the committed records
alone are exactly the plan; no variant ever depends on an aborted-only original.

Why this module is longer than the house's ~500 lines: the plan is one seeded walk —
runs, their events, and every fault drawn against them in one order (moving a draw
changes every plan after it); the text it fills events with lives in load/text.py.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import random
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

from ackline.load import text
from ackline.load.errors import LoadError
from ackline.schemas.canonical import hash_envelope
from ackline.schemas.decode import (
    DEFAULT_LIMITS,
    DUPLICATE_KEY,
    EMPTY,
    INEXACT_NUMBER,
    INVALID_JSON,
    NON_FINITE_NUMBER,
    NOT_UTF8,
    SCHEMA_INVALID,
    TOO_DEEP,
    TOO_LARGE,
    UNKNOWN_TYPE,
    UNSUPPORTED_VERSION,
)
from ackline.schemas.envelope import ENVELOPES, EVENT_TYPES, Envelope, new_envelope
from ackline.schemas.errors import SchemaError
from ackline.schemas.eventid import RAND_BITS, uuid7
from ackline.streams.producer import CONTENT_TYPE, serialize

Kind = Literal["original", "redelivery", "retry", "conflict_ledger", "conflict_pk", "poison"]
KINDS: Final[tuple[Kind, ...]] = (
    "original",
    "redelivery",
    "retry",
    "conflict_ledger",
    "conflict_pk",
    "poison",
)
VARIANT_KINDS: Final[tuple[Kind, ...]] = ("redelivery", "retry", "conflict_ledger", "conflict_pk")
DUPLICATE_KINDS: Final = frozenset({"redelivery", "retry"})
CONFLICT_KINDS: Final = frozenset({"conflict_ledger", "conflict_pk"})

Headers = tuple[tuple[str, bytes], ...]

POISON_KINDS: Final[dict[str, str]] = {
    "empty": EMPTY,
    "too_large": TOO_LARGE,
    "not_utf8": NOT_UTF8,
    "invalid_json": INVALID_JSON,
    "duplicate_key": DUPLICATE_KEY,
    "non_finite_number": NON_FINITE_NUMBER,
    "inexact_number": INEXACT_NUMBER,
    "too_deep": TOO_DEEP,
    "unknown_type": UNKNOWN_TYPE,
    "unsupported_version": UNSUPPORTED_VERSION,
    "missing_field": SCHEMA_INVALID,
    "mistyped_field": SCHEMA_INVALID,
}
"""Poison kind -> the ``ackline.schemas.decode`` rejection reason its bytes must produce."""

DEFAULT_START: Final = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)
"""Simulated time of the first event (occurred_at is simulated, never the wall clock)."""

MAX_EVENT_BYTES: Final = 4096
"""Upper bound of a generated valid event (they are mostly 200 B - 2 KB)."""


@dataclass(frozen=True)
class Knobs:
    """Fault rates (fractions of originals) and the shape of the traffic."""

    redeliver: float = 0.03
    retry: float = 0.02
    conflict_ledger: float = 0.002
    conflict_pk: float = 0.002
    poison: float = 0.002
    abort: float = 0.02
    """Fraction of planned transactions first attempted and aborted (then re-sent)."""
    agents: int = 64
    """Agents running concurrently (each one run at a time); their ids are the keys."""
    max_steps: int = 12
    fail_rate: float = 0.08
    """Fraction of runs ending in agent.failed instead of agent.finished."""
    immediate: float = 0.4
    """Share of variants sent right after their original (same consumer batch)."""
    far: float = 0.3
    """Share of variants sent much later (200..far_max records); the rest 1..50 later."""
    far_max: int = 5000
    too_large_share: float = 0.05
    """Share of poison records that are oversize (they are costly: keep it small)."""
    oversize_bytes: int = DEFAULT_LIMITS.max_bytes + 1
    """Size of a too_large poison record: must exceed the consumer's max message bytes."""
    deep_nesting: int = DEFAULT_LIMITS.max_depth + 8
    """Nesting of a too_deep poison record: must exceed the consumer's max JSON depth."""

    def __post_init__(self) -> None:
        for name in (
            "redeliver",
            "retry",
            "conflict_ledger",
            "conflict_pk",
            "poison",
            "abort",
            "fail_rate",
            "immediate",
            "far",
            "too_large_share",
        ):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise LoadError(f"knob {name} must be a fraction in [0, 1], not {value}")
        if self.immediate + self.far > 1.0:
            raise LoadError("knobs immediate + far must not exceed 1")
        if self.agents < 1 or self.max_steps < 1:
            raise LoadError("knobs agents and max_steps must be at least 1")
        if self.far_max < 200:
            raise LoadError(f"knob far_max must be at least 200, not {self.far_max}")
        if self.oversize_bytes <= MAX_EVENT_BYTES:
            raise LoadError(f"knob oversize_bytes must be over {MAX_EVENT_BYTES} bytes")
        if not 8 <= self.deep_nesting <= 500:
            raise LoadError(f"knob deep_nesting must be in 8..500, not {self.deep_nesting}")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class Send:
    """One record to produce, and what the sink must make of it."""

    kind: Kind
    key: bytes
    value: bytes
    headers: Headers
    event_id: str | None
    """The envelope's event_id (None for poison)."""
    txn_id: str | None
    body_hash_hex: str | None
    """SHA-256 of the canonical body (``ackline.schemas.canonical.hash_envelope``), hex."""
    original_index: int | None
    """For a variant: the ``seq`` of its original."""
    poison_reason: str | None
    """For poison: the ``ackline.schemas.decode`` reason the value must be rejected with."""
    seq: int = 0
    """Position in the committed plan; an aborted copy has the seq of its committed twin."""
    transaction: int = 0
    """Transaction number, 0-based, in produce order."""
    aborted: bool = False
    """True when this copy is sent in a transaction that is aborted."""
    poison_kind: str | None = None
    """For poison: the key of :data:`POISON_KINDS` (finer than the reason)."""


def generate(
    events: int,
    knobs: Knobs | None = None,
    seed: int = 1,
    *,
    txn_size: int = 500,
    namespace: str = "",
    start: datetime = DEFAULT_START,
) -> Iterator[Send]:
    """The plan: ``events`` originals plus their faults, cut into transactions.

    ``namespace`` is mixed into the seed so two runs with the same seed but different
    namespaces share no id (load runs against one database must not collide).
    """
    if events < 0:
        raise LoadError(f"events must be >= 0, not {events}")
    if txn_size < 1:
        raise LoadError(f"txn_size must be >= 1, not {txn_size}")
    knobs = knobs or Knobs()
    master = random.Random(seed) if not namespace else random.Random(f"{seed}/{namespace}")
    planner = _Planner(events, knobs, master, start)
    abort_rng = random.Random(master.getrandbits(64))
    return _transactions(planner.plan(), txn_size, knobs.abort, abort_rng)


def _transactions(
    plan: Iterable[Send], txn_size: int, abort: float, rng: random.Random
) -> Iterator[Send]:
    number = 0
    it = iter(plan)
    while chunk := list(itertools.islice(it, txn_size)):
        if abort > 0 and rng.random() < abort:
            cut = rng.randint(1, len(chunk))
            for item in chunk[:cut]:
                yield dataclasses.replace(item, transaction=number, aborted=True)
            number += 1
        for item in chunk:
            yield dataclasses.replace(item, transaction=number)
        number += 1


# --- runs -------------------------------------------------------------------------------

Step = tuple[str, int]  # (what, step number): requested, started, step, tool, message, end


@dataclass
class _Run:
    agent_id: str
    request_id: str
    run_id: str
    model: str
    tools: list[str]
    script: list[Step]
    failed: bool
    pos: int = 0
    seq: int = 0
    call: tuple[str, str] = ("", "")  # (call_id, tool) of the pending tool call
    tokens_in: int = 0
    tokens_out: int = 0
    steps_done: int = 0

    @property
    def done(self) -> bool:
        return self.pos >= len(self.script)


def _script(rng: random.Random, knobs: Knobs, has_tools: bool) -> list[Step]:
    steps = min(knobs.max_steps, 1 + int(rng.expovariate(1 / 3)))
    script: list[Step] = [("requested", 0), ("started", 0)]
    for n in range(1, steps + 1):
        script.append(("step", n))
        if has_tools and rng.random() < 0.65:
            script.append(("tool", n))
            script.append(("result", n))
        if rng.random() < 0.35:
            script.append(("message", n))
    script.append(("end", steps))
    return script


def _fit(script: list[Step], budget: int) -> list[Step]:
    """Shorten a script to at most ``budget`` events, keeping whole steps when possible."""
    if len(script) <= budget:
        return script
    if budget < 4:
        return script[:budget]  # the stream ends mid-run
    body = script[2:-1]
    while body and len(body) + 3 > budget:
        if body.pop()[0] == "result":
            body.pop()  # its tool call goes too
    return [*script[:2], *body, ("end", body[-1][1] if body else 0)]


class _Planner:
    def __init__(self, events: int, knobs: Knobs, master: random.Random, start: datetime):
        self.events = events
        self.knobs = knobs
        self.rng = random.Random(master.getrandbits(64))  # the traffic
        self.fault = random.Random(master.getrandbits(64))  # the faults
        self.clock = start
        self.pos = 0  # next seq
        self.planned = 0  # originals promised to started runs
        self.pending: list[tuple[int, int, Send]] = []  # (due seq, tiebreak, send)
        self.tiebreak = itertools.count()
        width = max(2, len(str(knobs.agents - 1)))
        self.agents = [
            f"{text.ROLES[i % len(text.ROLES)]}-{i:0{width}d}" for i in range(knobs.agents)
        ]

    # --- ids and time

    def _uuid(self, rng: random.Random) -> uuid.UUID:
        """A UUIDv7 of the generator's clock (as the SDK makes them), seeded bits."""
        return uuid7(int(self.clock.timestamp() * 1000), rng.getrandbits(RAND_BITS))

    def _tick(self) -> datetime:
        self.clock += timedelta(microseconds=round(self.rng.expovariate(1 / 15_000)) + 1)
        return self.clock

    # --- the main loop

    def plan(self) -> Iterator[Send]:
        idle = list(reversed(self.agents))
        active: list[_Run] = []
        while True:
            while idle and self.planned < self.events:
                active.append(self._new_run(idle.pop()))
            if not active:
                break
            i = self.rng.randrange(len(active))
            run = active[i]
            env = self._next_event(run)
            yield from self._due()
            original = self._send("original", env, seq=self.pos)
            self.pos += 1
            yield original
            yield from self._faults(env, original)
            if run.done:
                active[i] = active[-1]
                active.pop()
                idle.insert(0, run.agent_id)
        while self.pending:
            _, _, item = heapq.heappop(self.pending)
            yield self._emit(item)

    def _emit(self, item: Send) -> Send:
        seq, self.pos = self.pos, self.pos + 1
        return dataclasses.replace(item, seq=seq)

    def _due(self) -> Iterator[Send]:
        while self.pending and self.pending[0][0] <= self.pos:
            _, _, item = heapq.heappop(self.pending)
            yield self._emit(item)

    def _new_run(self, agent_id: str) -> _Run:
        rng = self.rng
        tools = sorted(rng.sample(text.TOOLS, rng.randint(0, 4)))
        script = _fit(_script(rng, self.knobs, bool(tools)), self.events - self.planned)
        self.planned += len(script)
        return _Run(
            agent_id=agent_id,
            request_id=f"req-{rng.getrandbits(64):016x}",
            run_id=f"run-{rng.getrandbits(64):016x}",
            model=rng.choice(text.MODELS),
            tools=tools,
            script=script,
            failed=rng.random() < self.knobs.fail_rate,
        )

    def _next_event(self, run: _Run) -> Envelope:
        rng = self.rng
        what, n = run.script[run.pos]
        run.pos += 1
        if what == "requested":
            return self._envelope(
                run,
                "agent.requested",
                f"req:{run.request_id}",
                {
                    "prompt": text.prompt(rng),
                    "requested_by": rng.choice(text.REQUESTERS),
                    "priority": min(9, max(0, round(rng.gauss(4, 2)))),
                    "tools": run.tools,
                },
            )
        if what == "started":
            return self._envelope(
                run,
                "agent.started",
                f"start:{run.request_id}",
                {"run_id": run.run_id, "model": run.model},
            )
        run.seq += 1
        txn_id = f"{run.run_id}:{run.seq}"
        if what == "step":
            run.steps_done = n
            run.tokens_in += rng.randint(800, 6000)
            run.tokens_out += rng.randint(50, 900)
            return self._envelope(
                run,
                "agent.step",
                txn_id,
                {"run_id": run.run_id, "step": n, "thought": text.thought(rng)},
            )
        if what == "tool":
            run.call = (f"call_{rng.getrandbits(48):012x}", rng.choice(run.tools))
            return self._envelope(
                run,
                "tool.called",
                txn_id,
                {
                    "run_id": run.run_id,
                    "call_id": run.call[0],
                    "tool": run.call[1],
                    "arguments": text.tool_arguments(rng, run.call[1]),
                },
            )
        if what == "result":
            ok = rng.random() < 0.92
            return self._envelope(
                run,
                "tool.result",
                txn_id,
                {
                    "run_id": run.run_id,
                    "call_id": run.call[0],
                    "ok": ok,
                    "output": text.tool_output(rng, run.call[1], ok),
                    "duration_ms": text.tool_duration_ms(rng, run.call[1]),
                },
            )
        if what == "message":
            role = rng.choices(("assistant", "user", "system"), (85, 10, 5))[0]
            return self._envelope(
                run,
                "message.posted",
                txn_id,
                {
                    "run_id": run.run_id,
                    "role": role,
                    "content": text.message(rng),
                },
            )
        if run.failed:
            kind, error = text.failure(rng, run.steps_done)
            return self._envelope(
                run,
                "agent.failed",
                txn_id,
                {"run_id": run.run_id, "error_kind": kind, "error": error},
            )
        return self._envelope(
            run,
            "agent.finished",
            txn_id,
            {
                "run_id": run.run_id,
                "steps": run.steps_done,
                "tokens_in": run.tokens_in,
                "tokens_out": run.tokens_out,
                "summary": text.summary(rng, run.steps_done),
            },
        )

    def _envelope(self, run: _Run, type_: str, txn_id: str, payload: dict[str, Any]) -> Envelope:
        return _build(
            type_, txn_id, run.agent_id, run.request_id, payload, self._tick(), self._uuid(self.rng)
        )

    # --- sends and faults

    def _send(self, kind: Kind, env: Envelope, original: int | None = None, seq: int = 0) -> Send:
        return Send(
            kind=kind,
            key=env.agent_id.encode(),
            value=serialize(env),
            headers=_headers(env),
            event_id=str(env.event_id),
            txn_id=env.txn_id,
            body_hash_hex=hash_envelope(env).hex(),
            original_index=original,
            poison_reason=None,
            seq=seq,
        )

    def _faults(self, env: Envelope, original: Send) -> Iterator[Send]:
        rng, k = self.fault, self.knobs
        if rng.random() < k.redeliver:
            self._schedule(
                dataclasses.replace(original, kind="redelivery", original_index=original.seq, seq=0)
            )
        if rng.random() < k.retry:
            retry = env.model_copy(update={"event_id": self._uuid(rng)})
            self._schedule(self._send("retry", retry, original.seq))
        if rng.random() < k.conflict_ledger:
            changed = _mutate(rng, env, env.txn_id, self._uuid(rng))
            self._schedule(self._send("conflict_ledger", changed, original.seq))
        if rng.random() < k.conflict_pk:
            changed = _mutate(rng, env, f"{env.txn_id}~{rng.getrandbits(32):08x}", env.event_id)
            self._schedule(self._send("conflict_pk", changed, original.seq))
        if rng.random() < k.poison:
            if rng.random() < k.too_large_share:
                kind = "too_large"
            else:
                kind = rng.choice([p for p in POISON_KINDS if p != "too_large"])
            value = make_poison(kind, rng, env, k)
            yield self._emit(
                Send(
                    kind="poison",
                    key=original.key,
                    value=value,
                    headers=(("content-type", CONTENT_TYPE),),
                    event_id=None,
                    txn_id=None,
                    body_hash_hex=None,
                    original_index=None,
                    poison_reason=POISON_KINDS[kind],
                    poison_kind=kind,
                )
            )

    def _schedule(self, item: Send) -> None:
        rng, k = self.fault, self.knobs
        roll = rng.random()
        if roll < k.immediate:
            delay = 0
        elif roll < k.immediate + k.far:
            delay = rng.randint(200, k.far_max)
        else:
            delay = rng.randint(1, 50)
        heapq.heappush(self.pending, (self.pos + delay, next(self.tiebreak), item))


def _headers(env: Envelope) -> Headers:
    return (
        ("content-type", CONTENT_TYPE),
        ("ackline.type", env.type.encode()),
        ("ackline.schema-version", str(env.schema_version).encode()),
    )


def _build(
    type_: str,
    txn_id: str,
    agent_id: str,
    request_id: str,
    payload: dict[str, Any],
    occurred_at: datetime,
    event_id: uuid.UUID,
) -> Envelope:
    try:
        return new_envelope(
            type_,
            txn_id,
            agent_id,
            request_id,
            payload,
            occurred_at=occurred_at,
            event_id=event_id,
        )
    except SchemaError as exc:  # a generator bug, not bad luck
        raise LoadError(f"generated an invalid {type_} event: {exc}") from exc


_TEXT_FIELDS: Final = ("thought", "output", "content", "summary", "error", "prompt")


def _mutate(rng: random.Random, env: Envelope, txn_id: str, event_id: uuid.UUID) -> Envelope:
    """A copy of ``env`` with a different body: re-stamped time or regenerated content."""
    payload: dict[str, Any] = env.payload.model_dump(mode="python")
    occurred_at = env.occurred_at
    field_name = next((f for f in _TEXT_FIELDS if f in payload), None)
    if field_name is None or rng.random() < 0.5:
        occurred_at += timedelta(milliseconds=rng.randint(1, 5000))
    else:
        payload[field_name] = payload[field_name] + " " + text.message(rng)[:200]
    changed = _build(env.type, txn_id, env.agent_id, env.request_id, payload, occurred_at, event_id)
    if hash_envelope(changed) == hash_envelope(env):
        raise LoadError("a conflict variant has the body of its original")  # cannot happen
    return changed


# --- poison -----------------------------------------------------------------------------


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _ascii(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True)


def make_poison(kind: str, rng: random.Random, env: Envelope, knobs: Knobs) -> bytes:
    """Bytes that ``ackline.schemas.decode.decode`` rejects with ``POISON_KINDS[kind]``.

    Built from a realistic envelope (``env``, given a fresh event_id and txn_id) with one
    thing wrong, the way buggy producers get it wrong.
    """
    build = _POISON_BUILDERS.get(kind)
    if build is None:
        raise LoadError(f"unknown poison kind {kind!r}; known: {', '.join(POISON_KINDS)}")
    obj: dict[str, Any] = env.model_dump(mode="json")
    obj["event_id"] = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    obj["txn_id"] = f"{env.txn_id}!{rng.getrandbits(32):08x}"
    return build(rng, obj, env, knobs)


def _empty(rng: random.Random, obj: dict[str, Any], env: Envelope, knobs: Knobs) -> bytes:
    return b""


def _too_large(rng: random.Random, obj: dict[str, Any], env: Envelope, knobs: Knobs) -> bytes:
    """A tool result carrying a whole export: exactly ``knobs.oversize_bytes`` bytes."""
    obj["type"], obj["schema_version"] = "tool.result", 1
    payload = {
        "run_id": obj["payload"].get("run_id", "run-unknown"),
        "call_id": f"call_{rng.getrandbits(48):012x}",
        "ok": True,
        "output": "",
        "duration_ms": rng.randint(50, 5000),
    }
    obj["payload"] = payload
    need = max(0, knobs.oversize_bytes - len(_ascii(obj).encode()))
    line = "2024-05-01T09:00:00Z INFO export chunk ok; "
    payload["output"] = (line * (need // len(line) + 1))[:need]
    return _ascii(obj).encode()


def _not_utf8(rng: random.Random, obj: dict[str, Any], env: Envelope, knobs: Knobs) -> bytes:
    """A Latin-1 encoder somewhere upstream."""
    obj["type"], obj["schema_version"] = "message.posted", 1
    obj["payload"] = {
        "run_id": obj["payload"].get("run_id", "run-unknown"),
        "role": "user",
        "content": "Réunion prévue à 14h, café inclus.",
    }
    return json.dumps(obj, ensure_ascii=False).encode("latin-1")


def _invalid_json(rng: random.Random, obj: dict[str, Any], env: Envelope, knobs: Knobs) -> bytes:
    """A truncated write."""
    whole = _ascii(obj)
    return whole[: rng.randint(len(whole) // 3, len(whole) - 2)].encode()


def _duplicate_key(rng: random.Random, obj: dict[str, Any], env: Envelope, knobs: Knobs) -> bytes:
    return ('{"txn_id":' + json.dumps(f"{env.txn_id}#2") + "," + _ascii(obj)[1:]).encode()


def _non_finite(rng: random.Random, obj: dict[str, Any], env: Envelope, knobs: Knobs) -> bytes:
    obj["type"], obj["schema_version"] = "tool.called", 1
    obj["payload"] = {
        "run_id": obj["payload"].get("run_id", "run-unknown"),
        "call_id": f"call_{rng.getrandbits(48):012x}",
        "tool": "web.search",
        "arguments": {"query": "churn emea", "score_threshold": float("nan")},
    }
    return json.dumps(obj, separators=(",", ":")).encode()


_INEXACT_LITERALS: Final = (
    "0.10000000000000001",  # C's %.17g of 0.1: not the shortest text of that double
    "12345678901234567890.5",  # a decimal amount no double holds (reads as ...567e+19)
    "1e-400",  # underflow: reads as 0.0
)


def _inexact(rng: random.Random, obj: dict[str, Any], env: Envelope, knobs: Knobs) -> bytes:
    """A producer that prints floats with ``%.17g`` or sends decimals a double cannot hold."""
    obj["type"], obj["schema_version"] = "tool.called", 1
    obj["payload"] = {
        "run_id": obj["payload"].get("run_id", "run-unknown"),
        "call_id": f"call_{rng.getrandbits(48):012x}",
        "tool": "billing.charge",
        "arguments": {"currency": "EUR", "amount": 0},
    }
    literal = rng.choice(_INEXACT_LITERALS)
    text = json.dumps(obj, separators=(",", ":"))
    return text.replace('"amount":0}', f'"amount":{literal}}}', 1).encode()


def _too_deep(rng: random.Random, obj: dict[str, Any], env: Envelope, knobs: Knobs) -> bytes:
    obj["type"], obj["schema_version"] = "tool.called", 1
    node: Any = {"field": "status", "eq": "open"}
    arguments: dict[str, Any] = {"filter": node}
    obj["payload"] = {
        "run_id": obj["payload"].get("run_id", "run-unknown"),
        "call_id": f"call_{rng.getrandbits(48):012x}",
        "tool": "sql.query",
        "arguments": arguments,
    }
    while _depth(obj) < knobs.deep_nesting:
        node = {"and": [node]}
        arguments["filter"] = node
    return _ascii(obj).encode()


def _unknown_type(rng: random.Random, obj: dict[str, Any], env: Envelope, knobs: Knobs) -> bytes:
    obj["type"] = rng.choice([t for t in text.UNKNOWN_TYPES if t not in EVENT_TYPES])
    return _ascii(obj).encode()


def _unsupported_version(
    rng: random.Random, obj: dict[str, Any], env: Envelope, knobs: Knobs
) -> bytes:
    obj["schema_version"] = max(v for t, v in ENVELOPES if t == env.type) + 1
    return _ascii(obj).encode()


def _missing_field(rng: random.Random, obj: dict[str, Any], env: Envelope, knobs: Knobs) -> bytes:
    del obj[rng.choice(("agent_id", "request_id", "occurred_at", "event_id"))]
    return _ascii(obj).encode()


def _mistyped_field(rng: random.Random, obj: dict[str, Any], env: Envelope, knobs: Knobs) -> bytes:
    if rng.random() < 0.5:  # epoch seconds where an ISO 8601 string is required
        obj["occurred_at"] = int(env.occurred_at.timestamp())
    else:
        obj["request_id"] = rng.getrandbits(31)
    return _ascii(obj).encode()


_POISON_BUILDERS: Final[
    dict[str, Callable[[random.Random, dict[str, Any], Envelope, Knobs], bytes]]
] = {
    "empty": _empty,
    "too_large": _too_large,
    "not_utf8": _not_utf8,
    "invalid_json": _invalid_json,
    "duplicate_key": _duplicate_key,
    "non_finite_number": _non_finite,
    "inexact_number": _inexact,
    "too_deep": _too_deep,
    "unknown_type": _unknown_type,
    "unsupported_version": _unsupported_version,
    "missing_field": _missing_field,
    "mistyped_field": _mistyped_field,
}


__all__ = [
    "DEFAULT_START",
    "KINDS",
    "POISON_KINDS",
    "VARIANT_KINDS",
    "Kind",
    "Knobs",
    "Send",
    "generate",
    "make_poison",
]
