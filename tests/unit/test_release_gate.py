"""The held partitions' release gate (streams/release.py), shared by both runtimes: a
partition whose log end reached its DB offset is released only once the topic's
incarnation was read since it became due."""

from __future__ import annotations

from ackline.streams.release import ReleaseGate


def test_a_due_partition_waits_for_a_read_begun_since_and_is_then_forgotten() -> None:
    reads: list[float] = []  # the due times asked about
    confirmed_at = [float("-inf")]

    def fresh_since(since: float) -> bool:
        reads.append(since)
        return confirmed_at[0] >= since

    gate = ReleaseGate(fresh_since)
    assert not gate.may_release(("t", 0))
    assert not gate.may_release(("t", 0))
    assert reads[0] == reads[1]  # the first due time is kept, not renewed at each look
    confirmed_at[0] = reads[0]
    assert gate.may_release(("t", 0))
    confirmed_at[0] = float("-inf")
    assert not gate.may_release(("t", 0))  # due again later: a new due time
    assert reads[-1] > reads[0]


def test_partitions_no_longer_held_are_forgotten() -> None:
    seen: list[float] = []
    gate = ReleaseGate(lambda since: bool(seen.append(since)))
    gate.may_release(("t", 0))
    gate.may_release(("t", 1))
    gate.keep_only({("t", 1)})
    gate.may_release(("t", 0))
    gate.may_release(("t", 1))
    assert seen[3] == seen[1] and seen[2] > seen[0]
