"""The bench's pure parts: the limit's rounds, the flood's records, the proxied broker's
properties, the headline of `make bench` and its targets."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from ackline.core.errors import SettingsError
from ackline.dev.kafka import server_properties
from ackline.load.bench import common, flood, readme, report, rtt
from ackline.load.bench.limit import DEFAULT_WRITER_CONNECTIONS, rounds, writer_connections
from ackline.schemas.decode import Rejection, Row, decode
from ackline.settings import Settings

# -- the limit ---------------------------------------------------------------------------


def test_rounds_group_chunks_per_connection_and_keep_every_record() -> None:
    got = list(rounds(iter(range(25)), chunk=4, width=3))
    assert [[len(c) for c in group] for group in got] == [[4, 4, 4], [4, 4, 4], [1]]
    assert [x for group in got for chunk in group for x in chunk] == list(range(25))


def test_one_connection_is_one_chunk_per_round() -> None:
    assert list(rounds(iter(range(5)), chunk=2, width=1)) == [[[0, 1]], [[2, 3]], [[4]]]


def test_rounds_refuse_an_empty_width() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        list(rounds(iter(range(3)), chunk=1, width=0))


# -- the flood ---------------------------------------------------------------------------


def test_the_flood_holds_its_mix() -> None:
    assert flood.expected() == {
        "valid": 500,
        "too_large": 200,
        "schema_invalid": 200,
        "not_utf8": 200,
    }
    assert len(flood.kinds(flood.FLOOD_RECORDS)) == flood.FLOOD_RECORDS


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("valid", None),
        ("too_large", "too_large"),
        ("schema_invalid", "schema_invalid"),
        ("not_utf8", "not_utf8"),
    ],
)
def test_each_flood_kind_decodes_as_intended_at_about_one_mib(
    kind: str, reason: str | None
) -> None:
    rng = random.Random(7)
    for index in range(3):
        value = flood.flood_value(index, kind, rng)
        assert 900_000 <= len(value) <= 1_100_000
        got = decode(value)
        if reason is None:
            assert isinstance(got, Row), got
            assert len(value) <= flood.MAX_MESSAGE_BYTES
        else:
            assert isinstance(got, Rejection)
            assert got.reason == reason


def test_the_flood_is_seeded_and_spread_over_the_partitions() -> None:
    first = [(r.kind, r.partition, len(r.value)) for r in flood.flood_records(24, 12, seed=3)]
    again = [(r.kind, r.partition, len(r.value)) for r in flood.flood_records(24, 12, seed=3)]
    assert first == again
    assert {p for _, p, _ in first} == set(range(12))


# -- the proxied broker ------------------------------------------------------------------


def test_proxied_properties_add_a_listener_advertised_at_the_proxy(tmp_path: Any) -> None:
    base = server_properties(tmp_path, 9092, 9093)
    text = rtt.proxied_properties(base, 40001, 40002)
    props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert props["listeners"].endswith(",PROXIED://127.0.0.1:40001")
    assert "PLAINTEXT://127.0.0.1:9092" in props["listeners"]
    assert props["advertised.listeners"] == ("PLAINTEXT://127.0.0.1:9092,PROXIED://127.0.0.1:40002")
    assert props["listener.security.protocol.map"].endswith(",PROXIED:PLAINTEXT")
    assert props["inter.broker.listener.name"] == "PLAINTEXT"


def test_proxied_properties_need_the_listener_lines() -> None:
    with pytest.raises(ValueError, match="lacks"):
        rtt.proxied_properties("node.id=1\n", 1, 2)


def test_rtt_best_runs_take_each_run_s_fastest_and_keep_every_rate() -> None:
    done = [
        ("loopback", {"events_per_s": 30_000.0, "cpu_client_s": 1}),
        ("proxied", {"events_per_s": 28_000.0}),
        ("rtt_1ms", {"events_per_s": 25_000.0}),
        ("loopback", {"events_per_s": 36_000.0, "cpu_client_s": 2}),
        ("rtt_1ms", {"events_per_s": 24_000.0}),
    ]
    best = rtt.best_runs(done)
    assert best["loopback"] == {
        "events_per_s": 36_000.0,
        "cpu_client_s": 2,
        "rates": [30_000.0, 36_000.0],
    }
    assert best["rtt_1ms"]["events_per_s"] == 25_000.0
    assert best["rtt_1ms"]["rates"] == [25_000.0, 24_000.0]
    assert best["proxied"]["rates"] == [28_000.0]
    assert rtt.ratios(best)["ratio_at_1ms_rtt"] == round(25_000 / 36_000, 3)
    assert rtt.SEQUENCE.count("loopback") == rtt.SEQUENCE.count("rtt_1ms") == 2


def test_rtt_ratios() -> None:
    runs = {
        "loopback": {"events_per_s": 10_000.0},
        "proxied": {"events_per_s": 9_000.0},
        "rtt_1ms": {"events_per_s": 8_500.0},
    }
    assert rtt.ratios(runs) == {"ratio_at_1ms_rtt": 0.85, "ratio_proxied": 0.9}
    assert rtt.ratios({"loopback": {"events_per_s": 1.0}})["ratio_at_1ms_rtt"] is None


# -- the headline ------------------------------------------------------------------------


def _summary() -> dict[str, Any]:
    def ingest(eps: float, cpu: float, pg: float) -> dict[str, Any]:
        return {"events": 1_000_000, "events_per_s": eps, "cpu_client_s": cpu, "cpu_pg_s": pg}

    return {
        "conditions": {
            "events": 1_000_000,
            "partitions": 12,
            "cores": 2,
            "load_avg_1m_at_start": 1.0,
            "load_avg_1m_at_end": 1.0,
            "peer_settings": {"connect": "1 task, `batch.size=2000`"},
        },
        "systems": {
            "limit": {
                "ingest": {
                    **ingest(40_000, 4, 24),
                    "notes": {"events_per_s_by_connections": {"1": 40_000}},
                }
            },
            "ackline": {
                "ingest": ingest(30_000, 18, 31),
                "replay": {"events_per_s": 48_000},
                "latency": {"offered_rate": 15_000, "p50_ms": 40.0, "p99_ms": 260.0},
            },
            "connect": {"ingest": ingest(12_000, 65, 66)},
            "faust": {
                "ingest": ingest(1_000, 400, 300),
                "replay": {
                    "error": "faust exited 1:\nTraceback\nasyncpg.X.UniqueViolationError: dup key\n"
                },
            },
            "quix": {"error": "boom"},
        },
        "scale_out": {"1": {"events_per_s": 30_000, "cpu_client_s": 18, "cpu_pg_s": 31}},
        "scale_out_connect": {"1": {"events_per_s": 12_000}, "2": {"events_per_s": 19_000}},
        "flood": {"events": 1_100, "peak_rss_mb": 180.0, "wall_s": 30.0, "notes": {}},
        "rtt": {
            "loopback": {"events": 1_000_000, "events_per_s": 30_000, "cpu_client_s": 18},
            "rtt_1ms": {"events": 1_000_000, "events_per_s": 27_000, "cpu_client_s": 18},
            "ratio_at_1ms_rtt": 0.9,
        },
    }


def test_the_last_line_has_every_headline_number() -> None:
    line = report.last_line(_summary())
    assert line["ratio_to_limit"] == 0.75
    assert line["ratio_to_best_peer"] == 2.5
    assert line["best_peer"] == "connect"
    assert line["worker_us_per_event"] == 18.0
    assert line["pg_us_per_event"] == 31.0
    assert (line["p50_ms_half_load"], line["p99_ms_half_load"]) == (40.0, 260.0)
    assert line["replay_ratio"] == 1.6
    assert line["ratio_at_1ms_rtt"] == 0.9
    assert line["flood_peak_rss_mb"] == 180.0
    json.dumps(line)  # the last line is JSON


def test_targets_are_met_missed_or_not_measured() -> None:
    targets = report.last_line(_summary())["targets"]
    assert set(targets) == set(report.TARGETS)
    assert targets["ratio_to_limit>=0.7"] is True
    assert targets["pg_us_per_event<=30"] is False
    assert targets["p99_ms_half_load<=250"] is False
    assert targets["p50_ms_half_load<=50"] is True
    empty = report.ratios({"conditions": {}, "systems": {}})
    assert empty["targets"]["ratio_at_1ms_rtt>=0.8"] is None
    assert empty["flood_peak_rss_mb"] is None


def test_the_recorded_peer_settings_are_the_peers_own() -> None:
    from ackline.load.bench.peers import HERE, PEER_SETTINGS
    from ackline.settings import Settings

    assert "COMMIT_EVERY = 10_000" in (HERE / "quix_app.py").read_text()
    assert "commit_every=10000" in PEER_SETTINGS["quix"]
    # Connect's batch is ackline's own batch cap (docs/performance.md, "The peers' settings")
    cap = Settings.model_fields["batch_max_events"].default
    connector = (HERE / "connect" / "connector.properties").read_text()
    assert f"batch.size={cap}\n" in connector and f"batch.size={cap}`" in PEER_SETTINGS["connect"]
    worker = (HERE / "connect" / "worker.properties").read_text()
    assert f"consumer.max.poll.records={cap}\n" in worker
    assert "CONCURRENCY = 4" in (HERE / "faust_app.py").read_text()
    assert "concurrency=4" in PEER_SETTINGS["faust"]


def test_per_event_cpu() -> None:
    assert report.per_event_us({"events": 500, "cpu_client_s": 0.01}, "cpu_client_s") == 20.0
    assert report.per_event_us({"events": 0, "cpu_client_s": 1.0}, "cpu_client_s") is None


def test_the_page_block_shows_per_event_cpu_the_flood_and_the_rtt_runs() -> None:
    block = readme.block(_summary())
    assert "| 18.0 / 31.0 |" in block  # ackline's µs per event, own / PostgreSQL
    assert "upsert, 1 task, `batch.size=2000` | 12,000 |" in block
    assert "| died: asyncpg.X.UniqueViolationError: dup key |" in block
    assert "peak RSS 180 MB" in block
    assert "through the proxies, +1 ms round trip | 27,000 | 0.90 |" in block
    assert "The limit is the best of 1 and N parallel COPY connections" in block
    assert "≥ 0.8 x loopback at 1 ms RTT" in block
    assert "same count of tasks: 1 task 12,000/s, 2 tasks 19,000/s." in block


def test_the_page_block_shows_every_run_of_the_limit_when_it_ran_more_than_once() -> None:
    summary = _summary()
    summary["systems"]["limit"]["ingest"]["notes"] = {
        "events_per_s_by_connections": {"1": 80_261, "2": 109_864},
        "runs_by_connections": {"1": [23_325, 80_261], "2": [109_864, 60_156]},
    }
    block = readme.block(summary)
    assert (
        "The limit is the best run of 1 and N parallel COPY connections (1 connection "
        "80,261/s (runs 23,325 / 80,261), 2 connections 109,864/s (runs 109,864 / 60,156))."
    ) in block


def test_a_limit_run_count_below_one_stops_the_bench_at_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ackline.load.bench import run

    with pytest.raises(SystemExit) as stopped:
        run.main(["--limit-tries", "0"])
    assert stopped.value.code == 2
    assert "--limit-tries must be at least 1, not 0" in capsys.readouterr().err


def test_the_limit_is_taken_over_the_worker_s_writer_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The limit's widest COPY round is as wide as the bench's worker writes: its
    ACKLINE_WRITER_CONNECTIONS, else the setting's default (which the load floor repeats)."""
    assert Settings.model_fields["writer_connections"].default == DEFAULT_WRITER_CONNECTIONS
    monkeypatch.delenv("ACKLINE_WRITER_CONNECTIONS", raising=False)
    assert writer_connections() == DEFAULT_WRITER_CONNECTIONS
    monkeypatch.setenv("ACKLINE_WRITER_CONNECTIONS", "2")
    assert writer_connections() == 2
    monkeypatch.setenv("ACKLINE_WRITER_CONNECTIONS", "two")
    with pytest.raises(SettingsError, match="ACKLINE_WRITER_CONNECTIONS"):
        writer_connections()


def test_run_topics_are_the_names_holding_the_run_id() -> None:
    names = [
        "bench-events-ab12cd34",
        "bench-events-ab12cd34.connect",
        "lat-ackline-ab12cd34",
        "bench-events-ab12cd34.dlq",
        "bench-events-ffff0000",
        "__consumer_offsets",
    ]
    assert common.run_topics(names, "ab12cd34") == [
        "bench-events-ab12cd34",
        "bench-events-ab12cd34.connect",
        "bench-events-ab12cd34.dlq",
        "lat-ackline-ab12cd34",
    ]
