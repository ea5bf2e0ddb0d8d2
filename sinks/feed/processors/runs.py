"""The built-in `runs` processor: one row per agent run in ``runs`` (docs/processors.md).

Per batch, :func:`ackline.sinks.feed.processors.runs_fold.fold` joins each run's events
into a partial state, and one statement joins those into the table: the run's distinct
facts go into ``run_facts`` (``ON CONFLICT DO NOTHING``), only the facts that were new
add to the counters, and every other column is merged with ``LEAST``/``GREATEST``/``OR``.
That is the same join as :func:`~ackline.sinks.feed.processors.runs_fold.merge`, so the
table holds ``row(fold(all events of the run))`` whatever the order and the batching the
events arrived in. The runner commits it with the cursor: each event is joined once, and
even a second join of the same event would change nothing.
"""

from __future__ import annotations

from typing import Final

import asyncpg

from ackline.sinks.feed.processors.contract import ProcessorBatch
from ackline.sinks.feed.processors.runs_fold import fold

_APPLY = """
WITH fresh AS (
    INSERT INTO run_facts (request_id, kind, key)
    SELECT f.request_id, f.kind, f.key
    FROM unnest($1::text[], $2::text[], $3::text[]) AS f(request_id, kind, key)
    ON CONFLICT DO NOTHING
    RETURNING request_id, kind
), added AS (
    SELECT request_id,
           count(*) FILTER (WHERE kind = 'step') AS steps,
           count(*) FILTER (WHERE kind = 'call') AS tool_calls,
           count(*) FILTER (WHERE kind = 'tool_failure') AS tool_failures,
           count(*) FILTER (WHERE kind = 'message') AS messages
    FROM fresh
    GROUP BY request_id
)
INSERT INTO runs AS r (
    request_id, agent_id, run_id, model, requested_at, started_at, finished_at, failed_at,
    first_event_at, last_event_at, active, steps, tool_calls, tool_failures, messages,
    tokens_in, tokens_out, error_kind
)
SELECT u.request_id, u.agent_id, u.run_id, u.model, u.requested_at, u.started_at,
       u.finished_at, u.failed_at, u.first_event_at, u.last_event_at, u.active,
       coalesce(a.steps, 0), coalesce(a.tool_calls, 0), coalesce(a.tool_failures, 0),
       coalesce(a.messages, 0), u.tokens_in, u.tokens_out, u.error_kind
FROM unnest(
    $4::text[], $5::text[], $6::text[], $7::text[], $8::timestamptz[], $9::timestamptz[],
    $10::timestamptz[], $11::timestamptz[], $12::timestamptz[], $13::timestamptz[],
    $14::bool[], $15::int8[], $16::int8[], $17::text[]
) AS u(request_id, agent_id, run_id, model, requested_at, started_at, finished_at,
       failed_at, first_event_at, last_event_at, active, tokens_in, tokens_out, error_kind)
LEFT JOIN added AS a ON a.request_id = u.request_id
ON CONFLICT (request_id) DO UPDATE SET
    agent_id = LEAST(r.agent_id, EXCLUDED.agent_id),
    run_id = LEAST(r.run_id, EXCLUDED.run_id),
    model = LEAST(r.model, EXCLUDED.model),
    requested_at = LEAST(r.requested_at, EXCLUDED.requested_at),
    started_at = LEAST(r.started_at, EXCLUDED.started_at),
    finished_at = LEAST(r.finished_at, EXCLUDED.finished_at),
    failed_at = LEAST(r.failed_at, EXCLUDED.failed_at),
    first_event_at = LEAST(r.first_event_at, EXCLUDED.first_event_at),
    last_event_at = GREATEST(r.last_event_at, EXCLUDED.last_event_at),
    active = r.active OR EXCLUDED.active,
    steps = r.steps + EXCLUDED.steps,
    tool_calls = r.tool_calls + EXCLUDED.tool_calls,
    tool_failures = r.tool_failures + EXCLUDED.tool_failures,
    messages = r.messages + EXCLUDED.messages,
    tokens_in = GREATEST(r.tokens_in, EXCLUDED.tokens_in),
    tokens_out = GREATEST(r.tokens_out, EXCLUDED.tokens_out),
    error_kind = LEAST(r.error_kind, EXCLUDED.error_kind),
    updated_at = now()
"""

_CLEAR = "TRUNCATE run_facts, runs"


class Runs:
    """The `runs` projection; its tables are created by migration 0004."""

    name: str = "runs"

    async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> int:
        """Join the batch's events into ``runs`` (one statement); returns the runs touched."""
        states = fold(batch.events)
        fact_runs: list[str] = []
        fact_kinds: list[str] = []
        fact_keys: list[str] = []
        for s in states.values():
            for kind, key in s.facts:
                fact_runs.append(s.request_id)
                fact_kinds.append(kind)
                fact_keys.append(key)
        runs = list(states.values())
        await conn.execute(
            _APPLY,
            fact_runs,
            fact_kinds,
            fact_keys,
            [s.request_id for s in runs],
            [s.agent_id for s in runs],
            [s.run_id for s in runs],
            [s.model for s in runs],
            [s.requested_at for s in runs],
            [s.started_at for s in runs],
            [s.finished_at for s in runs],
            [s.failed_at for s in runs],
            [s.first_event_at for s in runs],
            [s.last_event_at for s in runs],
            [s.active for s in runs],
            [s.tokens_in for s in runs],
            [s.tokens_out for s in runs],
            [s.error_kind for s in runs],
        )
        return len(runs)

    async def reset(self, conn: asyncpg.Connection) -> None:
        """The operator's rebuild (``ackline processors reset runs``): empty both tables."""
        await conn.execute(_CLEAR)


RUNS: Final = Runs()
