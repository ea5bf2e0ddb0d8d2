"""The local dev stack: one Kafka broker and one PostgreSQL server per state directory.

``up`` is idempotent and keeps the ports recorded in ``<state_dir>/stack.json`` while
they stay free; ``down`` stops everything and verifies no process is left; ``resolve``
tells the application where its services are (``ACKLINE_KAFKA_BOOTSTRAP`` plus
``ACKLINE_DATABASE_URL`` when both are set, else the running local stack).

All mutating calls on one state directory serialize on ``<state_dir>/stack.lock``.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ackline.dev import _proc
from ackline.dev.errors import DevStackError
from ackline.dev.kafka import KafkaNode, ensure_jars
from ackline.dev.ports import pick_free_port
from ackline.dev.postgres import PostgresNode, ensure_pg_installed

DEFAULT_STATE_DIR = Path(".ackline")
DATABASE = "ackline"
ENV_KAFKA_BOOTSTRAP = "ACKLINE_KAFKA_BOOTSTRAP"
ENV_DATABASE_URL = "ACKLINE_DATABASE_URL"
STACK_FILE = "stack.json"
_LOCK_FILE = "stack.lock"
_NOT_RUNNING_HINT = (
    "run `ackline dev up` (or set both ACKLINE_KAFKA_BOOTSTRAP and ACKLINE_DATABASE_URL "
    "to use other services)"
)


@dataclass(frozen=True)
class StackInfo:
    """Where the services are.

    ``started_here`` is True for the local stack managed under a state directory
    (``ackline dev up``/``down`` own it) and False for services named by the
    environment, which ackline neither starts nor stops.
    """

    kafka_bootstrap: str
    database_url: str
    started_here: bool


@dataclass(frozen=True)
class StackPorts:
    """The TCP ports of one local stack, recorded in ``<state_dir>/stack.json``."""

    kafka: int
    kafka_controller: int
    postgres: int


def _abs(state_dir: Path) -> Path:
    return Path(state_dir).absolute()


def read_ports(state_dir: Path) -> StackPorts | None:
    """The recorded ports, or None when there is no (valid) ``stack.json``."""
    try:
        raw = json.loads((_abs(state_dir) / STACK_FILE).read_text(encoding="utf-8"))
        return StackPorts(
            kafka=int(raw["kafka_port"]),
            kafka_controller=int(raw["kafka_controller_port"]),
            postgres=int(raw["postgres_port"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_ports(state_dir: Path, ports: StackPorts) -> None:
    path = state_dir / STACK_FILE
    data = {
        "kafka_port": ports.kafka,
        "kafka_controller_port": ports.kafka_controller,
        "postgres_port": ports.postgres,
        "kafka_bootstrap": f"127.0.0.1:{ports.kafka}",
        "database_url": f"postgresql://postgres@127.0.0.1:{ports.postgres}/{DATABASE}",
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def nodes(state_dir: Path, ports: StackPorts | None = None) -> tuple[KafkaNode, PostgresNode]:
    """The two service handles of ``state_dir`` (recorded ports unless given; no I/O
    beyond reading ``stack.json``). Useful for chaos tests that need finer control."""
    state_dir = _abs(state_dir)
    if ports is None:
        ports = read_ports(state_dir)
    if ports is None:
        ports = StackPorts(0, 0, 0)
    return (
        KafkaNode(state_dir, ports.kafka, ports.kafka_controller),
        PostgresNode(state_dir, ports.postgres),
    )


def _choose_ports(recorded: StackPorts | None, keep_kafka: bool, keep_postgres: bool) -> StackPorts:
    """Ports of running services are kept; recorded ones are reused while free."""
    taken: list[int] = []

    def choose(previous: int | None, keep: bool) -> int:
        port = previous if keep and previous else pick_free_port(previous, exclude=taken)
        taken.append(port)
        return port

    kafka = choose(recorded.kafka if recorded else None, keep_kafka)
    controller = choose(recorded.kafka_controller if recorded else None, keep_kafka)
    postgres = choose(recorded.postgres if recorded else None, keep_postgres)
    return StackPorts(kafka, controller, postgres)


def _local_info(kafka: KafkaNode, postgres: PostgresNode) -> StackInfo:
    return StackInfo(kafka.bootstrap, postgres.dsn(DATABASE), started_here=True)


def up(state_dir: Path = DEFAULT_STATE_DIR, timeout: float = 120.0) -> StackInfo:
    """Start the local stack (idempotent) and create the ``ackline`` database.

    Services already running are left alone. On failure whatever this call started is
    stopped again and DevStackError explains why (with the service's log tail).
    """
    state_dir = _abs(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    with _proc.file_lock(state_dir / _LOCK_FILE):
        recorded = read_ports(state_dir)
        kafka, postgres = nodes(state_dir, recorded)
        kafka_running = recorded is not None and kafka.is_running()
        postgres_running = recorded is not None and postgres.is_running()
        ports = _choose_ports(recorded, kafka_running, postgres_running)
        if ports != recorded:
            _write_ports(state_dir, ports)
        kafka, postgres = nodes(state_dir, ports)
        if kafka_running and postgres_running:
            kafka.start(timeout)  # already running: waits for the port only
            postgres.start(timeout)
            postgres.ensure_database(DATABASE)
            return _local_info(kafka, postgres)

        # Fetch/install first, so a failure there leaves nothing half started.
        ensure_jars()
        ensure_pg_installed()
        started: list[KafkaNode | PostgresNode] = []
        try:
            if not kafka_running:
                kafka.launch()  # the JVM boots while PostgreSQL starts
                started.append(kafka)
            if not postgres_running:
                started.append(postgres)
            postgres.start(timeout)
            postgres.ensure_database(DATABASE)
            if kafka_running:
                kafka.start(timeout)
            else:
                kafka.wait_ready(timeout)
        except BaseException:
            for node in started:
                node.kill()
            raise
        return _local_info(kafka, postgres)


def down(state_dir: Path = DEFAULT_STATE_DIR, wipe: bool = False) -> None:
    """Stop the local stack (idempotent) and verify that no process of it is left.

    Data and recorded ports are kept for the next ``up`` unless ``wipe`` is True, which
    removes the whole state directory.
    """
    state_dir = _abs(state_dir)
    if not state_dir.is_dir():
        return
    with _proc.file_lock(state_dir / _LOCK_FILE):
        kafka, postgres = nodes(state_dir)
        pids = [pid for pid in (kafka.pid, postgres.pid) if pid is not None]
        kafka.stop()
        postgres.stop("fast")
        left = [pid for pid in pids if _proc.is_alive(pid)]
        if kafka.is_running() or postgres.is_running() or left:
            raise DevStackError(f"processes of the local stack are still running: {left}")
    if wipe:
        shutil.rmtree(state_dir, ignore_errors=True)


def status(state_dir: Path = DEFAULT_STATE_DIR) -> dict[str, dict[str, Any]]:
    """Per service: ``running``, ``pid``, ``port`` (and where to connect)."""
    state_dir = _abs(state_dir)
    ports = read_ports(state_dir)
    kafka, postgres = nodes(state_dir, ports)
    kafka_pid = kafka.pid
    postgres_pid = postgres.pid
    return {
        "kafka": {
            "running": kafka_pid is not None,
            "pid": kafka_pid,
            "port": ports.kafka if ports else None,
            "controller_port": ports.kafka_controller if ports else None,
            "bootstrap": kafka.bootstrap if ports else None,
            "log": str(kafka.log_path),
        },
        "postgres": {
            "running": postgres_pid is not None,
            "pid": postgres_pid,
            "port": ports.postgres if ports else None,
            "database_url": postgres.dsn(DATABASE) if ports else None,
            "log": str(postgres.log_path),
        },
    }


def _recorded_nodes(state_dir: Path) -> tuple[KafkaNode, PostgresNode]:
    ports = read_ports(state_dir)
    if ports is None:
        raise DevStackError(f"no local stack in {state_dir}: {_NOT_RUNNING_HINT}")
    return nodes(state_dir, ports)


def restart_kafka(
    state_dir: Path = DEFAULT_STATE_DIR, hard: bool = False, timeout: float = 90.0
) -> None:
    """Restart the broker on its recorded ports: a clean stop, or SIGKILL when ``hard``.

    Returns once the broker serves again.
    """
    state_dir = _abs(state_dir)
    with _proc.file_lock(state_dir / _LOCK_FILE):
        kafka, _ = _recorded_nodes(state_dir)
        if hard:
            kafka.kill()
        else:
            kafka.stop()
        kafka.start(timeout)


def restart_postgres(
    state_dir: Path = DEFAULT_STATE_DIR, hard: bool = False, timeout: float = 60.0
) -> None:
    """Restart PostgreSQL on its recorded port: a fast shutdown, or a crash (SIGKILL of
    the postmaster and its children, then crash recovery) when ``hard``.

    Returns once the server accepts connections again.
    """
    state_dir = _abs(state_dir)
    with _proc.file_lock(state_dir / _LOCK_FILE):
        _, postgres = _recorded_nodes(state_dir)
        if hard:
            postgres.kill()
        else:
            postgres.stop("fast")
        postgres.start(timeout)


def resolve(state_dir: Path = DEFAULT_STATE_DIR) -> StackInfo:
    """Where the app's services are; starts nothing.

    Both ``ACKLINE_KAFKA_BOOTSTRAP`` and ``ACKLINE_DATABASE_URL`` set (non-empty): those,
    with ``started_here=False``. Otherwise the local stack of ``state_dir``, which must
    be running, else DevStackError tells to run ``ackline dev up``.
    """
    bootstrap = os.environ.get(ENV_KAFKA_BOOTSTRAP, "")
    database_url = os.environ.get(ENV_DATABASE_URL, "")
    if bootstrap and database_url:
        return StackInfo(bootstrap, database_url, started_here=False)
    state_dir = _abs(state_dir)
    ports = read_ports(state_dir)
    if ports is None:
        raise DevStackError(f"the local stack in {state_dir} is not set up: {_NOT_RUNNING_HINT}")
    kafka, postgres = nodes(state_dir, ports)
    stopped = [
        name
        for name, running in (("Kafka", kafka.is_running()), ("PostgreSQL", postgres.is_running()))
        if not running
    ]
    if stopped:
        raise DevStackError(
            f"the local stack in {state_dir} is not running ({' and '.join(stopped)} "
            f"down): {_NOT_RUNNING_HINT}"
        )
    return _local_info(kafka, postgres)
