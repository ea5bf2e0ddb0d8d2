"""The `runs` projection's fold: order-independent and idempotent over a run's events.

Hypothesis builds runs from a small pool of values (so steps, call ids, timestamps and
agents collide often) and checks that any permutation, any repetition and any batching
of the events gives the same rows, that ``merge`` is a join (commutative, associative,
idempotent), and one hand-written run gives the row a person would expect.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackline.sinks.feed.processors.runs_fold import (
    RunRow,
    fold,
    merge,
    row,
    rows,
    state_of,
)
from ackline.sinks.feed.types import FeedEvent

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
TIMES = st.integers(0, 20).map(lambda s: T0 + timedelta(seconds=s))
AGENTS = st.sampled_from(["agent-b", "agent-a", "agent-é"])
REQUESTS = st.sampled_from(["r1", "r2", "r3"])


def event(
    type_: str,
    payload: dict[str, Any],
    *,
    request: str = "r1",
    agent: str = "agent-a",
    at: datetime = T0,
    txn: str | None = None,
    n: int = 0,
) -> FeedEvent:
    eid = uuid.uuid4()
    return FeedEvent(
        event_id=eid,
        txn_id=txn or f"txn-{eid.hex[:8]}",
        type=type_,
        agent_id=agent,
        request_id=request,
        occurred_at=at,
        schema_version=1,
        payload=payload,
        batch_id=1,
        commit_xid=10,
        topic="t",
        partition=0,
        offset=n,
    )


@st.composite
def run_events(draw: st.DrawFn) -> FeedEvent:
    kind = draw(
        st.sampled_from(
            [
                "agent.requested",
                "agent.started",
                "agent.step",
                "tool.called",
                "tool.result",
                "message.posted",
                "agent.finished",
                "agent.failed",
            ]
        )
    )
    run = draw(st.sampled_from(["run-1", "run-2"]))
    call = draw(st.sampled_from(["c1", "c2", "c3"]))
    payloads: dict[str, dict[str, Any]] = {
        "agent.requested": {"prompt": "p", "requested_by": "u", "priority": 1, "tools": []},
        "agent.started": {"run_id": run, "model": draw(st.sampled_from(["m-b", "m-a"]))},
        "agent.step": {"run_id": run, "step": draw(st.integers(1, 4)), "thought": "t"},
        "tool.called": {"run_id": run, "call_id": call, "tool": "search", "arguments": {}},
        "tool.result": {
            "run_id": run,
            "call_id": call,
            "ok": draw(st.booleans()),
            "output": "o",
            "duration_ms": 5,
        },
        "message.posted": {"run_id": run, "role": "assistant", "content": "c"},
        "agent.finished": {
            "run_id": run,
            "steps": 3,
            "tokens_in": draw(st.integers(0, 100)),
            "tokens_out": draw(st.integers(0, 100)),
            "summary": "s",
        },
        "agent.failed": {
            "run_id": run,
            "error_kind": draw(st.sampled_from(["timeout", "crash"])),
            "error": "e",
        },
    }
    return event(
        kind,
        payloads[kind],
        request=draw(REQUESTS),
        agent=draw(AGENTS),
        at=draw(TIMES),
        txn=draw(st.sampled_from(["m1", "m2", "m3"])) if kind == "message.posted" else None,
    )


EVENTS = st.lists(run_events(), min_size=1, max_size=40)


@settings(max_examples=300)
@given(EVENTS, st.randoms(use_true_random=False))
def test_any_order_gives_the_same_rows(events: list[FeedEvent], rnd: Any) -> None:
    shuffled = list(events)
    rnd.shuffle(shuffled)
    assert rows(shuffled) == rows(events)


@settings(max_examples=300)
@given(EVENTS, st.lists(st.integers(0, 39), max_size=20), st.randoms(use_true_random=False))
def test_repeated_events_change_nothing(
    events: list[FeedEvent], picks: list[int], rnd: Any
) -> None:
    again = [events[i % len(events)] for i in picks]
    mixed = events + again
    rnd.shuffle(mixed)
    assert rows(mixed) == rows(events)


@settings(max_examples=200)
@given(EVENTS, st.lists(st.integers(1, 40), max_size=8))
def test_any_batching_gives_the_same_rows(events: list[FeedEvent], cuts: list[int]) -> None:
    """What the processor does: fold each batch, join it onto what is stored."""
    stored: dict[str, Any] = {}
    at = 0
    for cut in [*sorted(cuts), len(events)]:
        batch = events[at:cut]
        at = max(at, cut)
        for rid, partial in fold(batch).items():
            stored[rid] = partial if rid not in stored else merge(stored[rid], partial)
    assert {rid: row(s) for rid, s in stored.items()} == rows(events)


@settings(max_examples=300)
@given(st.lists(run_events(), min_size=3, max_size=3))
def test_merge_is_a_join(three: list[FeedEvent]) -> None:
    a, b, c = (state_of(e) for e in three)
    a, b, c = (s.__class__(**{**_fields(s), "request_id": "r"}) for s in (a, b, c))
    assert merge(a, b) == merge(b, a)
    assert merge(merge(a, b), c) == merge(a, merge(b, c))
    assert merge(a, a) == a


def _fields(state: Any) -> dict[str, Any]:
    return {name: getattr(state, name) for name in state.__dataclass_fields__}


def test_merge_refuses_two_runs() -> None:
    a = state_of(event("agent.step", {"run_id": "x", "step": 1, "thought": "t"}, request="r1"))
    b = state_of(event("agent.step", {"run_id": "x", "step": 1, "thought": "t"}, request="r2"))
    with pytest.raises(ValueError, match="cannot merge"):
        merge(a, b)


def test_a_run_out_of_order_and_twice_gives_the_expected_row() -> None:
    at = [T0 + timedelta(seconds=s) for s in range(10)]
    req = {"prompt": "p", "requested_by": "u", "priority": 1, "tools": ["search"]}
    events = [
        event("agent.finished", _finished(10, 20), at=at[9]),
        event("tool.result", _result("c1", ok=False), at=at[5]),
        event("agent.step", {"run_id": "run-1", "step": 2, "thought": "t"}, at=at[4]),
        event("agent.requested", req, at=at[0]),
        event("agent.step", {"run_id": "run-1", "step": 1, "thought": "t"}, at=at[2]),
        event("agent.step", {"run_id": "run-1", "step": 2, "thought": "t"}, at=at[6]),  # again
        event("tool.called", _called("c1"), at=at[3]),
        event("tool.called", _called("c1"), at=at[3]),  # re-emitted under a new txn_id
        event("message.posted", _message(), at=at[7], txn="m1"),
        event("message.posted", _message(), at=at[8], txn="m2"),
        event("agent.started", {"run_id": "run-1", "model": "m"}, at=at[1]),
        event("agent.requested", req, at=at[0]),  # asked again
    ]
    assert rows(events) == {
        "r1": RunRow(
            request_id="r1",
            agent_id="agent-a",
            run_id="run-1",
            model="m",
            status="finished",
            requested_at=at[0],
            started_at=at[1],
            finished_at=at[9],
            failed_at=None,
            ended_at=at[9],
            first_event_at=at[0],
            last_event_at=at[9],
            duration=timedelta(seconds=8),
            steps=2,
            tool_calls=1,
            tool_failures=1,
            messages=2,
            tokens_in=10,
            tokens_out=20,
            error_kind=None,
        )
    }


def test_status_precedence() -> None:
    req = {"prompt": "p", "requested_by": "u", "priority": 1, "tools": []}
    requested = event("agent.requested", req)
    step = event("agent.step", {"run_id": "x", "step": 1, "thought": "t"})
    finished = event("agent.finished", _finished(1, 1))
    failed = event("agent.failed", {"run_id": "x", "error_kind": "k", "error": "e"})
    assert rows([requested])["r1"].status == "requested"
    assert rows([requested, step])["r1"].status == "started"
    assert rows([step])["r1"].status == "started"  # the request is not needed to start
    assert rows([finished, step])["r1"].status == "finished"
    assert rows([finished, failed, step])["r1"].status == "failed"
    only_step = rows([step])["r1"]
    assert only_step.duration is None and only_step.ended_at is None


def _finished(tokens_in: int, tokens_out: int) -> dict[str, Any]:
    return {
        "run_id": "run-1",
        "steps": 2,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "summary": "s",
    }


def _result(call: str, ok: bool) -> dict[str, Any]:
    return {"run_id": "run-1", "call_id": call, "ok": ok, "output": "o", "duration_ms": 1}


def _called(call: str) -> dict[str, Any]:
    return {"run_id": "run-1", "call_id": call, "tool": "search", "arguments": {}}


def _message() -> dict[str, Any]:
    return {"run_id": "run-1", "role": "assistant", "content": "c"}
