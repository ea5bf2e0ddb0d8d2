"""The systems under test, each behind one small interface the bench drives.

A :class:`System` owns one database (and table) and one consumer group. ``reset()``
makes the database fresh; ``start(topic)`` launches its process(es), measured;
``committed()`` is how many records it has committed (rows for first ingest, events or
group offsets when rows cannot tell, as on replay); ``commit_times()`` the commit time
of every row (``pg_xact_commit_timestamp``: the bench's PostgreSQL tracks commit
timestamps).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from confluent_kafka import Consumer, TopicPartition

from ackline.dev.ports import pick_free_port
from ackline.load.bench.measure import Measured
from ackline.load.bench.peers import ConnectJars, peer_table_ddl, render
from ackline.sinks.admin.migrate import migrate

T = TypeVar("T")


def run_sql(coro: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(_call(coro))


async def _call(coro: Callable[[], Awaitable[T]]) -> T:
    return await coro()


async def query(dsn: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


@dataclass
class Env:
    """Where the bench's services are and where its files go."""

    bootstrap: str
    pg_host: str
    pg_port: int
    state_dir: Path
    logs: Path
    run_id: str
    peers_python: Path | None = None
    connect_jars: ConnectJars | None = None

    def dsn(self, database: str) -> str:
        return f"postgresql://postgres@{self.pg_host}:{self.pg_port}/{database}"


async def fresh_database(
    env: Env, name: str, ddl: Sequence[str] = (), migrated: bool = False
) -> str:
    admin = await asyncpg.connect(env.dsn("postgres"))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    conn = await asyncpg.connect(env.dsn(name))
    try:
        if migrated:
            await migrate(conn)
        for statement in ddl:
            await conn.execute(statement)
    finally:
        await conn.close()
    return env.dsn(name)


def group_committed(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    """Sum of ``group``'s committed offsets on ``topic`` (0 for partitions without one)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        consumer.close()
    return sum(max(tp.offset, 0) for tp in tps)


@dataclass
class System:
    """Base: one database, one table, one group; subclasses say how to start."""

    name: str
    env: Env
    table: str = "activity"
    group: str = ""
    database: str = ""
    procs: list[Measured] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.group = self.group or f"bench-{self.name}-{self.env.run_id}"
        self.database = self.database or f"bench_{self.name}".replace("-", "_")

    @property
    def dsn(self) -> str:
        return self.env.dsn(self.database)

    def input_topic(self, topic: str) -> str:
        return topic

    def reset(self) -> None:
        run_sql(lambda: fresh_database(self.env, self.database, self.ddl(), self.migrated()))

    def migrated(self) -> bool:
        return False

    def ddl(self) -> list[str]:
        return peer_table_ddl(self.table)

    def start(self, topic: str) -> list[Measured]:
        raise NotImplementedError

    def rows(self) -> int:
        return int(
            run_sql(lambda: query(self.dsn, f"SELECT count(*) AS n FROM {self.table}"))[0]["n"]
        )

    def committed(self, topic: str, partitions: int) -> int:
        """Records consumed and committed (for the replay phase, where rows stay put)."""
        return group_committed(self.env.bootstrap, self.group, topic, partitions)

    def commit_times(self, where: str = "") -> list[float]:
        sql = (
            "SELECT extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8 AS t "
            f"FROM {self.table} {where}"
        )
        return [float(r["t"]) for r in run_sql(lambda: query(self.dsn, sql))]

    def commit_times_by_id(self) -> dict[str, float]:
        sql = (
            "SELECT event_id::text AS id, "
            "extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8 AS t "
            f"FROM {self.table}"
        )
        return {r["id"]: float(r["t"]) for r in run_sql(lambda: query(self.dsn, sql))}

    def changed_outcome(self, changed: dict[str, str]) -> dict[str, int]:
        """How many changed records overwrote their row, and how many rows kept theirs."""
        sql = (
            "SELECT count(*) FILTER (WHERE to_char(occurred_at AT TIME ZONE 'UTC', "
            '\'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\') = c.changed) AS overwritten, '
            "count(*) AS present "
            f"FROM {self.table} AS t JOIN unnest($1::uuid[], $2::text[]) AS c(id, changed) "
            "ON t.event_id = c.id"
        )
        ids, values = list(changed), list(changed.values())
        row = run_sql(lambda: query(self.dsn, sql, ids, values))[0]
        overwritten = int(row["overwritten"])
        return {"overwritten": overwritten, "kept": int(row["present"]) - overwritten}

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()

    def launch(self, argv: Sequence[str], env: dict[str, str], tag: str) -> Measured:
        log = self.env.logs / f"{self.name}-{tag}.log"
        proc = Measured(argv, env, log)
        self.procs.append(proc)
        return proc


@dataclass
class Ackline(System):
    """`ackline run` worker processes, default settings (every guarantee on)."""

    workers: int = 1
    runtime: str = "confluent"  # `ackline run --runtime` (docs/faust.md)

    def migrated(self) -> bool:
        return True

    def ddl(self) -> list[str]:
        return []

    def start(self, topic: str) -> list[Measured]:
        self.procs = []
        for i in range(self.workers):
            env = {
                **os.environ,
                "ACKLINE_KAFKA_BOOTSTRAP": self.env.bootstrap,
                "ACKLINE_DATABASE_URL": self.dsn,
                "ACKLINE_TOPIC": topic,
                "ACKLINE_GROUP_ID": self.group,
                "ACKLINE_DLQ_TOPIC": f"{topic}.dlq",
                "ACKLINE_WORKER_ID": f"{self.name}-w{i + 1}",
                "ACKLINE_LOG_FORMAT": "json",
                "ACKLINE_RUNTIME": self.runtime,
            }
            env = {
                k: v for k, v in env.items() if not k.startswith("ACKLINE_") or k in _ACKLINE_KEYS
            }
            self.launch([sys.executable, "-m", "ackline", "run"], env, f"w{i + 1}")
        return self.procs

    def committed(self, topic: str, partitions: int) -> int:
        sql = "SELECT coalesce(sum(events), 0) AS n FROM ingest_batches"
        return int(run_sql(lambda: query(self.dsn, sql))[0]["n"])

    def batch_commit_times(self, after_batch: int) -> list[tuple[float, int]]:
        sql = (
            "SELECT extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8 AS t, events "
            "FROM ingest_batches WHERE batch_id > $1"
        )
        rows = run_sql(lambda: query(self.dsn, sql, after_batch))
        return [(float(r["t"]), int(r["events"])) for r in rows]

    def last_batch(self) -> int:
        sql = "SELECT coalesce(max(batch_id), 0) AS b FROM ingest_batches"
        return int(run_sql(lambda: query(self.dsn, sql))[0]["b"])

    def conflicts(self) -> int:
        sql = "SELECT count(*) AS n FROM conflicts"
        return int(run_sql(lambda: query(self.dsn, sql))[0]["n"])


_ACKLINE_KEYS = frozenset(
    {
        "ACKLINE_KAFKA_BOOTSTRAP",
        "ACKLINE_DATABASE_URL",
        "ACKLINE_TOPIC",
        "ACKLINE_GROUP_ID",
        "ACKLINE_DLQ_TOPIC",
        "ACKLINE_WORKER_ID",
        "ACKLINE_LOG_FORMAT",
        "ACKLINE_RUNTIME",
        "ACKLINE_WRITER_CONNECTIONS",
    }
)


@dataclass
class AcklineFaust(Ackline):
    """`ackline run --runtime faust`: ackline's sink inside a Faust agent, same guarantees."""

    runtime: str = "faust"


@dataclass
class Quix(System):
    table: str = "activity_quix"

    def start(self, topic: str) -> list[Measured]:
        self.procs = []
        assert self.env.peers_python is not None
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/root"),
            "BENCH_BOOTSTRAP": self.env.bootstrap,
            "BENCH_GROUP": self.group,
            "BENCH_TOPIC": topic,
            "BENCH_TABLE": self.table,
            "BENCH_PG_HOST": self.env.pg_host,
            "BENCH_PG_PORT": str(self.env.pg_port),
            "BENCH_PG_DB": self.database,
            "BENCH_PG_USER": "postgres",
            "Quix__State__Dir": str(self.env.state_dir / f"quix-state-{self.env.run_id}"),
        }
        app = Path(__file__).resolve().parent / "peers" / "quix_app.py"
        self.launch([str(self.env.peers_python), str(app)], env, "quix")
        return self.procs


@dataclass
class Faust(System):
    table: str = "activity_faust"

    def start(self, topic: str) -> list[Measured]:
        self.procs = []
        assert self.env.peers_python is not None
        data = self.env.state_dir / f"faust-{self.group}"
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/root"),
            "BENCH_BOOTSTRAP": self.env.bootstrap,
            "BENCH_GROUP": self.group,
            "BENCH_TOPIC": topic,
            "BENCH_TABLE": self.table,
            "BENCH_DSN": self.dsn,
        }
        app = Path(__file__).resolve().parent / "peers" / "faust_app.py"
        argv = [
            str(self.env.peers_python),
            str(app),
            "--datadir",
            str(data),
            "worker",
            "-l",
            "warn",
        ]
        self.launch(argv, env, "faust")
        return self.procs


@dataclass
class Connect(System):
    table: str = "activity_connect"
    tasks: int = 1
    """``tasks.max``: 1 against one ackline worker (the headline), 2 beside two workers."""

    def __post_init__(self) -> None:
        given = self.group
        super().__post_init__()
        self.connector = given or f"bench-jdbc-{self.env.run_id}"
        self.group = f"connect-{self.connector}"  # a sink connector's consumer group

    def input_topic(self, topic: str) -> str:
        return f"{topic}.connect"

    def start(self, topic: str) -> list[Measured]:
        self.procs = []
        jars = self.env.connect_jars
        assert jars is not None
        state = self.env.state_dir / f"connect-{self.connector}"
        state.mkdir(parents=True, exist_ok=True)
        worker = state / "worker.properties"
        worker.write_text(
            render(
                "connect/worker.properties",
                {
                    "bootstrap": self.env.bootstrap,
                    "state": str(state),
                    "plugin_path": str(jars.plugin_path),
                    "rest_port": str(pick_free_port()),
                },
            )
        )
        connector = state / "connector.properties"
        connector.write_text(
            render(
                "connect/connector.properties",
                {
                    "name": self.connector,
                    "topic": topic,
                    "pg_host": self.env.pg_host,
                    "pg_port": str(self.env.pg_port),
                    "pg_db": self.database,
                    "pg_user": "postgres",
                    "table": self.table,
                    "tasks": str(self.tasks),
                },
            )
        )
        argv = [
            "java",
            "-Xms256M",
            "-Xmx2G",  # connect-standalone.sh's default heap
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            "-cp",
            f"{jars.runtime}/*",
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(worker),
            str(connector),
        ]
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/root")}
        self.launch(argv, env, "connect")
        return self.procs


__all__ = [
    "Ackline",
    "AcklineFaust",
    "Connect",
    "Env",
    "Faust",
    "Quix",
    "System",
    "fresh_database",
    "query",
    "run_sql",
]
