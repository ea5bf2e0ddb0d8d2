"""The local dev stack for real: a Kafka broker and a PostgreSQL server in a temp dir.

Nothing here is skipped: when a service cannot start, the test fails with the reason.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from confluent_kafka.admin import AdminClient

from ackline.dev import _proc, stack, tmpfs
from ackline.dev.errors import DevStackError
from ackline.streams.kafkainfo import group_members

pytestmark = pytest.mark.integration


@pytest.fixture()
def state_dir() -> Iterator[Path]:
    # Under /tmp and world-traversable: as root, PostgreSQL runs as an unprivileged user.
    path = Path(tempfile.mkdtemp(prefix="ackline-dev-test-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        try:
            stack.down(path)
        finally:
            shutil.rmtree(path, ignore_errors=True)


def _kafka_answers(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 5000})
    metadata = admin.list_topics(timeout=15)
    assert metadata.brokers, "the broker returned no metadata"
    assert {b.port for b in metadata.brokers.values()} == {int(bootstrap.rsplit(":", 1)[1])}


def _postgres_answers(database_url: str) -> None:
    async def query() -> tuple[int, str]:
        conn = await asyncpg.connect(database_url, timeout=10)
        try:
            row = await conn.fetchrow("SELECT 1 AS one, current_database() AS db")
            assert row is not None
            return int(row["one"]), str(row["db"])
        finally:
            await conn.close()

    assert asyncio.run(query()) == (1, "ackline")


def _pids(state_dir: Path) -> dict[str, int]:
    services = stack.status(state_dir)
    pids: dict[str, int] = {}
    for name, info in services.items():
        assert info["running"], f"{name} is not running: {info}"
        pids[name] = int(info["pid"])
    return pids


def test_up_restart_down(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(stack.ENV_KAFKA_BOOTSTRAP, raising=False)
    monkeypatch.delenv(stack.ENV_DATABASE_URL, raising=False)
    with pytest.raises(DevStackError, match="ackline dev up"):
        stack.resolve(state_dir)

    info = stack.up(state_dir)
    assert info.started_here
    assert info.kafka_bootstrap.startswith("127.0.0.1:")
    assert info.database_url.startswith("postgresql://postgres@127.0.0.1:")
    assert info.database_url.endswith("/ackline")
    _kafka_answers(info.kafka_bootstrap)
    _postgres_answers(info.database_url)
    # a fresh cluster's first group lookup is answered NOT_COORDINATOR while it makes
    # __consumer_offsets: the first worker warned that its twin check was skipped (an
    # operator's first run); asked again, the coordinator answers
    assert group_members(info.kafka_bootstrap, {}, "a-group-on-a-fresh-cluster") == []
    first = stack.status(state_dir)
    pids = _pids(state_dir)

    # Idempotent: same services, same ports, same processes.
    assert stack.up(state_dir) == info
    assert stack.status(state_dir) == first
    assert stack.resolve(state_dir) == info

    # The environment wins over the local stack and starts nothing.
    monkeypatch.setenv(stack.ENV_KAFKA_BOOTSTRAP, "kafka.example:9092")
    monkeypatch.setenv(stack.ENV_DATABASE_URL, "postgresql://u@db.example/x")
    assert stack.resolve(state_dir) == stack.StackInfo(
        "kafka.example:9092", "postgresql://u@db.example/x", started_here=False
    )
    monkeypatch.delenv(stack.ENV_KAFKA_BOOTSTRAP)
    monkeypatch.delenv(stack.ENV_DATABASE_URL)

    # Restarts keep the ports; a hard one is a crash (SIGKILL) plus recovery.
    stack.restart_postgres(state_dir, hard=False)
    stack.restart_postgres(state_dir, hard=True)
    _postgres_answers(info.database_url)
    stack.restart_kafka(state_dir, hard=True)
    _kafka_answers(info.kafka_bootstrap)
    stack.restart_kafka(state_dir, hard=False)
    _kafka_answers(info.kafka_bootstrap)
    restarted = _pids(state_dir)
    assert restarted["kafka"] != pids["kafka"]
    assert restarted["postgres"] != pids["postgres"]
    assert stack.resolve(state_dir) == info
    after = stack.status(state_dir)
    for name in ("kafka", "postgres"):
        assert after[name]["port"] == first[name]["port"]

    stack.down(state_dir)
    for pid in (*pids.values(), *restarted.values()):
        assert not _proc.is_alive(pid), f"pid {pid} is still alive after down"
    for name, service in stack.status(state_dir).items():
        assert not service["running"], f"{name} still running after down"
    stack.down(state_dir)  # idempotent
    with pytest.raises(DevStackError, match="ackline dev up"):
        stack.resolve(state_dir)


def test_unreachable_state_dir_is_an_error() -> None:
    """As root, a state dir the PostgreSQL user cannot traverse fails with the reason."""
    if os.geteuid() != 0:
        return  # the check only exists when the server runs as another user
    parent = Path(tempfile.mkdtemp(prefix="ackline-dev-closed-", dir="/tmp"))
    try:
        parent.chmod(0o700)
        node = stack.nodes(parent / "state", stack.StackPorts(1, 2, 3))[1]
        with pytest.raises(DevStackError, match="cannot traverse"):
            node.start()
        assert not node.is_running()
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def test_a_tmpfs_creates_its_owner_when_the_machine_has_none() -> None:
    """A fresh machine has no server user until PostgreSQL first starts; a disk-full stack
    mounts its tmpfs before that, so the mount creates the user itself (the infra suite
    run alone had failed: no OS user 'ackline-pg')."""
    owner = f"ackline-t{os.getpid() % 100000}"
    path = Path(tempfile.mkdtemp(prefix="ackline-tmpfs-test-", dir="/tmp")) / "ts"
    fs = tmpfs.Tmpfs(path, owner=owner)
    try:
        fs.mount(8 << 20)
        assert tmpfs.mounted(path)
        assert fs.dir.stat().st_uid == pwd.getpwnam(owner).pw_uid
    finally:
        if tmpfs.mounted(path):
            fs.unmount()
        shutil.rmtree(path.parent, ignore_errors=True)
        _proc.run(["userdel", owner], timeout=60)
