"""Pure parts of the processors: finding them, the contract check, reports, the bench line."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from ackline.load.bench.report import last_line, table
from ackline.sinks.errors import FeedError
from ackline.sinks.feed.dispatcher import Dispatcher
from ackline.sinks.feed.follow import _least
from ackline.sinks.feed.processors.contract import (
    ProcessorBatch,
    ProcessorError,
    check,
    fingerprint,
)
from ackline.sinks.feed.processors.control import Status
from ackline.sinks.feed.processors.registry import BUILTINS, available, load
from ackline.sinks.feed.processors.runner import Failure, Outcome, Report
from ackline.sinks.feed.processors.runs import RUNS
from ackline.sinks.feed.types import ALL, Cursor, Filter
from tests.support.processors import JOURNAL, TYPED_V1, TYPED_V2, Journal


def test_builtins_entry_points_and_module_attributes_are_found() -> None:
    assert load("runs") is RUNS
    dispatcher = load("dispatcher")
    assert isinstance(dispatcher, Dispatcher) and dispatcher.name == "dispatcher"
    assert load("tests.support.processors:JOURNAL") is JOURNAL
    made = load("tests.support.processors:Journal")  # a class is instantiated
    assert isinstance(made, Journal) and made is not JOURNAL
    assert set(BUILTINS) <= set(available())


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no-such-processor", "no processor named 'no-such-processor' (known: "),
        ("no_such_module_xyz:P", "cannot import no_such_module_xyz: ModuleNotFoundError"),
        ("tests.support.processors:NOPE", "has no attribute 'NOPE'"),
        ("json:dumps", "is not a processor"),
        (":x", "is not module:attribute"),
    ],
)
def test_a_bad_processor_spec_is_one_clear_error(spec: str, message: str) -> None:
    with pytest.raises(FeedError, match=message.replace("(", r"\(")):
        load(spec)


class _Sync:
    name = "sync"

    def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> None:
        return None


class _Named:
    def __init__(self, name: Any, filter: Any = None) -> None:
        self.name = name
        if filter is not None:
            self.filter = filter

    async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> None:
        return None


def test_the_contract_check() -> None:
    with pytest.raises(FeedError, match="must be a coroutine function"):
        check(_Sync(), "sync")
    for bad in ("", "has space", "-dash-first", "x" * 101, 7):
        with pytest.raises(FeedError, match="processor name"):
            check(_Named(bad), "p")
    with pytest.raises(FeedError, match="filter must be an ackline Filter"):
        check(_Named("ok", filter=["tool.called"]), "p")
    assert check(_Named("ok.name_1-x"), "p").name == "ok.name_1-x"


def test_a_filters_fingerprint_is_canonical_and_tells_filters_apart() -> None:
    # the form is compared with what other instances recorded: it never changes
    assert fingerprint(ALL) == '{"agents":null,"types":null}'
    assert fingerprint(TYPED_V1.filter) == '{"agents":null,"types":["agent.started","agent.step"]}'
    assert fingerprint(Filter.of(types=["tool.result", "tool.called"], agents=["b", "a"])) == (
        '{"agents":["a","b"],"types":["tool.called","tool.result"]}'
    )
    # the order given makes no difference; any difference in what is selected does
    assert fingerprint(Filter.of(types=["agent.step", "agent.started"])) == fingerprint(
        TYPED_V1.filter
    )
    assert fingerprint(TYPED_V2.filter) != fingerprint(TYPED_V1.filter)
    assert fingerprint(Filter(frozenset())) == '{"agents":null,"types":[]}'  # not "any"
    # an agent id holding the separators cannot pass for two agents
    assert fingerprint(Filter.of(agents=['a","b'])) != fingerprint(Filter.of(agents=["a", "b"]))
    assert fingerprint(Filter.of(agents=["é"])) == '{"agents":["\\u00e9"],"types":null}'


def test_reports_and_errors_are_one_line_each() -> None:
    err = ProcessorError("p", ValueError("bad\nvalue  here"))
    assert err.text == "ValueError: bad value here"
    assert str(err) == "processor 'p' raised ValueError: bad value here"
    eid = uuid.uuid4()
    report = Report("p", Outcome.FAILED, 5, 2, 0, "12", Failure(err.text, eid, Cursor(11)))
    assert report.to_json() == {
        "processor": "p",
        "outcome": "failed",
        "applied": 5,
        "erased": 0,
        "batches": 2,
        "lost_races": 0,
        "cursor": "12",
        "error": "ValueError: bad value here",
        "error_event_id": str(eid),
        "error_cursor": "11",
    }
    assert "error" not in Report("p", Outcome.STOPPED, 0, 0, 0, "0").to_json()
    superseded = Report("p", Outcome.SUPERSEDED, 0, 0, 0, "12", Failure("took over", None, None))
    assert superseded.to_json()["outcome"] == "superseded"


def test_status_states() -> None:
    now = datetime(2026, 11, 1, tzinfo=UTC)
    base: dict[str, Any] = {
        "name": "p", "paused": False, "failed_at": None, "error": None,
        "error_event_id": None, "error_cursor": None, "last_instance": None,
        "last_seen_at": None, "last_commit_at": now, "cursor": "5", "transactions": 1,
        "delivered": 3, "lag_events": 0, "lag_seconds": 0.0,
    }  # fmt: skip
    assert Status(**base).state == "ok"
    # applied leaves out the erasure notices the cursor's delivered count holds
    counted = Status(**{**base, "erased": 1}).to_json()
    assert (counted["applied"], counted["erased"], counted["delivered"]) == (2, 1, 3)
    assert Status(**{**base, "paused": True}).state == "paused"
    failed = Status(**{**base, "paused": True, "failed_at": now, "error": "boom"})
    assert failed.state == "failed"  # a failure shows first: it needs a person
    assert failed.to_json()["error"] == "boom"
    assert failed.to_json()["last_commit_at"] == now.isoformat()
    assert failed.to_json()["filter"] is None  # never recorded
    recorded = Status(**{**base, "filter": "{}", "filter_at": now, "filter_instance": "a"})
    shown = recorded.to_json()
    assert (shown["filter"], shown["filter_at"], shown["filter_instance"]) == (
        "{}",
        now.isoformat(),
        "a",
    )


def test_per_batch_cap() -> None:
    assert _least(None, None) is None
    assert _least(None, 5) == 5 and _least(7, None) == 7 and _least(7, 5) == 5


def test_the_bench_line_of_the_runs_processor() -> None:
    summary: dict[str, Any] = {
        "conditions": {
            "events": 10, "partitions": 12, "cores": 2, "load_avg_1m_at_start": 1.0,
            "load_avg_1m_at_end": 1.0,
        },
        "systems": {"ackline": {"ingest": {"events_per_s": 100.0}}},
        "processors": {"runs": {"events_per_s": 1234.4, "events": 10, "cpu_client_s": 1.0,
                                "cpu_pg_s": 2.0}},
    }  # fmt: skip
    assert last_line(summary)["runs_processor_events_per_s"] == 1234
    assert "processor runs (ackline process runs" in table(summary)
    assert "1,234 events/s applied" in table(summary)
    del summary["processors"]
    assert "runs_processor_events_per_s" not in last_line(summary)
    assert "processor runs" not in table(summary)


def test_an_unknown_processor_line_names_the_registered_ones() -> None:
    from ackline.sinks.feed.processors.control import unknown_processors_line

    line = unknown_processors_line(["ruuns"], ["dispatcher", "runs"])
    assert line.startswith("no processor named 'ruuns' (registered: dispatcher, runs;"), line
    assert "none yet" in unknown_processors_line(["a", "b"], [])
    assert "'a', 'b'" in unknown_processors_line(["a", "b"], [])
