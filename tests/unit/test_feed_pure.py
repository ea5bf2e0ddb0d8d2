"""Pure parts of the changefeed: cursors, filters, windows, the tail line, the dispatch plan."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ackline.sinks.errors import FeedError
from ackline.sinks.feed.dispatcher import Start, plan_starts
from ackline.sinks.feed.types import (
    INT32_MAX,
    INT64_MAX,
    START,
    XID8_MAX,
    Cursor,
    FeedEvent,
    Filter,
    Position,
    event_json,
    event_line,
    stored_cursor,
    window_end,
)

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
TOPICS = st.text(alphabet="abcXYZ019._-:", min_size=1, max_size=30)
POSITIONS = st.builds(
    Position,
    st.integers(0, INT64_MAX),
    st.integers(0, INT32_MAX),
    st.integers(0, INT64_MAX),
    TOPICS,
)
CURSORS = st.builds(Cursor, st.integers(0, XID8_MAX), st.none() | POSITIONS)


def ev(
    xid: int,
    batch: int,
    partition: int,
    offset: int,
    type_: str = "agent.step",
    request: str = "r1",
    agent: str = "a1",
) -> FeedEvent:
    return FeedEvent(
        event_id=uuid.UUID(int=xid * 1_000_000 + batch * 1000 + offset),
        txn_id=f"t{xid}:{offset}",
        type=type_,
        agent_id=agent,
        request_id=request,
        occurred_at=T0,
        schema_version=1,
        payload={"k": [1, "é"]},
        batch_id=batch,
        commit_xid=xid,
        topic="topic-a",
        partition=partition,
        offset=offset,
    )


@given(CURSORS)
def test_cursor_text_round_trips(cursor: Cursor) -> None:
    assert Cursor.decode(cursor.encode()) == cursor


@given(CURSORS, st.sampled_from(["position", "xid"]))
def test_a_stored_cursor_reads_back_as_it_was_stored(cursor: Cursor, column: str) -> None:
    w = cursor.within
    row = {
        column: cursor.xid,
        "within_batch": None if w is None else w.batch_id,
        "within_partition": None if w is None else w.partition,
        "within_offset": None if w is None else w.offset,
        "within_topic": None if w is None else w.topic,
    }
    assert stored_cursor(row, column) == cursor


def test_cursor_text_forms() -> None:
    assert START.encode() == "0"
    assert Cursor.decode("917") == Cursor(917)
    c = Cursor.decode("917:42:2:1005:agent-activity.v1")
    assert c == Cursor(917, Position(42, 2, 1005, "agent-activity.v1"))
    assert c.encode() == "917:42:2:1005:agent-activity.v1"
    # the topic is the last field, so it may hold the separator
    assert Cursor.decode("1:2:3:4:a:b").within == Position(2, 3, 4, "a:b")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "x",
        "-1",
        "1:2",
        "1:2:3:4",
        "1:2:3:4:",
        "1:-2:3:4:t",
        "1:2:3:x:t",
        "²",
        "1.5",
        str(2**64),
        f"1:{2**63}:0:0:t",
        f"1:0:{2**31}:0:t",
    ],
)
def test_bad_cursor_text_is_refused(text: str) -> None:
    with pytest.raises(FeedError):
        Cursor.decode(text)


@given(CURSORS, CURSORS)
def test_sort_key_orders_positions_before_the_whole_transaction(a: Cursor, b: Cursor) -> None:
    if a.xid < b.xid:
        assert a.sort_key() < b.sort_key()
    whole = Cursor(a.xid)
    assert a.sort_key() <= whole.sort_key()
    assert (a.sort_key() == whole.sort_key()) == (a.within is None)


def test_filter_validates_and_maps_to_sql() -> None:
    assert Filter.of().sql_args() == (None, None)
    f = Filter.of(["tool.called", "agent.requested", "agent.requested"], ["b", "a"])
    assert f.sql_args() == (["agent.requested", "tool.called"], ["a", "b"])
    assert Filter.of([], []).sql_args() == (None, None)  # empty lists mean "no filter"
    with pytest.raises(FeedError, match=r"agent\.teleported"):
        Filter.of(["agent.teleported"])
    with pytest.raises(FeedError):
        Filter.of(agents=[" "])


def test_window_without_transactions_stays_put() -> None:
    start = Cursor(10, Position(1, 0, 5, "t"))
    assert window_end(start, None, [], None) == ([], start)
    assert window_end(start, None, [], 3) == ([], start)


def test_window_consumes_whole_transactions_even_when_filtered_empty() -> None:
    # two transactions read, no event matched the filter: the cursor still passes them
    assert window_end(Cursor(10), 14, [], None) == ([], Cursor(14))
    events = [ev(11, 1, 0, 0), ev(11, 1, 0, 1), ev(13, 2, 1, 7)]
    kept, end = window_end(Cursor(10), 14, events, None)
    assert kept == events and end == Cursor(14)
    kept, end = window_end(Cursor(10), 14, events, 3)  # exactly the limit: no cut
    assert kept == events and end == Cursor(14)


def test_window_cut_by_limit_ends_at_the_last_event_kept() -> None:
    events = [ev(11, 1, 0, 0), ev(11, 1, 0, 1), ev(13, 2, 1, 7)]
    kept, end = window_end(Cursor(10), 14, events, 2)
    assert kept == events[:2]
    assert end == Cursor(11, Position(1, 0, 1, "topic-a")) == events[1].cursor
    with pytest.raises(FeedError):
        window_end(Cursor(10), 14, events, 0)


def test_tail_line_has_the_documented_fields() -> None:
    e = ev(11, 3, 2, 9, type_="agent.requested")
    obj = json.loads(event_line(e))
    assert obj == event_json(e)
    assert set(obj) == {
        "event_id",
        "type",
        "agent_id",
        "request_id",
        "txn_id",
        "occurred_at",
        "payload",
        "batch_id",
        "cursor",
    }
    assert obj["occurred_at"] == "2026-11-01T12:00:00.000000Z"
    assert obj["cursor"] == "11:3:2:9:topic-a"
    assert Cursor.decode(obj["cursor"]) == e.cursor
    assert obj["payload"] == {"k": [1, "é"]}


def test_plan_starts_first_request_event_wins_and_counts_every_one() -> None:
    events = [
        ev(11, 1, 0, 0, "agent.requested", request="r1"),
        ev(11, 1, 0, 1, "agent.started", request="r1"),
        ev(11, 1, 0, 2, "agent.requested", request="r2", agent="a2"),
        ev(12, 2, 1, 0, "agent.requested", request="r1"),  # r1 asked again (new txn_id)
    ]
    assert plan_starts(events) == [
        Start("r1", events[0].event_id, "a1", 11, 2),
        Start("r2", events[2].event_id, "a2", 11, 1),
    ]
    assert plan_starts([ev(11, 1, 0, 0, "agent.step")]) == []
