"""The `make chaos-infra` schedule and verdict rules (pure parts)."""

from __future__ import annotations

from collections import Counter

import pytest

from ackline.load.chaos.infra_plan import CLASSES, Minimums, infra_plan


def test_the_plan_has_every_minimum_and_is_reproducible() -> None:
    plan = infra_plan(42, workers=3, classes=CLASSES, minimums=Minimums())
    assert plan == infra_plan(42, workers=3, classes=CLASSES, minimums=Minimums())
    kinds = Counter(f.kind for f in plan)
    assert kinds == {
        "pg_hole": 5,
        "kafka_hole": 5,
        "reset": 3,
        "latency_on": 1,
        "latency_off": 1,
        "leader_kill": 3,
        "roll": 1,
        "failover": 2,
        "disk_full": 1,
    }
    assert sum(f.in_commit for f in plan) == 1
    failovers = [f for f in plan if f.kind == "failover"]
    assert [f.sync for f in failovers] == [True, False]  # the pair starts synchronous
    assert [f.at for f in plan] == sorted(f.at for f in plan)
    assert all(0 <= f.slot < 3 for f in plan)


def test_only_the_selected_classes_are_planned() -> None:
    plan = infra_plan(1, workers=2, classes=("failover",), minimums=Minimums())
    assert {f.kind for f in plan} == {"failover"}
    with pytest.raises(ValueError, match="unknown fault classes"):
        infra_plan(1, workers=2, classes=("network", "meteor"), minimums=Minimums())
