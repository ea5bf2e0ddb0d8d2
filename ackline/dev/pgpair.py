"""A PostgreSQL primary with one streaming standby, for failover tests and chaos.

Two :class:`ackline.dev.postgres.PostgresNode` clusters (``<base>/a`` and ``<base>/b``,
the same server binaries, the servers run as the unprivileged ``ackline-pg`` when we are
root), either of which can be the primary. Replication is physical streaming through one
replication slot per standby; ``wal_log_hints`` lets :meth:`PgPair.rebuild` ``pg_rewind`` a
crashed old primary, and ``wal_keep_size`` keeps the WAL that rewind needs.

Synchronous mode (``synchronous_standby_names='*'``, remote flush) is set with ALTER SYSTEM
on the running primary, so it is never copied to a standby: a freshly promoted server
starts asynchronous (its commits do not wait for a standby that does not exist yet) and
:meth:`PgPair.rebuild` turns synchronous mode back on once the new standby streams.

Role changes (synchronous, subprocess based; what each costs is in docs/faults.md):

* :meth:`PgPair.crash`     every process of the primary stops at one instant, then SIGKILL
  (a host that dies); optionally its WAL sender is frozen first for a while, so the
  standby falls that far behind and an asynchronous failover loses those commits;
* :meth:`PgPair.promote`   ``pg_ctl promote`` the standby and wait until it takes a write;
* :meth:`PgPair.rebuild`   make the old primary a standby of the new one: ``CHECKPOINT`` on
  the new primary (pg_rewind reads its timeline from pg_control), ``pg_rewind``, else a
  fresh ``pg_basebackup``. A failed primary is never started as a primary again (two
  writable servers would both take writes: split brain).

Each node may have a tablespace directory of its own (``tablespace_dir``, a small
filesystem for disk-full tests): the standby's copy is mapped there
(``pg_basebackup --tablespace-mapping``), so the two never share a directory.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ackline.dev import _proc
from ackline.dev.errors import DevStackError
from ackline.dev.ports import HOST
from ackline.dev.postgres import PG_ROLE, PostgresNode, _client_env

Mode = Literal["sync", "async"]
NAMES = ("a", "b")

# Appended to ackline.conf (later lines win over PostgresNode's settings).
HA_SETTINGS: dict[str, str] = {
    "shared_buffers": "128MB",
    "max_connections": "200",
    "wal_level": "replica",
    "wal_log_hints": "on",  # pg_rewind needs hint-bit changes WAL-logged
    "max_wal_senders": "10",
    "max_replication_slots": "10",
    "hot_standby": "on",
    "synchronous_commit": "on",
    "wal_receiver_status_interval": "1s",
    "max_wal_size": "1GB",
    # pg_rewind reads the crashed target's own WAL back to the last checkpoint before the
    # divergence; keep that much so a checkpoint cannot have recycled it.
    "wal_keep_size": "1GB",
    "log_min_messages": "warning",
}


class PairNode(PostgresNode):
    """A :class:`PostgresNode` that can be a primary or a streaming standby."""

    def __init__(
        self, name: str, base: Path, port: int, tablespace_dir: Path | None = None
    ) -> None:
        super().__init__(Path(base) / name, port)
        self.name = name
        self.tablespace_dir = tablespace_dir

    def __repr__(self) -> str:
        return f"PairNode({self.name!r}, port={self.port})"

    @property
    def slot(self) -> str:
        """The replication slot this node streams through when it is a standby."""
        return f"standby_{self.name}"

    def conninfo(self) -> str:
        return f"host={HOST} port={self.port} user={PG_ROLE} dbname=postgres"

    def _write_settings(self) -> None:
        super()._write_settings()
        settings = {**HA_SETTINGS, "cluster_name": f"'{self.name}'"}
        with (self.data_dir / "ackline.conf").open("a", encoding="utf-8") as fh:
            fh.write("# added by ackline.dev.pgpair\n")
            fh.writelines(f"{k} = {v}\n" for k, v in settings.items())

    def tool(self, argv: Sequence[str], timeout: float = 600.0) -> str:
        """Run a server program (pg_basebackup, pg_rewind, pg_ctl) as the server user."""
        full = [str(self.bindir / argv[0]), *argv[1:]]
        prefix = ["runuser", "-u", self.os_user, "--"] if self.as_root else []
        proc = _proc.run(
            [*prefix, *full], cwd=self.home, env=_client_env(), timeout=timeout, new_session=True
        )
        if proc.returncode != 0:
            raise DevStackError(
                f"{argv[0]} failed (exit {proc.returncode}): {(proc.stdout + proc.stderr).strip()}"
            )
        return proc.stdout + proc.stderr

    def in_recovery(self) -> bool:
        return self.psql("SELECT pg_is_in_recovery()") == "t"

    def own(self, path: Path, mode: int = 0o600) -> None:
        """Give ``path`` to the server's OS user (PostgreSQL insists on owning its files)."""
        if self.as_root:
            entry = pwd.getpwnam(self.os_user)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        path.chmod(mode)

    def write_standby_config(self, upstream: PairNode) -> None:
        """Make the stopped cluster start as a standby of ``upstream``: auto.conf holds
        only primary_conninfo and primary_slot_name (whatever a copy brought along, such
        as the upstream's synchronous_standby_names, must not apply here)."""
        auto = self.data_dir / "postgresql.auto.conf"
        auto.write_text(
            "# written by ackline.dev.pgpair: this node is a standby\n"
            f"primary_conninfo = '{upstream.conninfo()} application_name={self.name}'\n"
            f"primary_slot_name = '{self.slot}'\n",
            encoding="utf-8",
        )
        self.own(auto)
        standby_signal = self.data_dir / "standby.signal"
        standby_signal.write_text("", encoding="utf-8")
        self.own(standby_signal)

    def empty_tablespace_dir(self) -> None:
        """Remove what a previous life left in the tablespace directory (a basebackup needs
        it empty); the directory itself stays, owned by the server user."""
        if self.tablespace_dir is None:
            return
        if self.tablespace_dir.exists():
            for child in self.tablespace_dir.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        else:
            self.tablespace_dir.mkdir(parents=True)
        self.own(self.tablespace_dir, 0o700)


@dataclass
class PgPair:
    """A primary and its standby under ``base``; roles swap on :meth:`promote`."""

    base: Path
    primary: PairNode
    standby: PairNode
    mode: Mode = "async"
    standby_down: bool = False
    """The standby is crashed and not rebuilt yet (after a failover)."""

    @property
    def nodes(self) -> tuple[PairNode, PairNode]:
        """Both nodes in a fixed order (a, b): the order of the multi-host DSN."""
        return tuple(sorted((self.primary, self.standby), key=lambda n: n.name))  # type: ignore[return-value]

    def dsn(self, dbname: str = "postgres") -> str:
        """Both nodes, ``target_session_attrs=read-write``: the client finds the primary."""
        hosts = ",".join(f"{HOST}:{n.port}" for n in self.nodes)
        return f"postgresql://{PG_ROLE}@{hosts}/{dbname}?target_session_attrs=read-write"

    def primary_dsn(self, dbname: str = "postgres") -> str:
        return self.primary.dsn(dbname)

    # -- start and stop ------------------------------------------------------------

    def start(self, mode: Mode, timeout: float = 120.0) -> None:
        """Start the primary (initdb once), create a standby from it if it has none, and
        stream. A tablespace ``ackline_ts`` is created in the primary's tablespace
        directory first when it has one (so the standby's copy is mapped)."""
        primary, standby = self.primary, self.standby
        primary.start(timeout)
        exists = "SELECT count(*) FROM pg_tablespace WHERE spcname = 'ackline_ts'"
        if (
            primary.tablespace_dir is not None
            and standby.tablespace_dir is not None
            and primary.psql(exists) == "0"
        ):
            primary.empty_tablespace_dir()
            primary.psql(f"CREATE TABLESPACE ackline_ts LOCATION '{primary.tablespace_dir}'")
        if not (standby.data_dir / "PG_VERSION").is_file():
            self._basebackup(standby, primary)
        standby.start(timeout)
        wait_streaming(primary, standby, timeout)
        self.set_mode(mode)

    def stop(self) -> None:
        for n in self.nodes:
            try:
                n.stop("immediate", timeout=30)
            except DevStackError:
                n.kill()

    def set_mode(self, mode: Mode) -> None:
        """Synchronous (commits wait for the standby's flush) or asynchronous replication."""
        value = "*" if mode == "sync" else ""
        self.primary.psql(f"ALTER SYSTEM SET synchronous_standby_names = '{value}'")
        self.primary.psql("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 10
        while self.primary.psql("SHOW synchronous_standby_names") != value:
            if time.monotonic() > deadline:
                raise DevStackError("synchronous_standby_names did not reload")
            time.sleep(0.05)
        self.mode = mode

    # -- failover ------------------------------------------------------------------

    def hold_wal_senders(self) -> list[int]:
        """SIGSTOP the primary's WAL sender(s): from now on an asynchronous standby
        receives nothing (a synchronous one holds every commit unanswered) until
        :meth:`crash` or :meth:`release_wal_senders`. Their pids."""
        pid = self.primary.pid
        if pid is None:
            raise DevStackError(f"{self.primary} is not running")
        senders = [
            p for p in _proc.children(pid) if any("walsender" in a for a in _proc.cmdline(p))
        ]
        if not senders:
            raise DevStackError(f"{self.primary} has no WAL sender to hold back")
        freeze(senders)
        return senders

    def release_wal_senders(self, pids: Sequence[int]) -> None:
        for p in pids:
            _proc.send(p, signal.SIGCONT)

    def crash(self, walsender_lag_s: float = 0.0) -> None:
        """The primary's host dies: every process of it is stopped at one instant, then
        killed. ``walsender_lag_s`` > 0 first freezes only its WAL sender(s) that long
        while its backends keep committing: an asynchronous standby falls that far behind
        and what it did not receive is lost with the primary (a synchronous one holds the
        commits unanswered instead)."""
        node = self.primary
        pid = node.pid
        if pid is None:
            raise DevStackError(f"{node} is not running: nothing to crash")
        group = [pid, *_proc.children(pid)]
        if walsender_lag_s > 0:
            self.hold_wal_senders()
            time.sleep(walsender_lag_s)
        freeze(group)
        for p in group:
            _proc.send(p, signal.SIGKILL)
        if not _proc.wait_gone(group, 15.0):
            raise DevStackError(f"PostgreSQL processes {group} survived SIGKILL")
        node._remove_stale_pid_file()

    def promote(self, timeout: float = 60.0) -> float:
        """Promote the standby (the old primary must be down) and wait until it takes a
        write; the roles swap and the old primary is marked down. Seconds taken."""
        old, new = self.primary, self.standby
        if old.is_running():
            raise DevStackError(f"{old} still runs: promoting {new} would make two primaries")
        started = time.monotonic()
        new.tool(["pg_ctl", "-D", str(new.data_dir), "-w", "-t", str(int(timeout)), "promote"])
        deadline = time.monotonic() + timeout
        while new.psql("SELECT pg_is_in_recovery()") != "f" or not _writable(new):
            if time.monotonic() > deadline:
                raise DevStackError(f"{new} does not take writes after promotion")
            time.sleep(0.05)
        self.primary, self.standby = new, old
        self.standby_down = True
        self.mode = "async"  # a promoted server has no synchronous names (see the module)
        return time.monotonic() - started

    def rebuild(self, mode: Mode | None = None, timeout: float = 600.0) -> str:
        """Make the crashed old primary a standby of the new one (pg_rewind, else a fresh
        pg_basebackup), then set ``mode`` when given. Returns "rewind" or "basebackup"."""
        new, old = self.primary, self.standby
        old.stop("immediate")
        new.psql("CHECKPOINT")  # pg_rewind reads the source's timeline from pg_control
        method = "rewind"
        try:
            old.tool(
                ["pg_rewind", "-D", str(old.data_dir), f"--source-server={new.conninfo()}"],
                timeout,
            )
            _ensure_slot(new, old.slot)
            old.write_standby_config(new)
            old.start(timeout)
            wait_streaming(new, old, 30.0)
        except DevStackError:
            old.kill()
            method = "basebackup"
            self._basebackup(old, new, timeout)
            old.start(timeout)
            wait_streaming(new, old, timeout)
        _drop_inactive_slots(old)
        self.standby_down = False
        if mode is not None:
            self.set_mode(mode)
        return method

    def _basebackup(self, node: PairNode, upstream: PairNode, timeout: float = 600.0) -> None:
        """Replace ``node``'s stopped cluster by a fresh copy of ``upstream`` (its
        tablespace mapped to ``node``'s own directory) and make it a standby."""
        _ensure_slot(upstream, node.slot)
        node._prepare_dirs()
        shutil.rmtree(node.data_dir, ignore_errors=True)
        argv = [
            "pg_basebackup",
            "-h", HOST, "-p", str(upstream.port), "-U", PG_ROLE,
            "-D", str(node.data_dir),
            "-X", "stream", "-S", node.slot, "-c", "fast",
        ]  # fmt: skip
        if upstream.tablespace_dir is not None and node.tablespace_dir is not None:
            node.empty_tablespace_dir()
            argv.append(f"--tablespace-mapping={upstream.tablespace_dir}={node.tablespace_dir}")
        node.tool(argv, timeout)
        node.write_standby_config(upstream)

    def caught_up(self) -> bool:
        """The standby has replayed everything the primary had flushed when asked."""
        lsn = self.primary.psql("SELECT pg_current_wal_flush_lsn()")
        return self.standby.psql(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn") == "t"


def freeze(pids: Sequence[int]) -> None:
    """SIGSTOP every one of ``pids`` (one instant for all of them, as a host that dies)."""
    for p in pids:
        _proc.send(p, signal.SIGSTOP)


def _writable(node: PairNode) -> bool:
    try:
        node.psql("CREATE TEMP TABLE ackline_pair_probe (x int)")
    except DevStackError:
        return False
    return True


def _ensure_slot(primary: PairNode, slot: str) -> None:
    primary.psql(
        "SELECT pg_create_physical_replication_slot(s, true) FROM (VALUES ('"
        + slot
        + "')) v(s) WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = s)"
    )


def _drop_inactive_slots(node: PairNode) -> None:
    """A copied cluster may carry slots nobody streams from (they would hold WAL)."""
    node.psql(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE NOT active"
    )


def wait_streaming(primary: PairNode, standby: PairNode, timeout: float = 60.0) -> None:
    """Wait until ``standby`` streams from ``primary`` (pg_stat_replication)."""
    deadline = time.monotonic() + timeout
    sql = f"SELECT state FROM pg_stat_replication WHERE application_name = '{standby.name}'"
    while primary.psql(sql) != "streaming":
        if time.monotonic() > deadline:
            raise DevStackError(f"{standby} is not streaming from {primary} after {timeout:.0f}s")
        time.sleep(0.1)


__all__ = ["HA_SETTINGS", "NAMES", "Mode", "PairNode", "PgPair", "freeze", "wait_streaming"]
