"""The asynchronous failover, side by side: ackline and Kafka Connect + Debezium JDBC sink.

Same data, same moment (docs/faults.md, "Side by side"): ``events`` clean events are
produced once (a manifest records them) into a topic for ackline and copied, record for
record and partition for partition, as schema'd JSON into a topic for Kafka Connect (the
Debezium JDBC sink needs a schema: :func:`ackline.load.bench.data.to_connect`, as in `make
bench`). Both sinks write to the same PostgreSQL pair (one database each), both through a
multi-host address that finds the primary (``target_session_attrs=read-write``,
``targetServerType=primary``). While both are ingesting, one asynchronous failover: the
WAL sender is held back ``lag_s`` while both keep committing, the primary crashes, the
standby is promoted, the old primary is rebuilt. Then both drain and are compared with
the manifest: events missing (lost) and rows beyond one per event (duplicated).

Kafka Connect commits its consumer offsets to Kafka after its writes (every second here,
``offset.flush.interval.ms``); when the failover takes back writes whose offsets Kafka
already has, nothing in Connect rewrites them. ackline's offsets roll back with its rows.
A Connect task that fails is restarted through its REST API, as an operator would (noted).

Why this module is longer than the house's ~500 lines: it drives two systems through
one scenario (the Kafka Connect worker, its REST calls and its JDBC sink beside
ackline's workers) and compares both with one manifest; the scenario reads top down.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import asyncpg
from confluent_kafka import Consumer, Producer, TopicPartition

from ackline.core.signals import ignore_sigterm, run_stoppable, terminate_as_exit
from ackline.load.chaos.probe import Pg
from ackline.load.chaos.workers import WorkerPool, production_failed, wait_for
from ackline.load.errors import LoadError
from ackline.load.generate import Knobs
from ackline.load.manifest import read_manifest
from ackline.load.verify import expected_outcome, is_drained, verify

CLEAN = Knobs(redeliver=0.0, retry=0.0, conflict_ledger=0.0, conflict_pk=0.0, poison=0.0, abort=0.0)
GHOST = "ackline_chaos_ghost"
TABLE = "activity_connect"


@dataclass
class SystemResult:
    name: str
    expected: int
    rows: int = 0
    distinct: int = 0
    lost: int = 0
    duplicated: int = 0
    rolled_back_rows: int = 0
    """Rows the primary had acknowledged at the crash and the new primary had not."""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "expected": self.expected,
            "rows": self.rows,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "rolled_back_rows": self.rolled_back_rows,
            "notes": self.notes,
        }


@dataclass
class SideBySide:
    seed: int
    events: int
    lag_s: float
    ackline: SystemResult
    connect: SystemResult
    ackline_verdict_ok: bool
    failover_at: dict[str, float]
    """Share of the events each system had ingested when the primary crashed."""
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "events": self.events,
            "wal_sender_held_s": self.lag_s,
            "failover_at": {k: round(v, 3) for k, v in self.failover_at.items()},
            "ackline": {**self.ackline.to_json(), "verify_exact": self.ackline_verdict_ok},
            "kafka_connect_debezium_jdbc": self.connect.to_json(),
            "duration_s": round(self.duration_s, 1),
        }

    def render(self) -> str:
        lines = [
            f"async failover side by side, seed {self.seed}: {self.events:,} events, WAL sender "
            f"held {self.lag_s:g} s before the crash, at "
            + ", ".join(f"{k} {v:.0%}" for k, v in self.failover_at.items()),
            f"{'':<36}{'rows':>10}{'lost':>8}{'dup':>6}{'rolled back':>13}",
        ]
        for r in (self.ackline, self.connect):
            lines.append(
                f"{r.name:<36}{r.rows:>10,}{r.lost:>8,}{r.duplicated:>6,}{r.rolled_back_rows:>13,}"
            )
            lines += [f"  note: {n}" for n in r.notes]
        return "\n".join(lines)


_A_ROWS = "SELECT count(*) AS n FROM activity"
_C_ROWS = "SELECT count(*) AS n FROM activity_connect"
_C_CHECK = """
SELECT count(*) AS rows, count(DISTINCT t.event_id) AS distinct_ids,
       (SELECT count(*) FROM unnest($1::uuid[]) AS e(id)
        WHERE NOT EXISTS (SELECT 1 FROM activity_connect x WHERE x.event_id = e.id)) AS lost
FROM activity_connect AS t
"""
GROUP = "sbs-ackline"


def run_side_by_side(
    state_dir: Path,
    events: int = 200_000,
    seed: int | None = None,
    lag_s: float = 2.0,
    workers: int = 2,
    rate: float = 1000.0,
    out: TextIO = sys.stdout,
) -> SideBySide:
    """One side-by-side run on its own infrastructure stack (stopped at the end). Call it
    inside :func:`~ackline.core.signals.terminate_as_exit` (``main`` does): its teardown
    ignores SIGTERM until that block ends, so a SIGTERM cannot cut the stack's stop."""
    from ackline.dev import infra as stack
    from ackline.load.bench.peers import ensure_connect_jars

    seed = seed if seed is not None else random.SystemRandom().randrange(1, 1 << 31)
    jars = ensure_connect_jars()
    state_dir = state_dir.absolute()
    infra = stack.up(state_dir, slots=1, mode="async", disk=False, timeout=600)
    run = _SideBySideRun(infra, state_dir / "sidebyside", jars, events, seed, lag_s, rate, out)
    try:
        return run.run(workers)
    finally:
        ignore_sigterm()  # the stack is stopped whatever comes now
        try:
            run.close()
        finally:  # a close that raised must not leave the stack running
            stack.down(state_dir)


class _SideBySideRun:
    def __init__(
        self,
        infra: Any,
        run_dir: Path,
        jars: Any,
        events: int,
        seed: int,
        lag_s: float,
        rate: float,
        out: TextIO,
    ) -> None:
        self.infra, self.run_dir, self.jars = infra, run_dir, jars
        self.events, self.seed, self.lag_s, self.rate, self.out = events, seed, lag_s, rate, out
        self.started = time.monotonic()
        self.topic = f"sbs-{seed}"
        self.manifest = run_dir / "manifest.jsonl.gz"
        self.pool: WorkerPool | None = None
        self.connect: _Connect | None = None
        self.copier: _Copier | None = None
        self.producer: subprocess.Popen[bytes] | None = None
        self.a_pg: Pg | None = None
        self.c_pg: Pg | None = None

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {text}", file=self.out, flush=True)

    def run(self, workers: int) -> SideBySide:
        connect = self._start(workers)
        at = self._until_halfway()
        self.say(f"both ingesting ({at}); asynchronous failover, WAL sender held {self.lag_s:g} s")
        before = _failover(self.infra, self.lag_s)
        a_pg, c_pg = self._reconnect()
        after = {"ackline": _count(a_pg, _A_ROWS), "connect": _count(c_pg, _C_ROWS)}
        self.say(f"rows acknowledged before the crash {before}, on the new primary {after}")
        self.infra.pair.rebuild("async")
        self.infra.record()
        self._drain(connect, a_pg, c_pg)
        return self._measure(before, after, at, connect, c_pg)

    def _start(self, workers: int) -> _Connect:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _topics(self.infra.bootstrap, self.topic)
        run_stoppable(_databases(self.infra.admin_dsn()))
        self.pool = _ackline_workers(self.infra, self.run_dir, self.topic, workers)
        connect = self.connect = _Connect(
            self.infra, self.run_dir, self.jars, f"{self.topic}.connect"
        )
        connect.start()
        if not wait_for(lambda: connect.state() == "RUNNING", 600):
            raise LoadError("Kafka Connect's task did not start")
        self.say(f"{workers} ackline workers and Kafka Connect (Debezium JDBC sink) are up")
        self.producer = _start_producer(
            self.infra.bootstrap,
            self.topic,
            self.events,
            self.seed,
            self.rate,
            self.manifest,
            self.run_dir,
        )
        self.copier = _Copier(self.infra.bootstrap, self.topic, f"{self.topic}.connect")
        self.copier.start()
        self.say(
            f"producing {self.events:,} clean events at {self.rate:g}/s to {self.topic}; each "
            f"is copied as schema'd JSON to {self.topic}.connect for Connect"
        )
        return connect

    def _reconnect(self) -> tuple[Pg, Pg]:
        for pg in (self.a_pg, self.c_pg):
            if pg is not None:
                pg.close()
        self.a_pg = Pg(self.infra.admin_dsn("sbs_ackline"))
        self.c_pg = Pg(self.infra.admin_dsn("sbs_connect"))
        return self.a_pg, self.c_pg

    def _production_failed(self) -> bool:
        return self.producer is not None and self.producer.poll() not in (None, 0)

    def _until_halfway(self) -> dict[str, float]:
        a_pg, c_pg = self._reconnect()

        def share(pg: Pg, sql: str) -> float:
            rows = pg.try_fetch(sql)
            return int(rows[0]["n"]) / self.events if rows else 0.0

        def halfway() -> bool:
            if self._production_failed():
                raise LoadError(production_failed(self.run_dir / "produce.log"))
            return min(share(a_pg, _A_ROWS), share(c_pg, _C_ROWS)) >= 0.4

        if not wait_for(halfway, 3600):
            raise LoadError("the two sinks did not both reach 40% of the events")
        return {"ackline": share(a_pg, _A_ROWS), "kafka connect": share(c_pg, _C_ROWS)}

    def _drain(self, connect: _Connect, a_pg: Pg, c_pg: Pg) -> None:
        producer, copier = self.producer, self.copier
        assert producer is not None and copier is not None
        if not wait_for(lambda: producer.poll() is not None, 3600, connect.tick):
            raise LoadError("production did not finish")
        if producer.returncode != 0:
            raise LoadError(production_failed(self.run_dir / "produce.log"))
        copier.finish()
        last = expected_outcome(read_manifest(self.manifest).records).max_offsets

        def ackline_drained() -> bool:
            offsets = a_pg.next_offsets(GROUP, self.topic)
            return offsets is not None and is_drained(last, offsets)

        if not wait_for(ackline_drained, 1800, connect.tick):
            raise LoadError("ackline did not drain after the failover")
        self.say("ackline drained; waiting for Kafka Connect to drain")
        connect.wait_drained(c_pg, 1800)
        self.say("Kafka Connect drained (its group's offsets at the log end, its rows steady)")

    def _measure(
        self,
        before: dict[str, int],
        after: dict[str, int],
        at: dict[str, float],
        connect: _Connect,
        c_pg: Pg,
    ) -> SideBySide:
        verdict = run_stoppable(verify(self.infra.admin_dsn("sbs_ackline"), self.manifest, GROUP))
        ackline = SystemResult("ackline", verdict.unique_expected)
        ackline.rows, ackline.lost = verdict.ingested, verdict.lost
        ackline.duplicated = verdict.duplicated
        ackline.rolled_back_rows = before["ackline"] - after["ackline"]
        peer = SystemResult("Kafka Connect + Debezium JDBC sink", verdict.unique_expected)
        records = read_manifest(self.manifest).records
        ids = [r.event_id for r in records if r.committed and r.event_id is not None]
        row = c_pg.retry(_C_CHECK, ids)[0]
        peer.rows, peer.distinct = int(row["rows"]), int(row["distinct_ids"])
        peer.lost = int(row["lost"])
        peer.duplicated = peer.rows - peer.distinct
        peer.rolled_back_rows = before["connect"] - after["connect"]
        peer.notes += connect.notes
        return SideBySide(
            seed=self.seed,
            events=self.events,
            lag_s=self.lag_s,
            ackline=ackline,
            connect=peer,
            ackline_verdict_ok=verdict.ok and verdict.drained,
            failover_at=at,
            duration_s=time.monotonic() - self.started,
        )

    def close(self) -> None:
        """Stop every part, in this order: the producer, the copier, Connect, the workers,
        the connections; each one even when one before it failed (a Connect JVM or a worker
        left running would outlive the stack). Then the first failure is raised, the later
        ones added to it as notes. Not an ExitStack: its callbacks run outside any handler,
        so it raised the last failure alone and dropped the earlier ones."""
        first: Exception | None = None
        for stop in self._stops():
            try:
                stop()
            except Exception as exc:  # the next part is stopped all the same
                if first is None:
                    first = exc
                else:
                    first.add_note(f"stopping the next parts failed too: {exc!r}")
        if first is not None:
            raise first

    def _stops(self) -> list[Callable[[], object]]:
        stops: list[Callable[[], object]] = [self._stop_producer]
        if self.copier is not None:
            stops.append(self.copier.stop)
        if self.connect is not None:
            stops.append(self.connect.stop)
        if self.pool is not None:
            stops.append(self.pool.shutdown)
        stops.extend(pg.close for pg in (self.a_pg, self.c_pg) if pg is not None)
        return stops

    def _stop_producer(self) -> None:
        if self.producer is not None and self.producer.poll() is None:
            self.producer.kill()
            self.producer.wait(30)


def _count(pg: Pg, sql: str) -> int:
    return int(pg.retry(sql)[0]["n"])


def _topics(bootstrap: str, topic: str) -> None:
    from ackline.streams.admin import ensure_topic
    from ackline.streams.errors import TopicError

    for t in (topic, f"{topic}.connect", f"{topic}.dlq"):
        for attempt in range(15):  # a new topic reaches every broker's metadata late
            try:
                ensure_topic(bootstrap, t, 12, {"min.insync.replicas": "2"}, replication_factor=3)
                break
            except TopicError:
                if attempt == 14:
                    raise
                time.sleep(2.0)


def _start_producer(
    bootstrap: str, topic: str, events: int, seed: int, rate: float, manifest: Path, run_dir: Path
) -> subprocess.Popen[bytes]:
    """The chaos harness's production child (transactional, a manifest), clean events."""
    args = {
        "bootstrap": bootstrap,
        "topic": topic,
        "partitions": 12,
        "events": events,
        "knobs": CLEAN.as_dict(),
        "seed": seed,
        "manifest": str(manifest),
        "summary": str(run_dir / "produced.json"),
        "rate": rate,
        "pause": str(run_dir / "produce.pause"),
        "paused": str(run_dir / "produce.paused"),
    }
    log = (run_dir / "produce.log").open("ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "ackline.load.chaos.harness", json.dumps(args)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    finally:
        log.close()


class _Copier:
    """Copies every committed record of ``source``, as schema'd JSON, to the same partition
    of ``target`` (same key), as it arrives: the Connect peer's copy of the same data."""

    def __init__(self, bootstrap: str, source: str, target: str) -> None:
        self.bootstrap, self.source, self.target = bootstrap, source, target
        self._stop = threading.Event()
        self._done = threading.Event()
        self._error: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.copied = 0

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        from ackline.load.bench.data import to_connect

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"copy-{self.source}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 20,
            }
        )
        try:
            tps = [TopicPartition(self.source, p, 0) for p in range(12)]
            consumer.assign(tps)
            while True:
                for msg in consumer.consume(1000, 0.5):
                    value = msg.value()
                    if msg.error() is None and value is not None:
                        part = msg.partition() or 0
                        producer.produce(
                            self.target, to_connect(value), key=msg.key(), partition=part
                        )
                        self.copied += 1
                producer.poll(0)
                if self._done.is_set() and self._caught_up(consumer):
                    break
                if self._stop.is_set():
                    return
            if producer.flush(120) != 0:
                raise LoadError("the copy for Kafka Connect was not acknowledged in time")
        except BaseException as exc:
            self._error.append(exc)
        finally:
            consumer.close()

    def _caught_up(self, consumer: Consumer) -> bool:
        tps = [TopicPartition(self.source, p) for p in range(12)]
        ends = {p: consumer.get_watermark_offsets(tp, timeout=10)[1] for p, tp in enumerate(tps)}
        return all(tp.offset >= ends[tp.partition] for tp in consumer.position(tps))

    def finish(self, timeout: float = 600.0) -> None:
        """Production is over: copy the rest, then return."""
        self._done.set()
        self._thread.join(timeout)
        if self._error:
            raise LoadError(f"copying for Kafka Connect failed: {self._error[0]}")
        if self._thread.is_alive():
            raise LoadError("copying for Kafka Connect did not finish")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


async def _databases(admin: str) -> None:
    from ackline.load.bench.peers import peer_table_ddl
    from ackline.sinks.admin.migrate import migrate

    conn = await asyncpg.connect(admin)
    try:
        for name in ("sbs_ackline", "sbs_connect"):
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    base = admin.rsplit("/", 1)
    query = base[1].split("?", 1)[1]
    conn = await asyncpg.connect(f"{base[0]}/sbs_ackline?{query}")
    try:
        await migrate(conn)
    finally:
        await conn.close()
    conn = await asyncpg.connect(f"{base[0]}/sbs_connect?{query}")
    try:
        for statement in peer_table_ddl(TABLE):
            await conn.execute(statement)
    finally:
        await conn.close()


def _ackline_workers(infra: Any, run_dir: Path, topic: str, workers: int) -> WorkerPool:
    env = {
        "ACKLINE_KAFKA_BOOTSTRAP": infra.bootstrap,
        "ACKLINE_DATABASE_URL": infra.admin_dsn("sbs_ackline"),
        "ACKLINE_TOPIC": topic,
        "ACKLINE_GROUP_ID": "sbs-ackline",
        "ACKLINE_DLQ_TOPIC": f"{topic}.dlq",
        "ACKLINE_DB_STATEMENT_TIMEOUT_S": "8",
        "ACKLINE_DB_COMMIT_TIMEOUT_S": "8",
    }
    pool = WorkerPool(run_dir, env, workers)
    for slot in range(workers):
        pool.start(slot)
    return pool


def _failover(infra: Any, lag_s: float) -> dict[str, int]:
    """Hold the WAL sender ``lag_s`` (both sinks keep committing), hold every further
    COMMIT, count each database's rows (what was acknowledged), crash, promote."""
    pair = infra.pair
    old = pair.primary
    counts: dict[str, int] = {}
    pair.hold_wal_senders()
    time.sleep(lag_s)
    old.psql(f"ALTER SYSTEM SET synchronous_standby_names = '{GHOST}'")
    old.psql("SELECT pg_reload_conf()")
    time.sleep(0.3)
    counts["ackline"] = int(old.psql("SELECT count(*) FROM activity", "sbs_ackline"))
    counts["connect"] = int(old.psql("SELECT count(*) FROM activity_connect", "sbs_connect"))
    pair.crash()
    pair.promote()
    infra.record()
    return counts


class _Connect:
    """Kafka Connect standalone with the Debezium JDBC sink (the bench's configuration),
    its JDBC URL listing both PostgreSQL nodes."""

    def __init__(self, infra: Any, run_dir: Path, jars: Any, topic: str) -> None:
        from ackline.dev.ports import pick_free_port

        self.infra = infra
        self.dir = run_dir / "connect"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.topic = topic
        self.jars = jars
        self.rest = pick_free_port()
        self.name = "sbs-jdbc"
        self.notes: list[str] = []
        self.proc: Any = None
        self._last_check = 0.0

    def start(self) -> None:
        import subprocess

        from ackline.load.bench.peers import render

        worker = self.dir / "worker.properties"
        worker.write_text(
            render(
                "connect/worker.properties",
                {
                    "bootstrap": self.infra.bootstrap,
                    "state": str(self.dir),
                    "plugin_path": str(self.jars.plugin_path),
                    "rest_port": str(self.rest),
                },
            )
        )
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.infra.pair.nodes)
        connector = render(
            "connect/connector.properties",
            {
                "name": self.name,
                "topic": self.topic,
                "pg_host": "127.0.0.1",
                "pg_port": "0",
                "pg_db": "sbs_connect",
                "pg_user": "postgres",
                "table": TABLE,
                "tasks": "1",  # one sink task, as the scenario was designed
            },
        )
        url = f"jdbc:postgresql://{hosts}/sbs_connect?targetServerType=primary"
        lines = [
            f"connection.url={url}" if line.startswith("connection.url=") else line
            for line in connector.splitlines()
        ]
        (self.dir / "connector.properties").write_text("\n".join(lines) + "\n")
        argv = [
            "java",
            "-Xms256M",
            "-Xmx1G",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            "-cp",
            f"{self.jars.runtime}/*",
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(worker),
            str(self.dir / "connector.properties"),
        ]
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/root")}
        log = (self.dir / "connect.log").open("ab")
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()

    def state(self) -> str | None:
        url = f"http://127.0.0.1:{self.rest}/connectors/{self.name}/status"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                body = json.loads(resp.read())
        except (OSError, ValueError, urllib.error.URLError, http.client.HTTPException):
            return None
        tasks = body.get("tasks") or []
        return str(tasks[0].get("state")) if tasks else None

    def tick(self) -> None:
        """Restart a failed task, as an operator would (noted)."""
        if time.monotonic() - self._last_check < 5:
            return
        self._last_check = time.monotonic()
        if self.state() == "FAILED":
            url = f"http://127.0.0.1:{self.rest}/connectors/{self.name}/tasks/0/restart"
            req = urllib.request.Request(
                url, method="POST", data=b"", headers={"Content-Type": "application/json"}
            )
            try:
                urllib.request.urlopen(req, timeout=10).close()
                self.notes.append(
                    "its task FAILED after the failover; restarted through the REST API"
                )
            except (OSError, urllib.error.URLError, http.client.HTTPException) as exc:
                self.notes.append(f"its task FAILED and could not be restarted: {exc}")

    def wait_drained(self, pg: Pg, timeout: float) -> None:
        """The group's committed offsets at the log end of every partition, and the row
        count unchanged for 20 s."""
        group = f"connect-{self.name}"
        consumer = Consumer({"bootstrap.servers": self.infra.bootstrap, "group.id": group})
        try:
            parts = [TopicPartition(self.topic, p) for p in range(12)]
            ends = {
                p: consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                for p in range(12)
            }
            steady: list[tuple[float, int]] = []

            def done() -> bool:
                self.tick()
                committed = consumer.committed(parts, timeout=10)
                at_end = all(tp.offset >= ends[tp.partition] for tp in committed)
                rows = pg.try_fetch(_C_ROWS)
                n = int(rows[0]["n"]) if rows else -1
                now = time.monotonic()
                if not steady or steady[-1][1] != n:
                    steady[:] = [(now, n)]
                return at_end and now - steady[0][0] >= 20

            if not wait_for(done, timeout):
                raise LoadError("Kafka Connect did not drain")
        finally:
            consumer.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except Exception:
                self.proc.kill()
                self.proc.wait(30)


def main() -> int:
    """``python -m ackline.load.chaos.sidebyside [EVENTS] [SEED]`` (make chaos-side-by-side)."""
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else None
    with terminate_as_exit():  # so that the stack is stopped
        result = run_side_by_side(Path(".ackline/chaos-side-by-side"), events=events, seed=seed)
    print(result.render(), flush=True)
    print(json.dumps(result.to_json()), flush=True)
    return 0 if result.ackline_verdict_ok and result.ackline.lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
