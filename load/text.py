"""Plausible agent text and tool traffic for the load generator (pure, driven by a Random).

Nothing here is meant to be meaningful; it is meant to *look* like what agents emit:
prompts, thoughts, tool arguments and outputs, messages and summaries of varied length,
so record sizes and JSON shapes resemble production traffic (roughly 200 B to 2 KB).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Sequence
from typing import Any, Final

_SLOTS: Final[dict[str, tuple[str, ...]]] = {
    "metric": (
        "weekly active users",
        "checkout conversion",
        "p95 latency",
        "gross margin",
        "net revenue retention",
        "ticket backlog",
        "trial-to-paid rate",
        "crash-free sessions",
    ),
    "region": ("EMEA", "North America", "APAC", "LATAM", "the DACH region", "Nordics"),
    "period": ("week", "month", "quarter", "sprint"),
    "team": ("the platform team", "finance", "customer success", "the data team", "legal"),
    "doc": (
        "the Q3 board deck",
        "the incident postmortem for INC-4821",
        "the vendor contract",
        "the onboarding survey results",
        "the architecture review notes",
        "the SOC 2 report",
    ),
    "task": (
        "parses ISO 8601 durations",
        "deduplicates invoices by customer and date",
        "retries HTTP calls with exponential backoff",
        "merges overlapping time ranges",
        "validates IBAN numbers",
        "computes a rolling 7-day median",
    ),
    "vendor": ("Postgres", "ClickHouse", "BigQuery", "Snowflake", "DuckDB", "Redshift"),
    "usecase": ("event analytics", "a 2 TB reporting warehouse", "ad-hoc product queries"),
    "customer": ("Acme Corp", "Globex", "Initech", "Umbrella Health", "Stark Logistics"),
    "issue": (
        "a duplicated invoice",
        "the delayed data export",
        "SSO login failures",
        "an unexpected price increase",
        "missing webhook deliveries",
    ),
    "job": ("nightly-etl", "billing-rollup", "search-reindex", "ml-feature-refresh"),
    "table": ("orders", "sessions", "invoices", "support_tickets", "events_daily", "accounts"),
    "dim": ("region", "plan", "signup cohort", "device type", "acquisition channel"),
    "thing": (
        "the schema of the orders table",
        "whether the export job ran",
        "the error budget",
        "the customer's plan tier",
        "the latest deploy",
        "the upstream rate limits",
        "the test coverage of the parser",
        "the timezone handling",
    ),
    "finding": (
        "a spike right after the 14:05 deploy",
        "three accounts with negative balances",
        "that the cron schedule uses UTC",
        "no errors in the last 24 hours",
        "a 40% drop in EMEA only",
        "that the retry loop never backs off",
    ),
    "tool": ("web.search", "code.exec", "sql.query", "file.read", "http.get", "kb.lookup"),
    "part": ("first", "second", "last", "pricing", "risk"),
    "word": (
        "latency",
        "budget",
        "invoice",
        "cohort",
        "migration",
        "rollout",
        "index",
        "backlog",
        "throughput",
        "contract",
        "forecast",
        "pipeline",
        "schema",
        "dashboard",
        "quota",
    ),
}

_PROMPTS: Final = (
    "Summarize {doc} and list the three biggest risks for {team}.",
    "Find out why {metric} dropped {pct}% in {region} last {period} and propose a fix.",
    "Write a Python function that {task}, with unit tests.",
    "Compare {vendor} and {vendor} for {usecase}; include pricing and operational limits.",
    "Draft a reply to {customer} about {issue}.",
    "Investigate the failing {job} job and open a ticket with the root cause.",
    "Build a table of {metric} by {dim} for the last {n} {period}s.",
)
_CONTEXT: Final = (
    "The data lives in the analytics database, table {table}.",
    "Use only sources from the last {n} months.",
    "Keep the answer under {n} words and cite every number.",
    "Prefer primary sources over blog posts.",
    "The previous attempt timed out on the {tool} call, so keep queries small.",
    "{team} needs this before the Monday review.",
    "Flag anything that looks like {issue}.",
    "Assume amounts are in EUR unless the row says otherwise.",
    "Do not contact {customer} directly.",
)
_THOUGHTS: Final = (
    "I should check {thing} first.",
    "The {tool} result shows {finding}.",
    "Next I will query {table} for {metric} grouped by {dim}.",
    "That contradicts my earlier assumption about {thing}.",
    "I have enough to answer the {part} part of the request.",
    "The numbers for {region} look off by about {pct}%; I will re-run with a narrower filter.",
    "Before writing anything I want to confirm {thing}.",
    "The {word} question is separate; I will note it and move on.",
    "A quick {tool} call should settle whether {finding} is real.",
)
_MESSAGES: Final = (
    "Here is what I found so far: {finding}.",
    "I looked at {table} and {metric} for {region}.",
    "Short answer: {finding}. Details below.",
    "I need one more check on {thing} before I can be sure.",
    "The main driver seems to be the {word}; the rest is noise.",
    "Recommendation: fix the {word} first, then revisit {metric} next {period}.",
    "I could not verify {thing}; treat that part as an estimate.",
)
_SUMMARIES: Final = (
    "Answered in {steps} steps.",
    "Root cause: {finding}.",
    "Delivered a table of {metric} by {dim}.",
    "Opened a ticket for {team} and attached the evidence.",
    "The {word} issue needs a human decision.",
    "Sources were checked against {table}.",
)
_ERRORS: Final[dict[str, tuple[str, ...]]] = {
    "tool_timeout": ("{tool} did not answer within {n} s", "{tool} timed out after {n} s"),
    "rate_limited": ("model API returned 429 Too Many Requests; retry budget exhausted",),
    "context_overflow": ("prompt of {big} tokens exceeds the context window",),
    "max_steps_exceeded": ("stopped after {steps} steps without a final answer",),
    "tool_error": ("{tool} failed: connection reset by peer", "{tool} returned HTTP 500"),
    "cancelled": ("the request was cancelled by its owner",),
}

MODELS: Final = (
    "claude-3-5-sonnet",
    "claude-3-haiku",
    "gpt-4o",
    "gpt-4o-mini",
    "llama-3.1-70b",
    "mistral-large-2",
)
ROLES: Final = ("researcher", "analyst", "coder", "support", "planner", "ops")
REQUESTERS: Final = (
    "user:alice",
    "user:bob",
    "user:chen",
    "user:dana",
    "user:emeka",
    "user:farah",
    "svc:scheduler",
    "svc:slack-bot",
    "svc:ci",
)
TOOLS: Final = ("web.search", "code.exec", "sql.query", "file.read", "http.get", "kb.lookup")
UNKNOWN_TYPES: Final = ("agent.paused", "agent.heartbeat", "tool.retried", "memory.updated")

_SLOT = re.compile(r"\{(\w+)\}")


def fill(rng: random.Random, template: str, **fixed: object) -> str:
    """``template`` with every ``{slot}`` replaced by a plausible value."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in fixed:
            return str(fixed[name])
        if name == "n":
            return str(rng.choice((3, 5, 6, 10, 12, 30, 90, 200)))
        if name == "pct":
            return str(rng.randint(3, 60))
        if name == "steps":
            return str(rng.randint(2, 12))
        if name == "big":
            return f"{rng.randint(130, 400) * 1000:,}"
        return rng.choice(_SLOTS[name])

    out = _SLOT.sub(one, template)
    return out[:1].upper() + out[1:] if template.startswith("{") else out


def length(rng: random.Random, median: int, low: int, high: int) -> int:
    """A log-normally spread length around ``median``, clipped to ``[low, high]``."""
    return max(low, min(high, round(rng.lognormvariate(math.log(median), 0.75))))


def _paragraph(
    rng: random.Random, first: str, bank: Sequence[str], target: int, **fixed: object
) -> str:
    text = fill(rng, first, **fixed)
    previous = first
    while len(text) < target:
        template = rng.choice(bank)
        if template == previous:
            continue
        previous = template
        text += " " + fill(rng, template, **fixed)
    if len(text) > target + 40:
        cut = text.rfind(" ", 0, target)
        text = text[: cut if cut > 20 else target].rstrip(",;: ") + "."
    return text


def prompt(rng: random.Random) -> str:
    return _paragraph(rng, rng.choice(_PROMPTS), _CONTEXT, length(rng, 260, 40, 1300))


def thought(rng: random.Random) -> str:
    return _paragraph(rng, rng.choice(_THOUGHTS), _THOUGHTS, length(rng, 220, 30, 1300))


def message(rng: random.Random) -> str:
    return _paragraph(rng, rng.choice(_MESSAGES), _MESSAGES, length(rng, 300, 30, 1300))


def summary(rng: random.Random, steps: int) -> str:
    return _paragraph(rng, _SUMMARIES[0], _SUMMARIES, length(rng, 200, 30, 900), steps=steps)


def failure(rng: random.Random, steps: int) -> tuple[str, str]:
    kind = rng.choice(tuple(_ERRORS))
    return kind, fill(rng, rng.choice(_ERRORS[kind]), steps=steps)


# --- tools ------------------------------------------------------------------------------


def _search_args(rng: random.Random) -> dict[str, Any]:
    query = fill(
        rng,
        rng.choice(
            (
                "{metric} {region} {period}",
                "{vendor} vs {vendor} pricing",
                "{issue} {customer}",
                "how to fix {word} regression",
            )
        ),
    )
    return {
        "query": query,
        "max_results": rng.choice((5, 10, 20)),
        "recency_days": rng.choice((7, 30, 365)),
    }


def _search_output(rng: random.Random, target: int) -> str:
    lines: list[str] = []
    i = 1
    while sum(len(x) + 1 for x in lines) < target:
        host = rng.choice(("docs.example.com", "blog.example.org", "news.example.net"))
        slug = "-".join(rng.choice(_SLOTS["word"]) for _ in range(3))
        lines.append(f"{i}. {fill(rng, rng.choice(_MESSAGES))} https://{host}/{slug}")
        i += 1
    return "\n".join(lines)


def _code_args(rng: random.Random) -> dict[str, Any]:
    table = rng.choice(_SLOTS["table"])
    source = (
        "import pandas as pd\n"
        f"df = pd.read_parquet('/data/{table}.parquet')\n"
        f"print(df.groupby('{rng.choice(('region', 'plan', 'day'))}')"
        f"['{rng.choice(('amount', 'users', 'latency_ms'))}'].describe())\n"
    )
    return {"language": "python", "source": source, "timeout_s": rng.choice((10, 30, 60))}


def _code_output(rng: random.Random, target: int) -> str:
    rows = ["        count      mean       std"]
    while sum(len(x) + 1 for x in rows) < target:
        rows.append(
            f"{rng.choice(_SLOTS['region'])[:8]:<8} {rng.randint(10, 9000):>6} "
            f"{rng.uniform(1, 500):>9.2f} {rng.uniform(0, 90):>9.2f}"
        )
    return "exit 0\n" + "\n".join(rows)


def _sql_args(rng: random.Random) -> dict[str, Any]:
    table = rng.choice(_SLOTS["table"])
    dim = rng.choice(("region", "plan", "channel"))
    sql = (
        f"SELECT {dim}, count(*) AS n, sum(amount) AS total FROM {table} "
        f"WHERE created_at >= $1 GROUP BY {dim} ORDER BY total DESC LIMIT $2"
    )
    return {
        "database": "analytics",
        "sql": sql,
        "params": [f"2024-0{rng.randint(1, 9)}-01", rng.choice((20, 50, 100))],
        "row_limit": 500,
    }


def _sql_output(rng: random.Random, target: int) -> str:
    rows = ["region|n|total"]
    while sum(len(x) + 1 for x in rows) < target:
        rows.append(
            f"{rng.choice(_SLOTS['region'])}|{rng.randint(1, 90000)}|"
            f"{rng.randint(1000, 9_000_000) / 100:.2f}"
        )
    return f"{len(rows) - 1} rows\n" + "\n".join(rows)


def _file_args(rng: random.Random) -> dict[str, Any]:
    folder = rng.choice(("billing", "ingest", "auth", "reports", "search"))
    name = rng.choice(("service.py", "models.py", "README.md", "config.yaml", "handlers.go"))
    return {
        "path": f"/srv/repo/src/{folder}/{name}",
        "offset": rng.choice((0, 0, 120, 400)),
        "limit": rng.choice((50, 200, 400)),
    }


def _file_output(rng: random.Random, target: int) -> str:
    lines: list[str] = []
    while sum(len(x) + 1 for x in lines) < target:
        word = rng.choice(_SLOTS["word"])
        lines.append(
            rng.choice(
                (
                    f"def handle_{word}(request, *, timeout=30):",
                    f"    # TODO: the {word} path is not idempotent yet",
                    f"    return {word}_client.fetch(request.id, retries={rng.randint(1, 5)})",
                    f"{word}:\n  enabled: true\n  max_items: {rng.randint(10, 5000)}",
                )
            )
        )
    return "\n".join(lines)


def _http_args(rng: random.Random) -> dict[str, Any]:
    resource = rng.choice(("invoices", "customers", "deployments", "incidents"))
    return {
        "url": f"https://api.example.com/v2/{resource}?limit={rng.choice((10, 50))}",
        "headers": {"accept": "application/json"},
        "timeout_s": 10,
    }


def _http_output(rng: random.Random, target: int) -> str:
    items: list[str] = []
    while sum(len(x) + 1 for x in items) < target:
        items.append(
            f'{{"id": "{rng.getrandbits(32):08x}", "status": "'
            f'{rng.choice(("open", "paid", "failed", "resolved"))}", '
            f'"amount": {rng.randint(100, 99999) / 100}}}'
        )
    return "200 OK\n[" + ",".join(items) + "]"


def _kb_args(rng: random.Random) -> dict[str, Any]:
    return {
        "collection": "support-articles",
        "query": fill(rng, "{issue}"),
        "top_k": rng.choice((3, 5, 8)),
    }


def _kb_output(rng: random.Random, target: int) -> str:
    return _paragraph(rng, "KB-{n}: ", _MESSAGES, target)


_TOOL_IMPL: Final[
    dict[
        str,
        tuple[Callable[[random.Random], dict[str, Any]], Callable[[random.Random, int], str], int],
    ]
] = {
    "web.search": (_search_args, _search_output, 900),
    "code.exec": (_code_args, _code_output, 2500),
    "sql.query": (_sql_args, _sql_output, 400),
    "file.read": (_file_args, _file_output, 30),
    "http.get": (_http_args, _http_output, 250),
    "kb.lookup": (_kb_args, _kb_output, 120),
}


def tool_arguments(rng: random.Random, tool: str) -> dict[str, Any]:
    return _TOOL_IMPL[tool][0](rng)


def tool_output(rng: random.Random, tool: str, ok: bool) -> str:
    if not ok:
        return fill(rng, rng.choice(_ERRORS["tool_error"] + _ERRORS["tool_timeout"]), tool=tool)
    return _TOOL_IMPL[tool][1](rng, length(rng, 320, 20, 1200))[:1300]


def tool_duration_ms(rng: random.Random, tool: str) -> int:
    return max(1, round(rng.expovariate(1 / _TOOL_IMPL[tool][2])))
