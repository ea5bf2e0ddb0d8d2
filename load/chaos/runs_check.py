"""Recompute every run's row from ``activity`` and compare it with the ``runs`` projection.

The recomputation is one SQL aggregate over ``activity`` grouped by ``request_id``,
written from the definition of each column (docs/processors.md, "The runs table"), not
from the processor's code: it checks the projection's fold and its exactly-once
application together. A run is *missing* (in activity, not in runs), *extra* (the
reverse) or *different* (any column differs); ``mismatches`` is their sum and must be 0
once the processor has caught up.

A chaos run that drops or erases activity rows copies, just before, the ones the
processor had already read into ``chaos_retired`` (the rows it had not read it will never
see): :func:`check_runs` with ``retired`` recomputes from both tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import asyncpg

_HEAD: Final = """
WITH truth AS (
    SELECT a.request_id,
           min(a.agent_id COLLATE "C") AS agent_id,
           min(a.payload->>'run_id' COLLATE "C") AS run_id,
           min(a.payload->>'model' COLLATE "C") FILTER (WHERE a.type = 'agent.started') AS model,
           min(a.occurred_at) FILTER (WHERE a.type = 'agent.requested') AS requested_at,
           min(a.occurred_at) FILTER (WHERE a.type = 'agent.started') AS started_at,
           min(a.occurred_at) FILTER (WHERE a.type = 'agent.finished') AS finished_at,
           min(a.occurred_at) FILTER (WHERE a.type = 'agent.failed') AS failed_at,
           min(a.occurred_at) AS first_event_at,
           max(a.occurred_at) AS last_event_at,
           bool_or(a.type <> 'agent.requested') AS active,
           count(DISTINCT a.payload->>'step') FILTER (WHERE a.type = 'agent.step') AS steps,
           count(DISTINCT a.payload->>'call_id')
               FILTER (WHERE a.type = 'tool.called') AS tool_calls,
           count(DISTINCT a.payload->>'call_id')
               FILTER (WHERE a.type = 'tool.result' AND a.payload->'ok' = 'false'::jsonb)
               AS tool_failures,
           count(DISTINCT a.txn_id) FILTER (WHERE a.type = 'message.posted') AS messages,
           max((a.payload->>'tokens_in')::bigint)
               FILTER (WHERE a.type = 'agent.finished') AS tokens_in,
           max((a.payload->>'tokens_out')::bigint)
               FILTER (WHERE a.type = 'agent.finished') AS tokens_out,
           min(a.payload->>'error_kind' COLLATE "C")
               FILTER (WHERE a.type = 'agent.failed') AS error_kind
"""
_TAIL: Final = """
    GROUP BY a.request_id
), compared AS (
    SELECT coalesce(t.request_id, r.request_id) AS request_id,
           r.request_id IS NULL AS missing,
           t.request_id IS NULL AS extra,
           (t.agent_id, t.run_id, t.model, t.requested_at, t.started_at, t.finished_at,
            t.failed_at, t.first_event_at, t.last_event_at, t.active, t.steps, t.tool_calls,
            t.tool_failures, t.messages, t.tokens_in, t.tokens_out, t.error_kind)
           IS DISTINCT FROM
           (r.agent_id, r.run_id, r.model, r.requested_at, r.started_at, r.finished_at,
            r.failed_at, r.first_event_at, r.last_event_at, r.active, r.steps, r.tool_calls,
            r.tool_failures, r.messages, r.tokens_in, r.tokens_out, r.error_kind) AS differs
    FROM truth AS t
    FULL JOIN runs AS r ON r.request_id = t.request_id
)
SELECT count(*) FILTER (WHERE NOT extra) AS runs,
       count(*) FILTER (WHERE missing) AS missing,
       count(*) FILTER (WHERE extra) AS extra,
       count(*) FILTER (WHERE differs AND NOT missing AND NOT extra) AS different,
       (array_agg(request_id ORDER BY request_id) FILTER (WHERE differs))[1:5] AS examples
FROM compared
"""
_TRUTH: Final = _HEAD + "    FROM activity AS a\n" + _TAIL
_TRUTH_RETIRED: Final = (
    _HEAD + "    FROM (SELECT * FROM activity UNION ALL SELECT * FROM chaos_retired) AS a\n" + _TAIL
)


@dataclass(frozen=True)
class RunsCheck:
    runs: int
    missing: int
    extra: int
    different: int
    examples: list[str] = field(default_factory=list)

    @property
    def mismatches(self) -> int:
        return self.missing + self.extra + self.different

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "runs_missing": self.missing,
            "runs_extra": self.extra,
            "runs_different": self.different,
            "runs_mismatch": self.mismatches,
            "runs_mismatch_examples": self.examples,
        }


async def check_runs(conn: asyncpg.Connection, retired: bool = False) -> RunsCheck:
    """Compare ``runs`` with its recomputation from ``activity`` (and ``chaos_retired``
    with ``retired``); read-only, one statement."""
    r = await conn.fetchrow(_TRUTH_RETIRED if retired else _TRUTH)
    assert r is not None
    return RunsCheck(
        runs=int(r["runs"]),
        missing=int(r["missing"]),
        extra=int(r["extra"]),
        different=int(r["different"]),
        examples=list(r["examples"] or []),
    )


async def check_runs_at(dsn: str, retired: bool = False) -> RunsCheck:
    conn = await asyncpg.connect(dsn)
    try:
        return await check_runs(conn, retired)
    finally:
        await conn.close()
