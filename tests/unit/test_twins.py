"""One name, one process (ackline.runtime.twins): who counts as a namesake, and how long
a dead one may stay in the group. The refusal itself, against a real broker:
tests/integration/test_workers.py::test_a_second_live_worker_with_a_taken_worker_id_is_refused."""

from __future__ import annotations

import pytest

from ackline.runtime.twins import CONSUMER_SESSION_S, leave_bound_s, named_by_operator, namesakes
from ackline.settings import Settings, load_settings
from ackline.streams.kafkainfo import GroupMember


def _member(client_id: str) -> GroupMember:
    return GroupMember(client_id=client_id, host="/10.0.0.1", partitions=())


def test_only_a_member_with_exactly_this_client_id_is_a_namesake() -> None:
    members = [_member("w-1"), _member("w-10"), _member("W-1"), _member("w-1")]
    assert namesakes(members, "w-1") == [members[0], members[3]]
    assert namesakes([], "w-1") == []


def test_a_dead_member_is_waited_for_as_long_as_its_session_lasts() -> None:
    classic = Settings(worker_id="w", session_timeout_ms=6_000)
    assert leave_bound_s(classic) == 11.0
    consumer = Settings(worker_id="w", group_protocol="consumer", session_timeout_ms=6_000)
    assert leave_bound_s(consumer) == CONSUMER_SESSION_S + 5.0


def test_only_a_worker_id_the_operator_set_is_refused_when_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default (<hostname>-<pid>) is the same for containers that share a host name
    and run as pid 1: taken, it is warned about (a refusal looped them through restarts,
    found by a review); a name the operator gave is refused."""
    monkeypatch.delenv("ACKLINE_WORKER_ID", raising=False)
    assert not named_by_operator(load_settings())
    monkeypatch.setenv("ACKLINE_WORKER_ID", "w-1")
    assert named_by_operator(load_settings())
    assert CONSUMER_SESSION_S >= 60.0  # the broker's longest session by default
