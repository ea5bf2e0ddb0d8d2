"""The `runs` projection as a pure fold: one row per run, from the SET of its events.

Events of a run can reach a processor in any order (partitions, batches, a late replay
of a retried emission) and the same fact can arrive twice (an event re-emitted under a
new ``txn_id`` is a second row in ``activity``). So the state of a run is built from
join-semilattice values only — least/greatest of a value, logical or, and sets of
distinct facts — and :func:`merge` is their pointwise join: commutative, associative and
idempotent. Folding any permutation of any multiset of a run's events therefore gives one
state, and one :class:`RunRow` (``tests/unit/test_runs_fold.py`` proves it with
hypothesis).

What each column is, from the events of one ``request_id``:

* ``agent_id``: the least ``agent_id`` (code-point order, as PostgreSQL's ``"C"``);
  ``run_id``: the least payload ``run_id``; ``model``: the least ``model`` of
  ``agent.started``; ``error_kind``: the least of ``agent.failed``;
* ``requested_at``/``started_at``/``finished_at``/``failed_at``: the earliest
  ``occurred_at`` of that event type; ``first_event_at``/``last_event_at``: of any;
* ``steps``: distinct ``agent.step`` step numbers; ``tool_calls``: distinct ``call_id``
  of ``tool.called``; ``tool_failures``: distinct ``call_id`` with a ``tool.result`` whose
  ``ok`` is false; ``messages``: distinct ``message.posted`` units of work (``txn_id``);
* ``tokens_in``/``tokens_out``: the greatest of ``agent.finished``;
* ``status``: ``failed`` if any ``agent.failed``, else ``finished`` if any
  ``agent.finished``, else ``started`` if any event other than ``agent.requested``,
  else ``requested``; ``ended_at``: failed_at, else finished_at; ``duration``: ended_at
  minus started_at (else requested_at).

Nothing here touches the database; :mod:`ackline.sinks.feed.processors.runs` writes the
same join with ``LEAST``/``GREATEST``/``OR`` and ``INSERT ... ON CONFLICT DO NOTHING``
on ``run_facts``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final, Literal, TypeVar

from ackline.sinks.feed.types import FeedEvent

FactKind = Literal["step", "call", "tool_failure", "message"]
FACT_KINDS: Final[tuple[FactKind, ...]] = ("step", "call", "tool_failure", "message")
Fact = tuple[FactKind, str]

REQUESTED: Final = "agent.requested"
STARTED: Final = "agent.started"
FINISHED: Final = "agent.finished"
FAILED: Final = "agent.failed"

T = TypeVar("T", str, datetime, int)


def _least(a: T | None, b: T | None) -> T | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a <= b else b


def _greatest(a: T | None, b: T | None) -> T | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a >= b else b


@dataclass(frozen=True, slots=True)
class RunState:
    """The join-semilattice state of one run (see the module docstring)."""

    request_id: str
    agent_id: str
    first_event_at: datetime
    last_event_at: datetime
    run_id: str | None = None
    model: str | None = None
    requested_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    failed_at: datetime | None = None
    active: bool = False
    tokens_in: int | None = None
    tokens_out: int | None = None
    error_kind: str | None = None
    facts: frozenset[Fact] = frozenset()

    def count(self, kind: FactKind) -> int:
        return sum(1 for k, _ in self.facts if k == kind)


@dataclass(frozen=True, slots=True)
class RunRow:
    """One row of the ``runs`` table, as the projection must hold it."""

    request_id: str
    agent_id: str
    run_id: str | None
    model: str | None
    status: str
    requested_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    failed_at: datetime | None
    ended_at: datetime | None
    first_event_at: datetime
    last_event_at: datetime
    duration: timedelta | None
    steps: int
    tool_calls: int
    tool_failures: int
    messages: int
    tokens_in: int | None
    tokens_out: int | None
    error_kind: str | None

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RunRow:
        """The row from a ``SELECT * FROM runs`` record (extra columns ignored)."""
        return cls(**{name: record[name] for name in cls.__dataclass_fields__})


def _text(payload: Mapping[str, Any], key: str) -> str | None:
    value = payload.get(key)
    return value if isinstance(value, str) else None


def _count(payload: Mapping[str, Any], key: str) -> int | None:
    value = payload.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def facts_of(event: FeedEvent) -> frozenset[Fact]:
    """The distinct facts one event adds to its run (most add none or one)."""
    p = event.payload
    if event.type == "agent.step":
        step = _count(p, "step")
        return frozenset() if step is None else frozenset({("step", str(step))})
    if event.type == "tool.called":
        call = _text(p, "call_id")
        return frozenset() if call is None else frozenset({("call", call)})
    if event.type == "tool.result":
        call = _text(p, "call_id")
        if call is None or p.get("ok") is not False:
            return frozenset()
        return frozenset({("tool_failure", call)})
    if event.type == "message.posted":
        return frozenset({("message", event.txn_id)})
    return frozenset()


def state_of(event: FeedEvent) -> RunState:
    """The state of a run that has seen only ``event``."""
    p, t, at = event.payload, event.type, event.occurred_at
    return RunState(
        request_id=event.request_id,
        agent_id=event.agent_id,
        first_event_at=at,
        last_event_at=at,
        run_id=_text(p, "run_id"),
        model=_text(p, "model") if t == STARTED else None,
        requested_at=at if t == REQUESTED else None,
        started_at=at if t == STARTED else None,
        finished_at=at if t == FINISHED else None,
        failed_at=at if t == FAILED else None,
        active=t != REQUESTED,
        tokens_in=_count(p, "tokens_in") if t == FINISHED else None,
        tokens_out=_count(p, "tokens_out") if t == FINISHED else None,
        error_kind=_text(p, "error_kind") if t == FAILED else None,
        facts=facts_of(event),
    )


def merge(a: RunState, b: RunState) -> RunState:
    """The join of two states of the same run: commutative, associative, idempotent."""
    if a.request_id != b.request_id:
        raise ValueError(f"cannot merge run {a.request_id!r} with run {b.request_id!r}")
    return replace(
        a,
        agent_id=min(a.agent_id, b.agent_id),
        first_event_at=min(a.first_event_at, b.first_event_at),
        last_event_at=max(a.last_event_at, b.last_event_at),
        run_id=_least(a.run_id, b.run_id),
        model=_least(a.model, b.model),
        requested_at=_least(a.requested_at, b.requested_at),
        started_at=_least(a.started_at, b.started_at),
        finished_at=_least(a.finished_at, b.finished_at),
        failed_at=_least(a.failed_at, b.failed_at),
        active=a.active or b.active,
        tokens_in=_greatest(a.tokens_in, b.tokens_in),
        tokens_out=_greatest(a.tokens_out, b.tokens_out),
        error_kind=_least(a.error_kind, b.error_kind),
        facts=a.facts | b.facts,
    )


def fold(
    events: Iterable[FeedEvent], into: Mapping[str, RunState] | None = None
) -> dict[str, RunState]:
    """Every run's state after ``events`` (joined onto ``into``), keyed by request_id.

    Erasure notices (``event.erased``: keys only, no request) are not events of a run and
    are passed over; the rows they name are gone from ``activity``, and a rebuild
    (`ackline processors reset`) leaves their content out of ``runs`` (docs/retention.md).
    """
    states: dict[str, RunState] = dict(into or {})
    for event in events:
        if event.erased:
            continue
        new = state_of(event)
        old = states.get(event.request_id)
        states[event.request_id] = new if old is None else merge(old, new)
    return states


def status_of(state: RunState) -> str:
    if state.failed_at is not None:
        return "failed"
    if state.finished_at is not None:
        return "finished"
    return "started" if state.active else "requested"


def row(state: RunState) -> RunRow:
    """The ``runs`` row of a state (what the table's generated columns compute too)."""
    ended = state.failed_at if state.failed_at is not None else state.finished_at
    began = state.started_at if state.started_at is not None else state.requested_at
    return RunRow(
        request_id=state.request_id,
        agent_id=state.agent_id,
        run_id=state.run_id,
        model=state.model,
        status=status_of(state),
        requested_at=state.requested_at,
        started_at=state.started_at,
        finished_at=state.finished_at,
        failed_at=state.failed_at,
        ended_at=ended,
        first_event_at=state.first_event_at,
        last_event_at=state.last_event_at,
        duration=None if ended is None or began is None else ended - began,
        steps=state.count("step"),
        tool_calls=state.count("call"),
        tool_failures=state.count("tool_failure"),
        messages=state.count("message"),
        tokens_in=state.tokens_in,
        tokens_out=state.tokens_out,
        error_kind=state.error_kind,
    )


def rows(events: Iterable[FeedEvent]) -> dict[str, RunRow]:
    """Every run's row from ``events`` (in any order, repeated or not)."""
    return {rid: row(state) for rid, state in fold(events).items()}
