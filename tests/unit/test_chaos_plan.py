"""The chaos schedule is a pure function of the seed, and meets the minimum counts."""

from __future__ import annotations

from collections import Counter

import pytest

from ackline.faults import parse
from load.chaos_plan import KILL_POINTS, plan

SIZES = {"kills": 30, "stops": 3, "broker_restarts": 2, "pg_restarts": 2, "commit_faults": 10}


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    assert plan(7, workers=3, **SIZES) == plan(7, workers=3, **SIZES)
    assert plan(7, workers=3, **SIZES) != plan(8, workers=3, **SIZES)


@pytest.mark.parametrize("seed", range(20))
def test_counts_order_and_targets(seed: int) -> None:
    faults = plan(seed, workers=3, **SIZES)
    kinds = Counter(f.kind for f in faults)
    assert kinds == {"kill": 30, "stop": 3, "broker": 2, "postgres": 2, "commit": 10}
    assert [f.at for f in faults] == sorted(f.at for f in faults)
    assert all(0 < f.at < 1 and 0 <= f.slot < 3 for f in faults)
    assert {f.hard for f in faults if f.kind == "broker"} == {False, True}
    assert {f.hard for f in faults if f.kind == "postgres"} == {False, True}
    assert all(f.at <= 0.6 for f in faults if f.kind == "stop")


def test_armed_kills_are_valid_fault_specs() -> None:
    arms = [f.arm for s in range(30) for f in plan(s, workers=3, **SIZES) if f.arm]
    assert len(arms) > 100  # about 40% of 900 kills
    for arm in arms:
        ((point, armed),) = parse(arm).items()
        assert point in KILL_POINTS and armed.action == "kill"


def test_a_zombie_needs_an_heir() -> None:
    with pytest.raises(ValueError, match="at least 2 workers"):
        plan(1, workers=1, **SIZES)
