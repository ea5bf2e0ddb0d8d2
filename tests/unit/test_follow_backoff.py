"""A reader's reconnect WARNINGs during one outage: one as it begins, then one a minute."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from ackline.sinks.feed import follow as follow_module
from ackline.sinks.feed.follow import _Follower


async def _never() -> asyncpg.Connection:
    raise OSError("not called")


def test_an_outage_says_reconnecting_once_a_minute_not_at_every_try(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tail --follow` through a 45 s outage of PostgreSQL logged 15 WARNING lines
    'transient error, reconnecting' (one each backoff, ~5 s) besides its one ERROR (an
    operator's probe). One as the outage begins, then one a minute, the rest at DEBUG; a
    read that succeeds ends the outage."""
    now = [1000.0]
    monkeypatch.setattr(follow_module.time, "monotonic", lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="ackline.sinks.feed.follow")

    async def go() -> None:
        follower = _Follower(_never, asyncio.Event(), "r")
        stop = asyncio.Event()
        stop.set()  # no sleeping between tries here
        for _ in range(12):  # a minute of tries 5 s apart
            await follower.backoff(OSError("refused"), stop)
            now[0] += 5
        await follower.backoff(OSError("refused"), stop)  # 60 s after the first
        follower.reset_backoff()  # a read succeeded: the outage ended
        await follower.backoff(OSError("refused"), stop)

    asyncio.run(go())
    said = [r for r in caplog.records if "reconnecting" in r.getMessage()]
    assert [r.levelname for r in said].count("WARNING") == 3, [r.levelname for r in said]
    assert [r.levelname for r in said] == ["WARNING"] + ["DEBUG"] * 11 + ["WARNING"] * 2
