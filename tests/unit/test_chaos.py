"""The chaos harness's pure parts: the seeded schedule, the verdict line, the fault log line."""

from __future__ import annotations

import logging
import socket
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ackline.core.faults import Faults, InjectedFault, parse
from ackline.load.chaos.infra import readyz
from ackline.load.chaos.model import ChaosConfig, ChaosReport, Counts
from ackline.load.chaos.plan import KILL_POINTS, plan
from ackline.load.chaos.runs_check import RunsCheck
from ackline.load.chaos.workers import FENCED_METRIC, production_failed, scrape_metric
from ackline.load.verify import Verdict

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


def test_retention_drops_and_erasures_are_drawn_after_the_rest() -> None:
    with_them = plan(7, workers=3, **SIZES, retention_drops=1, erasures=2)
    kinds = Counter(f.kind for f in with_them)
    assert (kinds["retention"], kinds["erase"]) == (1, 2)
    assert [f for f in with_them if f.kind not in ("retention", "erase")] == plan(
        7, workers=3, **SIZES
    )


def test_a_zombie_needs_an_heir() -> None:
    with pytest.raises(ValueError, match="at least 2 workers"):
        plan(1, workers=1, **SIZES)


def test_a_fired_point_says_so_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    """The crash-window tests and the chaos harness wait for this line, not for time."""
    faults = Faults("mid_copy=fail@2,after_fetch=stall", stall_seconds=0.01)
    with caplog.at_level(logging.WARNING, logger="ackline.core.faults"):
        faults.hit("mid_copy")
        assert "fault point mid_copy fired" not in caplog.text
        with pytest.raises(InjectedFault):
            faults.hit("mid_copy")
        faults.hit("after_fetch")
    assert "fault point mid_copy fired: fail" in caplog.text
    assert "fault point after_fetch fired: stall" in caplog.text


def _report(**changes: Any) -> ChaosReport:
    verdict = Verdict(
        run_id="r", topic="t", group_id="g", produced=110, aborted=5, unique_expected=100,
        ingested=100, lost=0, duplicated=0, duplicates_expected=3, duplicates_dropped=3,
        conflicts_expected=2, conflicts_quarantined=2, conflicts_unexpected=0,
        conflict_layer_mismatch=0, rejects_expected=1, rejected=1, rejects_unexpected=0,
        reject_reason_mismatch=0, drained=True,
    )  # fmt: skip
    counts = Counts(
        kills=30, stops=3, stops_fenced=3, broker_restarts=2, pg_restarts=2, commit_faults=10,
        processor_kills=4, retention_drops=1, erasures=1,
    )  # fmt: skip
    fields: dict[str, Any] = {
        "seed": 5, "config": ChaosConfig(), "counts": counts, "verdict": verdict,
        "fenced_batches": 3, "fenced_log_lines": 3, "offset_samples": 9,
        "max_kafka_ahead_of_db": 0, "duration_s": 1.0, "runs": RunsCheck(40, 0, 0, 0),
    }  # fmt: skip
    fields.update(changes)
    return ChaosReport(**fields)


def test_the_verdict_line_has_every_field_and_ok_needs_every_minimum() -> None:
    line = _report().to_json()
    assert line["ok"] is True
    assert set(line) >= {
        "events", "workers", "kills", "stops", "broker_restarts", "pg_restarts",
        "commit_faults", "fenced_batches", "lost", "duplicated", "conflicts_expected",
        "conflicts_quarantined", "rejects_expected", "rejected", "max_kafka_ahead_of_db",
        "ok", "seed", "duration_s",
    }  # fmt: skip
    assert not _report(max_kafka_ahead_of_db=1).ok
    assert not _report(fenced_batches=2).ok
    assert not _report(counts=Counts(kills=29, stops=3, stops_fenced=3)).ok
    full = {"kills": 30, "stops": 3, "stops_fenced": 3, "broker_restarts": 2, "pg_restarts": 2}
    assert not _report(counts=Counts(**full, commit_faults=10, erasures=1)).ok  # no drop
    assert not _report(counts=Counts(**full, commit_faults=10, retention_drops=1)).ok
    assert "chaos verdict: OK" in _report().render()


def test_the_runs_projection_is_part_of_the_verdict() -> None:
    line = _report().to_json()
    assert line["runs_mismatch"] == 0 and line["processor_kills"] == 4
    assert not _report(runs=RunsCheck(40, 0, 0, 1, ["r9"])).ok
    assert not _report(runs=None).ok  # the processor ran, so its check must have too
    assert "runs projection vs activity: 40 runs, 0 mismatches" in _report().render()
    wrong = _report(runs=RunsCheck(40, 1, 0, 0, ["r1"])).render()
    assert "1 mismatches (1 missing, 0 extra, 0 different)  MISMATCH  e.g. r1" in wrong
    without = ChaosConfig(processor_kills=0)
    assert _report(config=without, runs=None).ok
    assert _report(config=without, runs=None).to_json()["runs_mismatch"] is None


def test_processor_kills_leave_the_rest_of_a_schedule_as_it_was() -> None:
    base = plan(7, workers=3, **SIZES)
    more = plan(7, workers=3, **SIZES, processor_kills=6)
    assert [f for f in more if f.kind != "processor"] == base
    procs = [f for f in more if f.kind == "processor"]
    assert len(procs) == 6 and sum(1 for f in procs if f.arm) == 3
    for f in procs:
        if f.arm:
            ((point, armed),) = parse(f.arm).items()
            assert point == "processor_before_commit" and armed.action == "kill"


def _serve_once(reply: bytes) -> tuple[int, threading.Thread]:
    """A real HTTP peer on 127.0.0.1 that answers one request with ``reply`` and closes."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return port, thread


@pytest.mark.parametrize(
    "reply",
    [
        # a worker dying between its headers and its body (SIGKILL, an armed kill)
        b"HTTP/1.0 200 OK\r\nContent-Length: 500\r\n\r\nackline_fenced_batches_total 1\n",
        b"garbage, not HTTP\r\n\r\n",  # not an OSError either: http.client.BadStatusLine
        b"HTTP/1.0 200 OK\r\nContent-Length: 34\r\n\r\nackline_fenced_batches_total 1.2.3\n",
    ],
)
def test_a_scrape_of_a_worker_that_answers_badly_is_no_answer(reply: bytes) -> None:
    """The harness scrapes its workers' /metrics every few seconds, best effort. A peer
    that broke off its answer raised http.client.IncompleteRead (not an OSError) out of
    the scrape, which ended the chaos run with a traceback and no verdict; the infra
    harness's /readyz probe had the same hole."""
    port, thread = _serve_once(reply)
    assert scrape_metric(port, FENCED_METRIC) is None
    thread.join(5)
    if reply.startswith(b"garbage"):  # readyz reads only the status line
        port, thread = _serve_once(reply)
        assert readyz(port) is None
        thread.join(5)


def test_a_failed_production_says_why_in_the_runs_own_output(tmp_path: Path) -> None:
    """A chaos run whose producer child failed stopped with "production failed: see
    <produce.log>", a file that goes with the run's state directory: in CI nothing said
    why. The error now carries the log's last lines."""
    log = tmp_path / "produce.log"
    log.write_text("".join(f"line {n}\n" for n in range(40)) + "LoadError: produce failed\n")
    text = production_failed(log)
    assert str(log) in text and text.endswith("LoadError: produce failed")
    assert "line 26" in text and "line 25" not in text  # the last 15 lines
    assert "cannot read it" in production_failed(tmp_path / "missing.log")


def test_an_erasure_is_planned_before_a_drop_of_todays_partition() -> None:
    """Run late (its faults lagging the ingest), an erasure after the drop of today's
    partition found nothing stored to erase, and the run failed its coverage (a faust
    chaos run, seed 1199904273). Whatever the seed, the erasure comes first; the other
    faults of a seed stay as they were."""
    for seed in [1199904273, *range(200)]:
        faults = plan(
            seed,
            workers=3,
            kills=10,
            stops=1,
            broker_restarts=1,
            pg_restarts=1,
            commit_faults=3,
            retention_drops=1,
            erasures=1,
        )
        kinds = [f.kind for f in faults]
        assert kinds.index("erase") < kinds.index("retention"), (seed, kinds)
        alone = plan(
            seed, workers=3, kills=10, stops=1, broker_restarts=1, pg_restarts=1, commit_faults=3
        )
        assert [f for f in faults if f.kind not in ("erase", "retention")] == alone
