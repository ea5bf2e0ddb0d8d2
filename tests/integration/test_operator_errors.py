"""Every expected operator failure is one line, a non-zero exit and a fix — never a traceback.

Table-driven over the environments issue 18 lists: PostgreSQL on a closed port, a
database never migrated, read-only paths (run as an unprivileged user when the tests
run as root, who ignores file modes), unreadable manifests, a capture that cannot be
written, a closed stdout pipe, and `tail` with the database down. Each command runs as
its own process, as an operator runs it.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from confluent_kafka import Producer

from ackline.streams.admin import ensure_topic, partition_count
from tests.integration.harness import Services, dsn_for

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 120  # a command that has not ended by then is a failure (a liveness bound)


def _closed_port() -> int:
    """A TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _unprivileged() -> list[str]:
    """A command prefix that drops root, so file modes apply (root ignores them)."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@dataclass(frozen=True)
class Outcome:
    status: int
    stdout: str
    stderr: str

    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def ackline(
    *argv: str,
    env: dict[str, str],
    cwd: Path,
    unprivileged: bool = False,
    timeout: float = BOUND_S,
) -> Outcome:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ACKLINE_")}
    full.update({"ACKLINE_LOG_FORMAT": "text", **env})
    prefix = _unprivileged() if unprivileged else []
    proc = subprocess.run(
        [*prefix, sys.executable, "-m", "ackline", *argv],
        env=full,
        cwd=cwd,
        capture_output=True,
        check=False,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


def assert_one_line(out: Outcome, *needles: str, logs_allowed: bool = False) -> str:
    """Non-zero, no traceback, the last stderr line is the error naming every needle."""
    text = out.stderr + out.stdout
    assert "Traceback" not in text, text[-3000:]
    assert out.status != 0, text[-3000:]
    lines = out.lines()
    assert lines, "no error line at all"
    if not logs_allowed:
        assert len(lines) == 1, out.stderr
    last = lines[-1]
    assert last.startswith("ackline: error: "), out.stderr
    for needle in needles:
        assert needle.lower() in last.lower(), (needle, last)
    return last


async def _create_database(admin_dsn: str, name: str) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def _drop_database(admin_dsn: str, name: str) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture
def empty_db(services: Services) -> Iterator[str]:
    """A database that exists and was never migrated."""
    name = f"empty_{uuid.uuid4().hex[:10]}"
    asyncio.run(_create_database(services.database_url, name))
    yield dsn_for(services.database_url, name)
    asyncio.run(_drop_database(services.database_url, name))


@pytest.fixture
def work() -> Iterator[Path]:
    """A scratch directory the unprivileged user can traverse (pytest's tmp_path sits
    under a directory only its owner may enter)."""
    path = Path(tempfile.mkdtemp(prefix="ackline-ops-"))
    path.chmod(0o755)
    yield path
    for sub in path.rglob("*"):
        if sub.is_dir():
            sub.chmod(0o755)
    shutil.rmtree(path)


def _readonly_dir(work: Path) -> Path:
    ro = work / "read-only"
    ro.mkdir()
    ro.chmod(0o555)
    return ro


# --- PostgreSQL on a closed port ----------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("status",),
        ("migrate",),
        ("conflicts", "list"),
        ("rejects", "list"),
        ("roles", "show"),
    ],
    ids=" ".join,
)
def test_database_on_a_closed_port(
    services: Services, topic: str, work: Path, argv: tuple[str, ...]
) -> None:
    port = _closed_port()
    env = {
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/ackline",
        "ACKLINE_TOPIC": topic,
    }
    out = ackline(*argv, env=env, cwd=work)
    assert_one_line(out, "PostgreSQL", f"127.0.0.1:{port}", "ACKLINE_DATABASE_URL")


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A real TCP listener that never answers: the kernel completes each handshake into
    its backlog and nothing ever reads or writes (a PostgreSQL host that hangs, a wrong
    port on a firewall that swallows)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield int(server.getsockname()[1])


def _empty_manifest(work: Path, topic: str) -> Path:
    from ackline.load.manifest import ManifestHeader, ManifestWriter

    path = work / "empty.jsonl.gz"
    header = ManifestHeader("r0", topic, 0, 1, 0, 1, {}, "2026-12-06T00:00:00Z")
    writer = ManifestWriter(path, header)
    writer.close()
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ("status",),
        ("migrate",),
        ("conflicts", "list"),
        ("roles", "show"),
        ("processors", "status"),
        ("verify",),
    ],
    ids=" ".join,
)
def test_a_database_that_never_answers_is_given_up_within_the_connect_bound(
    services: Services, topic: str, work: Path, silent_port: int, argv: tuple[str, ...]
) -> None:
    """ACKLINE_DB_CONNECT_TIMEOUT_S is "the bound on connecting to PostgreSQL", but the
    operator commands fixed theirs at 10 s, and `processors` had none but asyncpg's 60 s
    (its line named no address); `verify` then said "at host:  (check ...)", the reason
    blank (an operator's report). Each now gives up within the setting, naming where."""
    env = {
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{silent_port}/ackline",
        "ACKLINE_TOPIC": topic,
        "ACKLINE_DB_CONNECT_TIMEOUT_S": "1",
    }
    if argv == ("verify",):
        argv = ("verify", "--manifest", str(_empty_manifest(work, topic)))
    began = time.monotonic()
    out = ackline(*argv, env=env, cwd=work)
    took = time.monotonic() - began
    last = assert_one_line(out, f"127.0.0.1:{silent_port}")
    assert "no answer in time" in last, last
    assert took < 9.5, (took, last)  # 1 s to connect, the rest start-up: the old bound, 10


# --- a database never migrated --------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("status",),
        ("conflicts", "list"),
        ("rejects", "list"),
        ("tail", "--from-start", "--limit", "1"),
        ("run",),
        ("dispatch", "--once"),
        ("process", "dispatcher", "--until-caught-up"),
        ("erase", "--agent", "a1"),
        ("verify",),
    ],
    ids=" ".join,
)
def test_database_never_migrated(
    services: Services, topic: str, empty_db: str, work: Path, argv: tuple[str, ...]
) -> None:
    if argv == ("verify",):  # it said only "relation "activity" does not exist"
        argv = ("verify", "--manifest", str(_empty_manifest(work, topic)))
    env = {
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": empty_db,
        "ACKLINE_TOPIC": topic,
        "ACKLINE_DLQ_TOPIC": f"{topic}.dlq",
        "ACKLINE_GROUP_ID": f"g-{topic}",
        "ACKLINE_METRICS_PORT": "0",
    }
    out = ackline(*argv, env=env, cwd=work)
    assert_one_line(out, "ackline migrate", logs_allowed=argv == ("run",))


@pytest.mark.parametrize(
    ("argv", "setting"),
    [
        (("process", "dispatcher", "--until-caught-up"), "ACKLINE_DATABASE_PROCESSOR_URL"),
        (("run",), "ACKLINE_DATABASE_INGEST_URL"),
    ],
    ids=["process", "run"],
)
def test_a_database_never_migrated_is_named_by_the_setting_used(
    services: Services,
    topic: str,
    empty_db: str,
    work: Path,
    argv: tuple[str, ...],
    setting: str,
) -> None:
    """`ackline process` connects with ACKLINE_DATABASE_PROCESSOR_URL when it is set (the
    worker with ACKLINE_DATABASE_INGEST_URL); on a database never migrated its line told
    to point ACKLINE_DATABASE_URL "at this database" without saying which database that
    was (the worker's also gave ACKLINE_DATABASE_URL's address). The line names the
    setting the connection came from, and its database."""
    env = {
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/elsewhere",
        setting: empty_db,
        "ACKLINE_TOPIC": topic,
        "ACKLINE_DLQ_TOPIC": f"{topic}.dlq",
        "ACKLINE_GROUP_ID": f"g-{topic}",
        "ACKLINE_METRICS_PORT": "0",
    }
    out = ackline(*argv, env=env, cwd=work)
    last = assert_one_line(out, "ackline migrate", setting, logs_allowed=argv == ("run",))
    assert "127.0.0.1:1/" not in last, last


def test_a_database_that_does_not_exist_names_the_ingest_url_too(
    services: Services, topic: str, work: Path
) -> None:
    """The worker connects with ACKLINE_DATABASE_INGEST_URL when it is set; a database
    name there that does not exist was told to be fixed "in ACKLINE_DATABASE_URL" (an
    operator's report), which was right. The line names the URLs it may come from."""
    env = {
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": services.database_url,
        "ACKLINE_DATABASE_INGEST_URL": dsn_for(services.database_url, "nosuchdb"),
        "ACKLINE_TOPIC": topic,
        "ACKLINE_DLQ_TOPIC": f"{topic}.dlq",
        "ACKLINE_GROUP_ID": f"g-{topic}",
        "ACKLINE_METRICS_PORT": "0",
    }
    out = ackline("run", env=env, cwd=work)
    assert_one_line(out, "nosuchdb", "ACKLINE_DATABASE_INGEST_URL", logs_allowed=True)


@pytest.mark.parametrize(
    ("query", "needles"),
    [
        ("connect_timeout=5", ("connect_timeout", "ACKLINE_DB_CONNECT_TIMEOUT_S")),
        ("bogus=1", ("bogus", "ACKLINE_DATABASE_URL")),
        ("options=-c%20work_mem%3Dbanana", ("work_mem", "ACKLINE_DATABASE_URL")),
        ("target_session_attrs=bogus", ("target_session_attrs", "ACKLINE_DATABASE_URL")),
    ],
    ids=["connect_timeout", "unknown", "options", "target_session_attrs"],
)
@pytest.mark.parametrize("argv", [("status",), ("migrate",), ("run",)], ids=" ".join)
def test_a_query_parameter_of_the_database_url_postgresql_refuses_is_one_line(
    services: Services,
    dsn: str,
    topic: str,
    work: Path,
    query: str,
    needles: tuple[str, ...],
    argv: tuple[str, ...],
) -> None:
    """An operator's probe: `?connect_timeout=5` (a libpq parameter, which asyncpg does
    not read and sends to the server as a setting), an unknown one, a bad `options` and a
    bad `target_session_attrs` each ended `status`, `migrate` and `run` with a traceback
    and exit 1. Each is one line naming the parameter and the setting it came in."""
    env = {
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": f"{dsn}?{query}",
        "ACKLINE_TOPIC": topic,
        "ACKLINE_DLQ_TOPIC": f"{topic}.dlq",
        "ACKLINE_GROUP_ID": f"g-{topic}",
        "ACKLINE_METRICS_PORT": "0",
    }
    out = ackline(*argv, env=env, cwd=work)
    assert out.status == 2, out
    assert_one_line(out, *needles, logs_allowed=argv == ("run",))


# --- paths that cannot be written or read ---------------------------------------------------


def test_dev_up_with_a_read_only_state_dir(work: Path) -> None:
    ro = _readonly_dir(work)
    out = ackline("dev", "up", env={"ACKLINE_STATE_DIR": str(ro)}, cwd=work, unprivileged=True)
    assert_one_line(out, str(ro), "ACKLINE_STATE_DIR")


def test_produce_to_a_read_only_manifest_path(services: Services, work: Path) -> None:
    ro = _readonly_dir(work)
    topic = f"t-{uuid.uuid4().hex[:12]}"
    manifest = ro / "manifest.jsonl.gz"
    env = {
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": "postgresql://x@127.0.0.1:1/x",
    }
    out = ackline(
        "--topic", topic, "produce", "--events", "50", "--manifest", str(manifest),
        env=env, cwd=work, unprivileged=True,
    )  # fmt: skip
    assert_one_line(out, str(manifest), "--manifest")
    # refused before anything was sent: the topic was not even created
    assert partition_count(services.bootstrap, topic) is None


def test_produce_refuses_to_overwrite_a_manifest(services: Services, work: Path) -> None:
    topic = f"t-{uuid.uuid4().hex[:12]}"
    manifest = work / "manifest.jsonl.gz"
    manifest.write_bytes(b"precious")
    env = {
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": "postgresql://x@127.0.0.1:1/x",
    }
    out = ackline(
        "--topic", topic, "produce", "--events", "50", "--manifest", str(manifest),
        env=env, cwd=work,
    )  # fmt: skip
    assert_one_line(out, str(manifest), "--force")
    assert manifest.read_bytes() == b"precious"
    assert partition_count(services.bootstrap, topic) is None


def _truncated_gzip(path: Path) -> None:
    data = gzip.compress(b'{"manifest": "ackline-load"}\n' * 2000)
    path.write_bytes(data[: len(data) // 2])


def _not_gzip(path: Path) -> None:
    path.write_bytes(b"this is not gzip\n")


def _directory(path: Path) -> None:
    path.mkdir()


@pytest.mark.parametrize(
    "make", [_truncated_gzip, _not_gzip, _directory], ids=["truncated", "not-gzip", "directory"]
)
def test_verify_with_an_unreadable_manifest(
    services: Services, work: Path, make: Callable[[Path], None]
) -> None:
    manifest = work / "manifest.jsonl.gz"
    make(manifest)
    env = {
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": services.database_url,
    }
    out = ackline("verify", "--manifest", str(manifest), env=env, cwd=work)
    assert_one_line(out, str(manifest))


@pytest.fixture
def stuck_topic(services: Services) -> Iterator[str]:
    """A topic whose last record sits in a transaction left open for the whole test:
    a read_committed reader cannot reach the end of its range, so a capture that reads
    before it checks its output path runs into its idle timeout instead."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    ensure_topic(services.bootstrap, name, partitions=1)
    producer = Producer(
        {"bootstrap.servers": services.bootstrap, "transactional.id": f"stuck-{name}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(name, key=b"k", value=b"committed")
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(name, key=b"k", value=b"open")
    producer.flush(30)
    yield name
    producer.abort_transaction(30)


def test_capture_to_an_unwritable_path(services: Services, stuck_topic: str, work: Path) -> None:
    ro = _readonly_dir(work)
    target = ro / "range.ackcap"
    env = {
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": "postgresql://x@127.0.0.1:1/x",
    }
    out = ackline(
        "capture", stuck_topic, str(target), "--idle-timeout", "20", "--quiet",
        env=env, cwd=work, unprivileged=True,
    )  # fmt: skip
    assert_one_line(out, str(target))
    assert sorted(p.name for p in ro.iterdir()) == []


def test_capture_to_a_directory(services: Services, stuck_topic: str, work: Path) -> None:
    target = work / "range.ackcap"
    target.mkdir()
    env = {
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": "postgresql://x@127.0.0.1:1/x",
    }
    out = ackline(
        "capture", stuck_topic, str(target), "--idle-timeout", "20", "--quiet",
        env=env, cwd=work,
    )  # fmt: skip
    assert_one_line(out, str(target), "directory")
    assert sorted(p.name for p in work.iterdir()) == ["range.ackcap"]  # no .partial left


# --- a closed pipe, and the database down under `tail` -------------------------------------


async def _many_rejects(dsn: str, n: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """
            INSERT INTO rejects (reason, detail, raw_value, group_id, src_topic, src_partition,
                                 src_offset, dlq_topic, dlq_partition, dlq_offset, batch_id)
            SELECT 'not_json', 'line ' || g || ': not JSON, a long enough detail text',
                   '\\x00'::bytea, 'ackline', 'agent-activity', 0, g, 'agent-activity.dlq',
                   0, g, 1
            FROM generate_series(1, $1) AS g
            """,
            n,
        )
    finally:
        await conn.close()


def test_rejects_list_into_a_closed_pipe(services: Services, dsn: str, work: Path) -> None:
    asyncio.run(_many_rejects(dsn, 3000))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ACKLINE_")},
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": dsn,
        "ACKLINE_GROUP_ID": "ackline",
    }
    proc = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m ackline rejects list --limit 3000 | head -3"],
        env=env,
        cwd=work,
        capture_output=True,
        check=False,
        text=True,
        timeout=BOUND_S,
    )
    assert len(proc.stdout.splitlines()) == 3
    assert proc.stderr == "", proc.stderr


def test_tail_with_the_database_down_says_so_and_stops(work: Path) -> None:
    port = _closed_port()
    env = {"ACKLINE_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/ackline"}
    out = ackline("tail", "--from-start", "--limit", "1", env=env, cwd=work)
    assert_one_line(out, "PostgreSQL", f"127.0.0.1:{port}")
