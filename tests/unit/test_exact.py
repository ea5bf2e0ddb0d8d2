"""Exact copies (ackline.schemas.exact) and their place in a batch (with_rows).

What an exact form may stand for is checked over the decoder's whole differential corpus
(tests/support/decode_diff.py); here, the pinned vector and the shapes it must refuse.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from ackline.schemas.decode import DEFAULT_LIMITS, Limits, Row, decode
from ackline.schemas.envelope import register_payloads
from ackline.schemas.exact import ExactForm, exact_form
from ackline.sinks.ingest.batch import (
    Coord,
    Incoming,
    PartitionRange,
    Repeat,
    not_passed,
    with_rows,
)

BODY = (
    '{"agent_id":"a-7","occurred_at":"2024-05-01T12:00:00.000000Z",'
    '"payload":{"model":"gpt-x","run_id":"run-1"},"request_id":"req-42",'
    '"schema_version":1,"txn_id":"req-42","type":"agent.started"}'
)
DIGEST = bytes.fromhex("93e64f4ed6030999a18c5a0ee716d6648bff66ed43607dfe8d78faf99b44b569")
EVENT_ID = "0190c6a2-7b1e-7c3d-9e4f-a5b6c7d8e9f0"


def record(body: str = BODY, event_id: str = EVENT_ID) -> bytes:
    head = '{"agent_id":"a-7",'
    assert body.startswith(head)
    return (head + f'"event_id":"{event_id}",' + body[len(head) :]).encode()


def test_the_pinned_body_with_its_event_id_is_an_exact_copy_of_it() -> None:
    form = exact_form(record(), DEFAULT_LIMITS)
    assert form == ExactForm("req-42", DIGEST)
    row = decode(record(), DEFAULT_LIMITS)
    assert isinstance(row, Row)
    assert (row.txn_id, row.body_hash, row.event_id) == ("req-42", DIGEST, uuid.UUID(EVENT_ID))


@pytest.mark.parametrize(
    ("why", "value"),
    [
        ("nothing", b""),
        ("no event_id", BODY.encode()),
        ("event_id upper case", record(event_id=EVENT_ID.upper())),
        ("event_id without hyphens", record(event_id=EVENT_ID.replace("-", "") + "0000")),
        ("event_id not hex", record(event_id=EVENT_ID[:-1] + "g")),
        ("a space", record().replace(b'"a-7",', b'"a-7", ')),
        ("keys out of order", record().replace(b'"occurred_at"', b'"zoccurred_at"', 1)),
        ("an escape in the agent id", record().replace(b'"a-7"', b'"a\\"7"')),
        ("an escape in the txn_id", record(BODY.replace('"txn_id":"req-42"', '"txn_id":"r\\n"'))),
        ("an unknown type", record(BODY.replace("agent.started", "agent.slept"))),
        ("an unknown version", record(BODY.replace('"schema_version":1', '"schema_version":9'))),
        (
            "a version with a zero",
            record(BODY.replace('"schema_version":1', '"schema_version":01')),
        ),
        ("something after the end", record() + b" "),
        (
            "a raw control character in the txn_id",
            record().replace(b'req-42","type', b'r\x00q","type'),
        ),
        ("a raw control character in the agent id", record().replace(b'"a-7"', b'"a\x1f7"')),
        ("a txn_id that is not UTF-8", record(BODY).replace(b'req-42","type', b'r\xffq","type')),
    ],
)
def test_what_is_not_in_the_canonical_shape_is_left_to_the_decoder(why: str, value: bytes) -> None:
    assert exact_form(value, DEFAULT_LIMITS) is None, why


def test_todays_limits_still_judge_an_exact_copy() -> None:
    value = record()
    assert exact_form(value, Limits(max_bytes=len(value))) is not None
    assert exact_form(value, Limits(max_bytes=len(value) - 1)) is None
    brackets = value.count(b"{") + value.count(b"[")
    assert exact_form(value, Limits(max_depth=brackets)) is not None
    assert exact_form(value, Limits(max_depth=brackets - 1)) is None


def test_a_version_a_plugin_registered_later_is_known_too(registry: None) -> None:
    from tests.support.payloads_v2 import AgentStartedV2

    body = BODY.replace('"schema_version":1', '"schema_version":2').replace(
        '"payload":{"model":"gpt-x","run_id":"run-1"}',
        '"payload":{"max_tokens":5,"model":"m","provider":"p","run_id":"r"}',
    )
    assert exact_form(record(body), DEFAULT_LIMITS) is None
    register_payloads({("agent.started", 2): AgentStartedV2})
    form = exact_form(record(body), DEFAULT_LIMITS)
    row = decode(record(body), DEFAULT_LIMITS)
    assert isinstance(row, Row)
    assert form == ExactForm(row.txn_id, row.body_hash)


def _incoming(offset: int) -> Incoming:
    row = Row(
        uuid.uuid4(), f"t{offset}", "agent.started", "a", "r", datetime.now(UTC), 1, "{}", "{}", b""
    )
    return Incoming(Coord("t", 0, offset), row)


def _repeat(offset: int, at: int) -> Repeat:
    return Repeat(Coord("t", 0, offset), f"t{offset}", b"h", b"{}", at)


def test_decoded_repeats_go_back_in_their_places_and_the_rest_are_counted_again() -> None:
    # offsets 0..6: events at 0, 2, 5; repeats at 1, 3, 4, 6
    events = [_incoming(0), _incoming(2), _incoming(5)]
    repeats = [_repeat(1, 1), _repeat(3, 2), _repeat(4, 2), _repeat(6, 3)]
    decoded = {1: _incoming(3), 3: _incoming(6)}
    merged, left = with_rows(events, repeats, decoded)
    assert [i.coord.offset for i in merged] == [0, 2, 3, 5, 6]
    assert [(r.coord.offset, r.at) for r in left] == [(1, 1), (4, 3)]
    assert with_rows(events, repeats, {}) == (events, repeats)


def test_a_committed_batch_passes_the_records_sent_back_behind_its_end() -> None:
    coords = {("t", 0, 4), ("t", 0, 9), ("t", 1, 2), ("u", 0, 0)}
    ranges = [PartitionRange("t", 0, 3, 9, 1), PartitionRange("t", 1, 0, 2, 1)]
    assert not_passed(coords, ranges) == {("t", 0, 9), ("t", 1, 2), ("u", 0, 0)}
    assert not_passed(coords, []) == coords
