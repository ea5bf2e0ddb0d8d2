"""When a worker gives up on a group whose errors keep coming back
(streams/group_errors.py)."""

from __future__ import annotations

from confluent_kafka import KafkaError

from ackline.streams.errors import JOIN_REFUSED, join_refused
from ackline.streams.group_errors import GroupErrorStreak


def _every_2_s(s: GroupErrorStreak, start: float, end: float, generation: int) -> bool:
    """Errors from ``start`` to ``end`` (excluded) every 2 s, as the clients retry a
    refused join: whether any said to stop."""
    return any(s.error(start + t, generation) for t in range(0, int(end - start), 2))


def test_errors_that_keep_coming_stop_after_the_grace_and_not_before() -> None:
    s = GroupErrorStreak(30.0)
    assert not s.error(100.0, -1)
    s.clean(-1)  # a look between two failed joins: the generation stayed
    assert not _every_2_s(s, 102.0, 130.0, -1)
    assert s.error(130.0, -1)


def test_a_join_between_two_streaks_starts_the_grace_again() -> None:
    """A review: reset only while partitions were assigned, a streak outlived a join
    that got none (more members than partitions), and a later error stopped the worker
    with no grace."""
    s = GroupErrorStreak(30.0)
    assert not s.error(100.0, -1)
    s.clean(4)  # joined: generation 4
    assert s.since is None
    assert not _every_2_s(s, 200.0, 230.0, 4)
    assert s.error(230.0, 4)


def test_a_refused_join_names_what_to_change() -> None:
    """The line a worker exits 2 with (both runtimes), by Kafka's error code."""
    mixed = join_refused("g", KafkaError.INCONSISTENT_GROUP_PROTOCOL, "e", 6000)
    assert "another partition assignment protocol" in mixed and "ACKLINE_GROUP_ID" in mixed
    timeout = join_refused("g", KafkaError.INVALID_SESSION_TIMEOUT, "e", 1000)
    assert "ACKLINE_SESSION_TIMEOUT_MS=1000" in timeout
    assert "group.min.session.timeout.ms" in timeout
    denied = join_refused("g", KafkaError.GROUP_AUTHORIZATION_FAILED, "not allowed", 6000)
    assert denied == "cannot join consumer group g: not allowed"
    assert {23, 24, 26, 30} == set(JOIN_REFUSED)  # aiokafka's errno is Kafka's code too


def test_an_error_after_a_silence_begins_a_streak_of_its_own() -> None:
    """A review: librdkafka can hand a refusal outside any join (its coordinator lookup),
    with no rebalance after it to end the streak; a second one days later stopped a
    healthy worker at once, with no grace."""
    s = GroupErrorStreak(30.0)
    assert not s.error(100.0, 0)
    day = 100.0 + 86_400
    assert not s.error(day, 0)  # a day later: a streak of its own
    assert not _every_2_s(s, day + 2, day + 30, 0)
    assert s.error(day + 30, 0)
    s.joined()
    assert not s.error(day + 31, 0)


def test_a_streak_lasts_without_more_errors_until_a_join() -> None:
    """librdkafka hands a refused coordinator lookup once, then keeps still: the default
    runtime stops a worker outside the group once the streak has lasted the grace, more
    errors or not (a review: it owned nothing for ever)."""
    s = GroupErrorStreak(30.0)
    assert not s.lasted(100.0)
    assert not s.error(100.0, 0)
    assert not s.lasted(129.0)
    assert s.lasted(130.0)
    s.joined()
    assert not s.lasted(1_000.0)
