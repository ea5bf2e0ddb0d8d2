"""The pure parts of partitions, retention and erasure (the server side is in
tests/integration/test_retention.py)."""

from __future__ import annotations

import dataclasses
import os
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from ackline.core.errors import SettingsError
from ackline.settings import load_settings
from ackline.sinks.admin.durations import format_duration, parse_duration, retention_period
from ackline.sinks.admin.erase import (
    _ERASURE_LOCK,
    ERASURE_LOCK_KEY,
    ErasureError,
    check_value,
)
from ackline.sinks.feed.types import ERASED, FeedEvent, event_json
from ackline.sinks.ingest.writer import _AFTER_ERASURES


@pytest.fixture(autouse=True)
def _no_ackline_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("ACKLINE_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("90d", timedelta(days=90)),
        ("90", timedelta(days=90)),
        (" 12w ", timedelta(weeks=12)),
        ("36h", timedelta(hours=36)),
        ("30m", timedelta(minutes=30)),
        ("45s", timedelta(seconds=45)),
        ("0", timedelta(0)),
    ],
)
def test_durations_parse(text: str, value: timedelta) -> None:
    assert parse_duration(text) == value


@pytest.mark.parametrize("text", ["", "d", "-1d", "1.5d", "90 days", "1y"])
def test_bad_durations_say_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match="like 90d, 12w or 36h"):
        parse_duration(text)


def test_a_duration_may_be_asked_to_carry_its_unit() -> None:
    """ACKLINE_RETENTION keeps taking a bare number as days; `--older-than` does not."""
    assert parse_duration("90d", unit_required=True) == timedelta(days=90)
    with pytest.raises(ValueError, match="'90' has no unit"):
        parse_duration("90", unit_required=True)
    with pytest.raises(ValueError, match="has no unit"):
        retention_period("7", unit_required=True)


def test_durations_print_in_the_largest_exact_unit() -> None:
    assert [
        format_duration(d)
        for d in (timedelta(days=14), timedelta(days=90), timedelta(hours=36), timedelta(0))
    ] == ["2w", "90d", "36h", "0s"]


def test_the_retention_setting_is_normalized_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().retention_keep() is None  # off by default
    monkeypatch.setenv("ACKLINE_RETENTION", "26w")
    settings = load_settings()
    assert (settings.retention, settings.retention_keep()) == ("26w", timedelta(days=182))
    # A bare number was taken for days, where `retention apply --older-than` refuses it:
    # "12" meant as weeks kept 12 days (down to the operator's policy), so it is refused too
    for bad, why in (("12h", "at least a day"), ("soon", "not a duration"), ("12", "no unit")):
        monkeypatch.setenv("ACKLINE_RETENTION", bad)
        with pytest.raises(SettingsError, match=why) as err:
            load_settings()
        assert err.value.setting == "ACKLINE_RETENTION"
    monkeypatch.setenv("ACKLINE_PARTITION_INTERVAL", "month")
    monkeypatch.delenv("ACKLINE_RETENTION")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert err.value.setting == "ACKLINE_PARTITION_INTERVAL"


def test_an_erasure_names_what_it_erases() -> None:
    event = uuid.uuid4()
    assert check_value("event", str(event).upper()) == str(event)
    assert check_value("agent", "agent-7") == "agent-7"
    with pytest.raises(ErasureError, match="a UUID"):
        check_value("event", "not-a-uuid")
    with pytest.raises(ErasureError, match="empty"):
        check_value("request", "  ")
    with pytest.raises(ErasureError, match="erase by one of"):
        check_value("tenant", "x")


def test_the_writer_and_the_erasure_take_one_lock() -> None:
    """The batch's shared lock and the erasure's exclusive one are the same key ("ACKE"),
    distinct from the partition functions' ("ACKP") and the migrator's ("ACKL")."""
    assert _AFTER_ERASURES == "SELECT pg_advisory_xact_lock_shared($1)"
    assert _ERASURE_LOCK == "SELECT pg_advisory_xact_lock($1)"
    assert ERASURE_LOCK_KEY == int.from_bytes(b"ACKE") == 1094929221
    assert ERASURE_LOCK_KEY not in (int.from_bytes(b"ACKP"), int.from_bytes(b"ACKL"))


def test_an_erasure_notice_carries_keys_only() -> None:
    notice = FeedEvent(
        event_id=uuid.uuid4(),
        txn_id="run-1:3",
        type=ERASED,
        agent_id="",
        request_id="",
        occurred_at=datetime(2026, 11, 30, tzinfo=UTC),
        schema_version=0,
        payload={},
        batch_id=7,
        commit_xid=900,
        topic="t",
        partition=1,
        offset=42,
        erasure_id=3,
    )
    line = event_json(notice)
    assert notice.erased and line["type"] == "ackline.erased" and line["erasure_id"] == 3
    assert line["payload"] == {} and line["agent_id"] == ""
    plain = dataclasses.replace(notice, type="agent.step", erasure_id=None)
    assert not plain.erased and "erasure_id" not in event_json(plain)


def test_upkeep_runs_on_one_writer_at_a_time() -> None:
    """A worker's writers share one Upkeep: while one runs it, another that finds it due
    skips it (it used to run it too, queueing on the advisory lock behind the first)."""
    import asyncio
    from typing import Any

    from ackline.sinks.admin.partitions import Upkeep

    ran: list[str] = []

    @dataclasses.dataclass
    class Gated(Upkeep):  # the partition functions need PostgreSQL: held at a gate here
        gate: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

        async def ensure_now(self, conn: Any) -> None:
            ran.append(conn)
            await self.gate.wait()

    async def scenario() -> None:
        upkeep = Gated(clock=lambda: 100.0)
        first = asyncio.create_task(upkeep.run_if_due("a"))
        await asyncio.sleep(0)
        await asyncio.wait_for(upkeep.run_if_due("b"), 5)  # returns at once: a runs it
        assert ran == ["a"]
        upkeep.gate.set()
        await first
        await upkeep.run_if_due("c")  # not due for another hour
        assert ran == ["a"]

    asyncio.run(scenario())


def test_a_retention_period_is_at_least_a_day() -> None:
    """`retention apply --older-than` and ACKLINE_RETENTION share it: a shorter period
    would drop yesterday's partition while a batch begun before midnight may write it."""
    assert retention_period("1d") == timedelta(days=1)
    assert retention_period("36h") == timedelta(hours=36)
    for short in ("0", "30s", "23h"):
        with pytest.raises(ValueError, match="at least a day"):
            retention_period(short)
