"""The peers the bench compares ackline with: installed, configured and started here.

Nothing of a peer is committed but its configuration (this package's files). The bench
installs them itself, outside the project's own environment:

* Quix Streams and faust-streaming: ``pip install`` into a separate virtualenv under
  the bench's state directory (``.ackline/bench/peers-venv``), pinned below;
* Kafka Connect (``connect-runtime`` + ``connect-json`` 4.1.1) and the Debezium JDBC sink
  connector: fetched with Maven into ``${XDG_CACHE_HOME:-~/.cache}/ackline/bench``, the
  connector's jars in their own plugin folder on ``plugin.path``.
"""

from __future__ import annotations

import shutil
import string
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ackline.dev.kafka import cache_dir as kafka_cache_dir
from ackline.load.errors import LoadError

HERE = Path(__file__).resolve().parent
PEER_PACKAGES = (
    "quixstreams==3.28.1",
    "faust-streaming==0.15.3",
    "aiokafka[lz4]",  # aiokafka decodes lz4-compressed batches (the bench's) only with cramjam
    "asyncpg==0.32.0",
    "psycopg2-binary==2.9.13",
)
PEER_SETTINGS = {
    "quix": "`commit_every=10000`",
    "connect": "1 task, `batch.size=2000`",
    "faust": "`concurrency=4`",
}
"""The throughput settings each peer runs with (docs/performance.md, "The peers' settings"),
as the results record them; the peers' files hold the same values (a unit test checks)."""
CONNECT_VERSION = "4.1.1"
DEBEZIUM_VERSION = "3.6.0.Final"
# Jars the Connect runtime provides; a plugin folder must not shadow them (a second
# Jackson made its ServiceLoader mix two copies: "Jdk8Module not a subtype").
_RUNTIME_PROVIDED = ("connect-api-", "kafka-clients-", "slf4j-api-", "jackson-")


class PeerInstallError(LoadError):
    """A peer could not be installed (pip or Maven failed); the message has the tail."""


def _run(argv: list[str], what: str, timeout: float = 1800.0) -> None:
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise PeerInstallError(f"{what} failed (exit {proc.returncode}):\n{tail}")


def ensure_python_peers(state_dir: Path) -> Path:
    """The peers' virtualenv's python, created and filled on first use."""
    venv = state_dir / "peers-venv"
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    wanted = "\n".join(PEER_PACKAGES)
    if marker.is_file() and marker.read_text() == wanted:
        return python
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(venv)], "creating the peers' virtualenv", 300)
    _run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *PEER_PACKAGES,
        ],
        "pip install of the peers",
    )
    marker.write_text(wanted)
    return python


def bench_cache() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/ackline/bench`` (beside the dev stack's Kafka jars)."""
    return kafka_cache_dir().parent / "bench"


def _maven_fetch(pom: Path, out: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PeerInstallError("Maven (`mvn`) is not on PATH (apt-get install -y maven)")
    shutil.rmtree(out, ignore_errors=True)
    work = out.parent / f".fetch-{out.name}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shutil.copyfile(pom, work / "pom.xml")
    _run(
        [
            mvn,
            "-q",
            "-B",
            "-f",
            str(work / "pom.xml"),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={work / 'libs'}",
        ],
        f"fetching {pom.name} with Maven",
    )
    (work / "libs").rename(out)
    shutil.rmtree(work, ignore_errors=True)


@dataclass(frozen=True)
class ConnectJars:
    runtime: Path
    """The classpath folder of ConnectStandalone."""
    plugin_path: Path
    """The plugin.path folder; the connector's jars are in its own subfolder."""


def ensure_connect_jars() -> ConnectJars:
    """The Connect runtime and the Debezium plugin, fetched once into the cache."""
    root = bench_cache()
    runtime = root / f"connect-{CONNECT_VERSION}" / "libs"
    plugins = root / f"debezium-jdbc-{DEBEZIUM_VERSION}" / "plugins"
    plugin = plugins / "debezium-connector-jdbc"
    if not (runtime.parent / "complete").is_file():
        runtime.parent.mkdir(parents=True, exist_ok=True)
        _maven_fetch(HERE / "connect" / "runtime-pom.xml", runtime)
        (runtime.parent / "complete").write_text(CONNECT_VERSION)
    if not (plugins.parent / "complete").is_file():
        plugins.mkdir(parents=True, exist_ok=True)
        _maven_fetch(HERE / "connect" / "debezium-pom.xml", plugin)
        for jar in plugin.glob("*.jar"):
            if jar.name.startswith(_RUNTIME_PROVIDED):
                jar.unlink()
        (plugins.parent / "complete").write_text(DEBEZIUM_VERSION)
    return ConnectJars(runtime, plugins)


def render(template: str, values: dict[str, str]) -> str:
    """A config file of this package with its ``${name}`` placeholders filled in."""
    return string.Template((HERE / template).read_text()).substitute(values)


def peer_table_ddl(table: str, extra_columns: str = "") -> list[str]:
    """A table equivalent to ackline's activity + ledger indexes, for one peer.

    The same columns as ``activity`` where the peer has them, ``event_id`` the primary
    key, and the indexes ackline maintains: the ledger's unique key on ``txn_id``,
    ``request_id``, and ``(agent_id, occurred_at)``.
    """
    return [
        f"""CREATE TABLE {table} (
            event_id       uuid        PRIMARY KEY,
            txn_id         text        NOT NULL,
            type           text        NOT NULL,
            agent_id       text        NOT NULL,
            request_id     text        NOT NULL,
            occurred_at    timestamptz NOT NULL,
            schema_version integer     NOT NULL,
            payload        jsonb       NOT NULL{extra_columns}
        )""",
        f"CREATE UNIQUE INDEX {table}_txn_idx ON {table} (txn_id)",
        f"CREATE INDEX {table}_request_idx ON {table} (request_id)",
        f"CREATE INDEX {table}_agent_idx ON {table} (agent_id, occurred_at)",
    ]


__all__ = [
    "PEER_PACKAGES",
    "PEER_SETTINGS",
    "ConnectJars",
    "PeerInstallError",
    "bench_cache",
    "ensure_connect_jars",
    "ensure_python_peers",
    "peer_table_ddl",
    "render",
]
