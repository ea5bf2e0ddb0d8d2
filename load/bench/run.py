"""`make bench`: ackline's throughput beside the COPY limit and three peers, in one run.

Phases, all on the bench's own stack (``.ackline/bench``: Kafka + PostgreSQL with
``track_commit_timestamp = on``, started here and stopped at the end when started here):

1. data: N events (:mod:`ackline.load.bench.data`) replayed into a fresh 12-partition topic, and
   their schema'd-JSON copy into ``<topic>.connect`` for Kafka Connect (untimed);
2. first ingest, a backlog drain of the N events, per system: the limit (COPY, no
   Kafka), ackline with 1 worker, then 2 and 3 workers (scale-out), Quix Streams, Kafka
   Connect + Debezium JDBC sink, the naive faust agent. Each gets a fresh database;
3. replay: the whole topic again (100 % duplicates, 1 % with a changed body) appended
   with ``ackline.load.capture.replay``, and each system drains it on the same database
   and group;
4. latency: for each system, a fresh topic fed by ``ackline.load.capture.replay`` at a
   fixed rate (half of ackline's first-ingest rate); produce-to-commit = PostgreSQL
   commit timestamp of the row minus the record's Kafka CreateTime.

After ackline's first ingest, the ``runs`` processor (`ackline process runs
--until-caught-up`, docs/processors.md) applies the N ingested events of that database:
its rate is events after its first batch over the time from its first to its last commit.

Rates are steady rates from the rows' commit timestamps (:func:`measure.steady_rate`:
events after the first commit over the time from the first to the last commit), so
process start-up and group joins do not count, whatever a system's batch size; the
limit's is its rows over its timed COPY + COMMIT seconds. CPU is
the system's own processes (rusage) plus PostgreSQL's and the broker's CPU over the
phase; peak RSS is the system's processes'.

Why this module is longer than the house's ~500 lines: it is the bench's script, its
phases in the order they run, each a short function over one shared stack and result
dict; the measuring, the peers, the report and the other phases are modules of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ackline.core.signals import terminate_as_exit
from ackline.dev import stack
from ackline.dev.errors import DevStackError
from ackline.load.bench import flood, report, rtt
from ackline.load.bench import readme as bench_readme
from ackline.load.bench.common import (
    PARTITIONS,
    ROOT,
    BenchError,
    Cluster,
    Phase,
    RowCounter,
    bench_stack,
    drain_backlog,
    fill,
    host_port,
    load_avg,
    say,
    settle_disk,
    stop_all,
    wait_for,
)
from ackline.load.bench.data import Dataset, ensure_topic_patiently, event_id_of, head, prepare
from ackline.load.bench.limit import writer_connections
from ackline.load.bench.measure import Measured, percentile
from ackline.load.bench.peers import PEER_SETTINGS, ensure_connect_jars, ensure_python_peers
from ackline.load.bench.systems import (
    Ackline,
    AcklineFaust,
    Connect,
    Env,
    Faust,
    Quix,
    System,
    fresh_database,
    query,
    run_sql,
)
from ackline.load.capture.file import CaptureReader
from ackline.load.capture.replay import Pace, replay
from ackline.load.capture.topics import RangeSpec, open_range
from ackline.load.errors import LoadError
from ackline.streams.admin import ensure_topic

RESULTS = Path(__file__).resolve().parent / "results.json"
CHART = Path(__file__).resolve().parent / "results.png"
LIMIT_TRIES = 2
"""Runs of the limit at each connection count (its rate is the best): about a minute each."""


@dataclass
class Bench:
    env: Env
    cluster: Cluster
    data: Dataset
    topic: str
    results: dict[str, Any] = field(default_factory=dict)

    # -- the limit --------------------------------------------------------------------

    def limit(self, writers: int = 1, tries: int = LIMIT_TRIES) -> Phase:
        """The best of ``tries`` runs each of 1 and ``writers`` parallel COPY connections
        (each run a fresh database). A ceiling is its best run: one slow spell of the
        host during a single run made the limit 23,325/s on one connection where the
        same code had made 80,261, and ackline's ratio to it looked better than it is."""
        best: Phase | None = None
        runs: dict[str, list[float]] = {}
        for width in sorted({1, writers}):
            for _ in range(tries):
                phase = self._limit(width)
                runs.setdefault(str(width), []).append(round(phase.events_per_s))
                if best is None or phase.events_per_s > best.events_per_s:
                    best = phase
        assert best is not None
        best.notes["events_per_s_by_connections"] = {w: max(r) for w, r in runs.items()}
        best.notes["runs_by_connections"] = runs
        return best

    def _limit(self, connections: int) -> Phase:
        say(f"limit: COPY of the same rows over {connections} connection(s), no Kafka")
        name = "bench_limit" if connections == 1 else f"bench_limit_{connections}"
        dsn = run_sql(lambda: fresh_database(self.env, name, migrated=True))
        settle_disk(self.env)
        cpu0 = self.cluster.cpu()
        log = self.env.logs / f"limit-{connections}.log"
        argv = [sys.executable, "-m", "ackline.load.bench.limit", dsn, str(self.data.capture)]
        proc = Measured([*argv, "--connections", str(connections)], dict(os.environ), log, ROOT)
        result = proc.reap(3600)
        if result.returncode != 0:
            raise BenchError(f"the limit failed:\n{proc.log_text()[-3000:]}")
        out = json.loads(proc.log_text().strip().splitlines()[-1])
        phase = Phase(events=int(out["rows"]))
        fill(phase, [result], cpu0, self.cluster)
        phase.cpu_client_s = float(out["copy_cpu_s"])  # the COPY, not the untimed decode
        # The limit's time is its COPY + COMMIT time only: its commit timestamps would
        # also count the untimed decoding between chunks.
        phase.wall_s = float(out["copy_seconds"])
        phase.events_per_s = phase.events / max(phase.wall_s, 1e-9)
        phase.notes["connections"] = connections
        phase.notes["decode_us_per_event"] = round(float(out["decode_us_per_event"]), 1)
        phase.notes["load_avg_1m"] = load_avg()
        say(f"limit over {connections} connection(s): {phase.events_per_s:,.0f} events/s")
        return phase

    # -- first ingest -----------------------------------------------------------------

    def ingest(self, system: System) -> Phase:
        topic = system.input_topic(self.topic)
        return drain_backlog(system, topic, self.data.events, self.cluster)

    # -- a processor ------------------------------------------------------------------

    def processor(self, system: Ackline, name: str = "runs") -> Phase:
        """`ackline process NAME --until-caught-up` on ``system``'s ingested database."""
        say(f"processor {name}: applying the events ingested by {system.name}")
        settle_disk(self.env)
        cpu0 = self.cluster.cpu()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACKLINE_")}
        env.update(
            {
                "ACKLINE_DATABASE_URL": system.dsn,
                "ACKLINE_LOG_FORMAT": "json",
                "ACKLINE_WORKER_ID": f"bench-{name}",
            }
        )
        argv = [sys.executable, "-m", "ackline", "process", name, "--until-caught-up"]
        proc = Measured(argv, env, self.env.logs / f"processor-{name}.log", cwd=ROOT)
        result = proc.reap(3600)
        reports = [
            json.loads(line)
            for line in proc.log_text().splitlines()
            if line.startswith('{"instance"')
        ]
        if result.returncode != 0 or not reports:
            raise BenchError(f"processor {name} failed:\n{proc.log_text()[-3000:]}")
        (report,) = reports[-1]["processors"]
        applied, batches = int(report["applied"]), int(report["batches"])
        times = sorted(
            float(r["t"])
            for r in run_sql(
                lambda: query(
                    system.dsn,
                    "SELECT DISTINCT extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8"
                    " AS t FROM run_facts",
                )
            )
        )
        phase = Phase(events=applied)
        fill(phase, [result], cpu0, self.cluster)
        phase.wall_s = result.wall_s
        # events after the first batch over first-to-last commit: start-up does not count
        first = applied / max(batches, 1)
        span = times[-1] - times[0] if len(times) > 1 else 0.0
        phase.events_per_s = (applied - first) / span if span > 0 else applied / result.wall_s
        phase.notes["batches"] = batches
        phase.notes["outcome"] = report["outcome"]
        phase.notes["load_avg_1m"] = load_avg()
        say(f"processor {name}: {phase.events_per_s:,.0f} events/s applied")
        return phase

    # -- replay -----------------------------------------------------------------------

    def append_replay(self) -> None:
        say("replay: appending the whole topic again (1 % changed) to both topics")
        for capture, topic in (
            (self.data.replay_capture, self.topic),
            (self.data.connect_replay_capture, f"{self.topic}.connect"),
        ):
            with CaptureReader(capture) as reader:
                replay(
                    self.env.bootstrap,
                    reader,
                    topic,
                    Pace("max"),
                    source_partitions=list(reader.header.ranges),
                )

    def replayed(self, system: System, changed: dict[str, str]) -> Phase:
        topic = system.input_topic(self.topic)
        say(f"{system.name}: replay of {self.data.events:,} duplicates (1 % changed)")
        total = 2 * self.data.events
        first_batch = system.last_batch() if isinstance(system, Ackline) else 0
        base = system.committed(topic, PARTITIONS)
        settle_disk(self.env)
        samples: list[tuple[float, int]] = []

        def progress() -> int:
            value = system.committed(topic, PARTITIONS)
            samples.append((time.time(), value))
            return value

        cpu0 = self.cluster.cpu()
        started = time.time()
        system.start(topic)
        done = False
        try:
            done = wait_for(
                lambda: progress() >= (total if isinstance(system, Ackline) else _end(self, topic)),
                system,
                timeout=600 + self.data.events / 500,
                what="the replay to be consumed",
                stall_after=60.0,
                progress=lambda: samples[-1][1] if samples else 0,
            )
        finally:
            results = stop_all(system)
        phase = Phase(events=self.data.events)
        fill(phase, results, cpu0, self.cluster)
        if isinstance(system, Ackline):
            weighted = system.batch_commit_times(first_batch)
            phase.events_per_s = _weighted_rate(weighted)
            phase.wall_s = max((t for t, _ in weighted), default=started) - started
            phase.notes["conflicts_quarantined"] = system.conflicts()
        else:
            phase.events_per_s = _sampled_rate(samples, base, started)
            phase.wall_s = (samples[-1][0] - started) if samples else 0.0
        consumed = (samples[-1][1] if samples else base) - base
        phase.notes["consumed"] = consumed
        phase.notes["finished"] = done
        if not done:
            phase.notes["stalled"] = _first_error(system)
        phase.notes["changed_bodies"] = len(changed)
        phase.notes.update(system.changed_outcome(changed))
        phase.notes["rows_after"] = system.rows()
        phase.notes["load_avg_1m"] = load_avg()
        phase.notes["verdict"] = _verdict(system, phase)
        say(f"{system.name}: replay {phase.events_per_s:,.0f} events/s; {phase.notes['verdict']}")
        return phase

    # -- latency ----------------------------------------------------------------------

    def latency(self, system: System, rate: float, count: int, tag: str = "") -> dict[str, Any]:
        warm = 200
        base_topic = f"lat{tag}-{system.name}-{self.env.run_id}"
        topic = system.input_topic(base_topic)
        capture = self.data.connect_capture if isinstance(system, Connect) else self.data.capture
        say(f"{system.name}: latency at {rate:,.0f} events/s ({count:,} events)")
        ensure_topic(self.env.bootstrap, topic, PARTITIONS)
        system.reset()
        settle_disk(self.env)
        counter = RowCounter(system.dsn, system.table)  # not a new connection per poll
        parts = list(range(PARTITIONS))
        try:
            system.start(topic)  # in the try: a start that fails still closes the counter
            # One producer for both: the timed records go out on a producer that has its
            # producer id, so none of them waits out the producer's own start-up.
            sent = replay(
                self.env.bootstrap,
                head(capture, warm + count),
                topic,
                Pace("rate", rate),
                source_partitions=parts,
                warm=warm,
                on_warm=lambda: wait_for(
                    lambda: counter.reached(warm), system, 300, "the warm-up rows"
                ),
            )
            wait_for(
                lambda: counter.reached(warm + count),
                system,
                timeout=300 + count / 200,
                what="the timed rows",
            )
        finally:
            try:
                counter.close()
            finally:
                stop_all(system)
        created = _create_times(self.env.bootstrap, topic, skip=warm)
        committed = system.commit_times_by_id()
        lat = [1000 * (committed[i] - ts) for i, ts in created.items() if i in committed]
        return {
            "offered_rate": round(rate),
            "achieved_produce_rate": round(sent.rate),
            "events": len(lat),
            "p50_ms": round(percentile(lat, 0.50), 1),
            "p99_ms": round(percentile(lat, 0.99), 1),
            "max_ms": round(max(lat), 1) if lat else None,
        }


def _end(bench: Bench, topic: str) -> int:
    """Sum of the topic's high watermarks."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bench.env.bootstrap, "group.id": "bench-watermarks"})
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        )
    finally:
        consumer.close()


def _create_times(bootstrap: str, topic: str, skip: int) -> dict[str, float]:
    """event_id -> CreateTime (epoch s) of the topic's records, the first ``skip`` left out."""
    _, records = open_range(bootstrap, topic, RangeSpec())
    ordered = sorted(records, key=lambda r: r.timestamp)
    return {event_id_of(r.value or b"{}"): r.timestamp / 1000 for r in ordered[skip:]}


def _weighted_rate(batches: list[tuple[float, int]]) -> float:
    if len(batches) < 2:
        return 0.0
    ordered = sorted(batches)
    span = ordered[-1][0] - ordered[0][0]
    return sum(n for _, n in ordered[1:]) / span if span > 0 else 0.0


def _sampled_rate(samples: list[tuple[float, int]], base: int, started: float) -> float:
    """Rate between the first and the last sample that moved; from ``started`` when the
    whole replay was committed at once (small runs, long commit intervals)."""
    moved = [(t, v) for t, v in samples if v > base]
    if not moved:
        return 0.0
    (t0, v0), (t1, v1) = moved[0], moved[-1]
    if v1 == v0 or t1 <= t0:
        return (v1 - base) / (t1 - started) if t1 > started else 0.0
    return (v1 - v0) / (t1 - t0)


_EXCEPTION_LINE = re.compile(r"^[\w.]+(?:Error|Exception): .*")


def _first_error(system: System) -> str:
    """The first exception line in the system's log (what stalled it)."""
    for proc in system.procs:
        for line in proc.log_text().splitlines():
            if _EXCEPTION_LINE.match(line.strip()):
                return line.strip()[:300]
    return "no progress for 60 s"


def _verdict(system: System, phase: Phase) -> str:
    n = phase.notes
    changed, over, kept = n["changed_bodies"], n["overwritten"], n["kept"]
    if isinstance(system, Ackline):
        quarantined = n.get("conflicts_quarantined", 0)
        return (
            f"quarantined {quarantined:,} of {changed:,} changed bodies as conflicts; "
            "stored rows kept"
        )
    if not n["finished"]:
        return (
            f"stalled after {n['consumed']:,} of {phase.events:,} records: {n.get('stalled', '')}"
        )
    if over:
        return f"overwrote {over:,} of {changed:,} stored rows with the changed bodies"
    return f"silently dropped {kept:,} of {changed:,} changed bodies (no record of them)"


def conditions(events: int) -> dict[str, Any]:
    load1, load5, _ = os.getloadavg()
    return {
        "events": events,
        "partitions": PARTITIONS,
        "cores": os.cpu_count(),
        "load_avg_1m_at_start": round(load1, 2),
        "load_avg_5m_at_start": round(load5, 2),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": sys.version.split()[0],
        "peer_settings": dict(PEER_SETTINGS),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ackline.load.bench", description=__doc__)
    p.add_argument("--events", type=int, default=int(os.environ.get("BENCH_EVENTS", "1000000")))
    p.add_argument("--only", default="", help=f"comma list of: {','.join(ALL)}")
    p.add_argument("--no-replay", action="store_true")
    p.add_argument("--no-latency", action="store_true")
    p.add_argument("--latency-seconds", type=float, default=20.0)
    p.add_argument(
        "--limit-connections",
        type=int,
        default=None,
        help="the limit is the best of 1 and this many parallel COPY connections (default: "
        "the connections the bench's ackline worker writes over, ACKLINE_WRITER_CONNECTIONS)",
    )
    p.add_argument(
        "--limit-tries",
        type=int,
        default=LIMIT_TRIES,
        help=f"runs of the limit at each connection count; it is the best (default: {LIMIT_TRIES})",
    )
    p.add_argument("--flood-records", type=int, default=flood.FLOOD_RECORDS)
    p.add_argument("--keep", action="store_true", help="leave the bench stack running")
    p.add_argument("--results", default=str(RESULTS))
    args = p.parse_args(argv)
    if args.limit_tries < 1:
        p.error(f"--limit-tries must be at least 1, not {args.limit_tries}")
    state_dir = ROOT / ".ackline" / "bench"
    run_id = uuid.uuid4().hex[:8]
    logs = state_dir / "logs" / run_id
    logs.mkdir(parents=True, exist_ok=True)
    say(f"run {run_id}: logs in {logs}")
    # SIGTERM raises through the finally that stops it all; once there it is ignored.
    with terminate_as_exit():
        with bench_stack(state_dir, run_id, keep=args.keep) as info:
            summary = _run(args, state_dir, logs, run_id, info)
        # Still ignoring SIGTERM: the results, the chart and the README are written whole.
        results = Path(args.results)
        # The committed chart goes with the committed results; a smoke's beside its own.
        report.write(summary, results, CHART if results == RESULTS else results.with_suffix(".png"))
        if results == RESULTS:  # docs/performance.md's tables: the committed results
            bench_readme.update(RESULTS)
    print(report.table(summary))
    print(json.dumps(report.last_line(summary)), flush=True)
    return 0


def _run(
    args: argparse.Namespace, state_dir: Path, logs: Path, run_id: str, info: stack.StackInfo
) -> dict[str, Any]:
    only = set(filter(None, args.only.split(","))) or set(ALL)
    host, port = host_port(info.database_url)
    env = Env(info.kafka_bootstrap, host, port, state_dir, logs, run_id)
    say("installing the peers (pip into .ackline/bench/peers-venv, Maven into the cache)")
    if only & {"quix", "faust"}:
        env.peers_python = ensure_python_peers(state_dir)
    if "connect" in only:
        env.connect_jars = ensure_connect_jars()
    data = prepare(env.bootstrap, args.events, state_dir / "data", say)
    topic = f"bench-events-{run_id}"
    for capture, name in ((data.capture, topic), (data.connect_capture, f"{topic}.connect")):
        ensure_topic_patiently(env.bootstrap, name, PARTITIONS)
        with CaptureReader(capture) as reader:
            parts = list(reader.header.ranges)
            say(replay(env.bootstrap, reader, name, Pace("max"), source_partitions=parts).render())
    bench = Bench(env, Cluster(state_dir), data, topic)
    summary: dict[str, Any] = {"conditions": conditions(args.events), "systems": {}}
    systems = _first_ingest(bench, only, summary, args)
    if not args.no_replay and systems:
        _replays(bench, systems, summary["systems"])
    if not args.no_latency and "ackline" in summary["systems"]:
        _latencies(bench, systems, summary["systems"], args)
    if "flood" in only:
        try:
            summary["flood"] = flood.drain(env, bench.cluster, args.flood_records).to_json()
        except BenchError as exc:
            say(f"flood failed: {exc}")
            summary["flood"] = {"error": str(exc)[:2000]}
    if "rtt" in only:
        try:
            summary["rtt"] = rtt.measure(env, data)
        except (BenchError, LoadError, DevStackError) as exc:
            say(f"rtt failed: {exc}")
            summary["rtt"] = {"error": str(exc)[:2000]}
    summary["conditions"]["load_avg_1m_at_end"] = load_avg()
    return summary


def _replays(bench: Bench, systems: dict[str, System], out: dict[str, Any]) -> None:
    """Phase 3: the whole topic again, every system drains it on its database and group."""
    bench.append_replay()
    changed = bench.data.changed_ids()
    for name, system in systems.items():
        try:
            out[name]["replay"] = bench.replayed(system, changed).to_json()
        except BenchError as exc:
            out[name]["replay"] = {"error": str(exc)[:2000]}


def _latencies(
    bench: Bench, systems: dict[str, System], out: dict[str, Any], args: argparse.Namespace
) -> None:
    """Phase 4: produce-to-commit latency at half of ackline's maximum (and, for a system
    slower than that, at half of its own)."""
    env, run_id = bench.env, bench.env.run_id
    rate = 0.5 * out["ackline"]["ingest"]["events_per_s"]
    count = min(int(rate * args.latency_seconds), args.events - 200)
    for name, system in systems.items():
        fresh = type(system)(name, env, group=f"bench-lat-{name}-{run_id}")
        try:
            out[name]["latency"] = bench.latency(fresh, rate, count)
        except BenchError as exc:
            out[name]["latency"] = {"error": str(exc)[:2000]}
        # A system slower than the common rate is overloaded there: also measure it at
        # half of its own maximum, the rate it can sustain (same definition as ackline's).
        own = 0.5 * out[name]["ingest"]["events_per_s"]
        if own < rate:
            own_count = min(int(own * args.latency_seconds), args.events - 200)
            fresh = type(system)(name, env, group=f"bench-lat-own-{name}-{run_id}")
            try:
                out[name]["latency_own_half"] = bench.latency(fresh, own, own_count, "own")
            except BenchError as exc:
                out[name]["latency_own_half"] = {"error": str(exc)[:2000]}


ALL = (
    "limit",
    "ackline",
    "runs",
    "ackline-faust",
    "scale",
    "quix",
    "connect",
    "faust",
    "flood",
    "rtt",
)


def _first_ingest(
    bench: Bench, only: set[str], summary: dict[str, Any], args: argparse.Namespace
) -> dict[str, System]:
    """Phase 2: every system drains the backlog; returns those that can go on."""
    env, out = bench.env, summary["systems"]
    systems: dict[str, System] = {}
    if "limit" in only:
        width = args.limit_connections or writer_connections()
        out["limit"] = {"ingest": bench.limit(width, args.limit_tries).to_json()}
    if "ackline" in only or "scale" in only:
        ingested = Ackline("ackline", env)
        systems["ackline"] = ingested
        out["ackline"] = {"ingest": bench.ingest(ingested).to_json()}
        if "runs" in only:  # the runs processor on what ackline just ingested
            try:
                phase = bench.processor(ingested)
                summary["processors"] = {"runs": phase.to_json()}
            except BenchError as exc:
                say(f"processor runs failed: {exc}")
                summary["processors"] = {"runs": {"error": str(exc)[:2000]}}
    if "ackline-faust" in only:  # ackline's sink in a Faust agent (docs/faust.md)
        on_faust = AcklineFaust("ackline-faust", env)
        try:
            out["ackline-faust"] = {"ingest": bench.ingest(on_faust).to_json()}
            systems["ackline-faust"] = on_faust
        except BenchError as exc:
            say(f"ackline-faust failed: {exc}")
            out["ackline-faust"] = {"error": str(exc)[:2000]}
    if "scale" in only:
        summary["scale_out"] = {"1": out["ackline"]["ingest"]}
        for n in (2, 3):
            workers = Ackline(f"ackline{n}", env, workers=n)
            summary["scale_out"][str(n)] = bench.ingest(workers).to_json()
    peers: tuple[tuple[str, type[System]], ...] = (
        ("quix", Quix),
        ("connect", Connect),
        ("faust", Faust),
    )
    for name, cls in peers:
        if name not in only:
            continue
        system = cls(name, env)
        try:
            out[name] = {"ingest": bench.ingest(system).to_json()}
            systems[name] = system
        except BenchError as exc:
            say(f"{name} failed: {exc}")
            out[name] = {"error": str(exc)[:2000]}
    if "scale" in only and "connect" in systems:
        _connect_two_tasks(bench, summary)
    return systems


def _connect_two_tasks(bench: Bench, summary: dict[str, Any]) -> None:
    """Kafka Connect given two tasks, beside ackline's two workers in the scale-out."""
    env = bench.env
    two = Connect("connect2", env, group=f"bench-jdbc2-{env.run_id}", tasks=2)
    try:
        summary["scale_out_connect"] = {
            "1": summary["systems"]["connect"]["ingest"],
            "2": bench.ingest(two).to_json(),
        }
    except BenchError as exc:
        say(f"connect with 2 tasks failed: {exc}")
        summary["scale_out_connect"] = {"error": str(exc)[:2000]}


if __name__ == "__main__":
    raise SystemExit(main())
