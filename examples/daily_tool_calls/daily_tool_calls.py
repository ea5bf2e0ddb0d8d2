"""An ackline processor written as a user would: tool calls per agent, tool and day.

For every ``tool.called`` event, one more call in ``daily_tool_calls`` for the event's
agent, tool and UTC day; for every ``tool.result`` with ``ok`` false, one more failure
for the agent and day (a result names no tool; failures are counted under tool ``*``).

The counters are plain ``+ n``: applied twice, an event would count twice. They are
exact anyway because ackline commits them in the same transaction as the processor's
cursor (docs/processors.md): each event is applied once, whatever crashes.

Run it::

    ackline processors setup daily_tool_calls      # its table and grants, as the operator
    ackline process daily_tool_calls               # as the processor role, until SIGTERM

found by its entry point once this package is installed (``pip install
./examples/daily_tool_calls``), or as ``daily_tool_calls:PROCESSOR`` from ``sys.path``.
"""

from __future__ import annotations

from collections import Counter
from datetime import date

import asyncpg

from ackline.sinks.feed.processors.contract import ProcessorBatch
from ackline.sinks.feed.types import Filter

SETUP_SQL = """
CREATE TABLE IF NOT EXISTS daily_tool_calls (
    agent_id text   NOT NULL,
    day      date   NOT NULL,
    tool     text   NOT NULL,
    calls    bigint NOT NULL DEFAULT 0,
    failures bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (agent_id, day, tool)
);
GRANT SELECT, INSERT, UPDATE ON daily_tool_calls TO ackline_processor;
GRANT SELECT ON daily_tool_calls TO ackline_reader;
"""

_ADD = """
INSERT INTO daily_tool_calls AS d (agent_id, day, tool, calls, failures)
SELECT * FROM unnest($1::text[], $2::date[], $3::text[], $4::int8[], $5::int8[])
ON CONFLICT (agent_id, day, tool) DO UPDATE
SET calls = d.calls + EXCLUDED.calls, failures = d.failures + EXCLUDED.failures
"""

Key = tuple[str, date, str]


class DailyToolCalls:
    """The processor: a name, the events it wants, and one async ``apply``."""

    name = "daily_tool_calls"
    filter = Filter.of(types=["tool.called", "tool.result"])
    setup_sql = SETUP_SQL

    async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> int:
        calls: Counter[Key] = Counter()
        failures: Counter[Key] = Counter()
        for e in batch.events:
            day = e.occurred_at.date()  # occurred_at is UTC
            if e.type == "tool.called":
                calls[(e.agent_id, day, str(e.payload["tool"]))] += 1
            elif e.payload.get("ok") is False:
                failures[(e.agent_id, day, "*")] += 1
        keys = sorted(set(calls) | set(failures))
        if keys:
            await conn.execute(
                _ADD,
                [k[0] for k in keys],
                [k[1] for k in keys],
                [k[2] for k in keys],
                [calls[k] for k in keys],
                [failures[k] for k in keys],
            )
        return len(keys)

    async def reset(self, conn: asyncpg.Connection) -> None:
        """For ``ackline processors reset daily_tool_calls``: forget every count."""
        await conn.execute("DELETE FROM daily_tool_calls")


PROCESSOR = DailyToolCalls()
