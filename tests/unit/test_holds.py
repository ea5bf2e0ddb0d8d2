"""The hold rules of ackline.streams.holds (pure)."""

from __future__ import annotations

from ackline.streams.holds import Holds

TP = ("t", 0)
V2 = ("agent.started", 2)


def test_no_hold_without_a_newer_version_or_without_a_wait() -> None:
    assert not Holds[str](60).decide(TP, 5, None, now=0)
    assert not Holds[str](0).decide(TP, 5, V2, now=0)


def test_hold_parks_in_order_until_due_then_rejects_and_gives_up() -> None:
    holds = Holds[str](10)
    assert holds.decide(TP, 5, V2, now=100)
    for record in ("r5", "r6", "r7"):
        holds.park(TP, record)
    assert holds.is_held(TP) and not holds.is_held(("t", 1))
    assert holds.due(now=109) == []
    assert holds.due(now=110) == [TP]
    assert holds.release(TP) == ["r5", "r6", "r7"]
    assert not holds.is_held(TP)
    # The held record comes back: rejected now, and that version is given up on.
    assert not holds.decide(TP, 5, V2, now=111)
    assert not holds.decide(("t", 1), 9, V2, now=111)
    # A higher version of that type is given up on too (bogus v3, v4... stall one wait,
    # not one each); a lower one, or another type, still gets a hold of its own.
    assert not holds.decide(("t", 1), 10, ("agent.started", 3), now=111)
    assert holds.decide(("t", 2), 10, ("agent.started", 1), now=111)
    assert holds.decide(("t", 3), 10, ("agent.step", 2), now=111)


def test_giving_up_on_a_version_ends_the_other_holds_at_it_at_once() -> None:
    holds = Holds[str](10)
    assert holds.decide(TP, 5, V2, now=0)
    assert holds.decide(("t", 1), 7, V2, now=5)
    assert holds.due(now=10) == [TP]
    holds.release(TP)
    assert not holds.decide(TP, 5, V2, now=10)  # rejected: V2 given up on
    assert holds.due(now=10) == [("t", 1)]  # not at now=15: "at once"


def test_forget_drops_holds_of_partitions_no_longer_owned() -> None:
    holds = Holds[str](10)
    assert holds.decide(TP, 5, V2, now=0)
    holds.park(TP, "r5")
    holds.forget({TP})
    assert not holds.is_held(TP) and holds.due(now=100) == []
    # A new owner of the partition would hold afresh (nothing remembered).
    assert holds.decide(TP, 5, V2, now=200)
