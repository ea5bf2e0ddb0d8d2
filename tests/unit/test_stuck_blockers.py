"""Which session a claim may end (ackline.sinks.ingest.offsets.is_stuck): pure."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from ackline.sinks.ingest.offsets import Blocker, is_stuck

_T = datetime(2026, 12, 1, tzinfo=UTC)
STUCK = Blocker(7, _T, "ackline_ingest", "ackline:w1", "active", "ClientRead", _T, 61.0)


def test_a_statement_waiting_on_its_client_past_the_bound_is_stuck() -> None:
    assert is_stuck(STUCK, 60.0)
    assert is_stuck(replace(STUCK, wait_event="ClientWrite"), 60.0)


@pytest.mark.parametrize(
    "change",
    [
        {"waited_s": 59.0},  # not long enough: a live writer's statement may still end
        {"state": "idle in transaction"},  # the server's idle timeout ends it
        {"wait_event": "transactionid"},  # waiting on a lock itself: it is working
        {"wait_event": None},  # running on the CPU
        {"wait_event": "SyncRep"},  # a COMMIT waiting for a standby
        {"state": None, "wait_event": None, "waited_s": None},  # another role's: hidden
    ],
)
def test_anything_else_is_waited_for(change: dict[str, object]) -> None:
    assert not is_stuck(replace(STUCK, **change), 60.0)  # type: ignore[arg-type]
