"""A local PostgreSQL server for the dev stack, run from the system's server binaries.

State lives under ``<state_dir>/pg/``::

    data/              the cluster (initdb once; ackline.conf rewritten on every start)
    run/               the unix socket directory (/tmp when that path would be too long)
    log/postgres.log   the server log

PostgreSQL refuses to run as root, so when we are root the server runs as the
unprivileged system user ``ackline-pg`` (created on first use) via ``runuser``;
otherwise it runs as ourselves. Clients connect over TCP to 127.0.0.1 as the
``postgres`` role with trust authentication.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from ackline.dev import _proc
from ackline.dev.errors import DevStackError
from ackline.dev.osuser import ensure_system_user
from ackline.dev.ports import HOST, port_accepts, wait_port_free

PG_OS_USER = "ackline-pg"
PG_ROLE = "postgres"
StopMode = Literal["smart", "fast", "immediate"]
_STOP_SIGNALS: dict[str, signal.Signals] = {
    "smart": signal.SIGTERM,
    "fast": signal.SIGINT,
    "immediate": signal.SIGQUIT,
}
_SERVER_PROGRAMS = ("initdb", "pg_ctl", "postgres", "pg_isready", "psql")
_SOCKET_PATH_MAX = 100  # sun_path holds 107 bytes + NUL; keep some margin
_LOG_TAIL_LINES = 30
_INCLUDE_LINE = "include_if_exists = 'ackline.conf'  # added by ackline.dev.postgres"
_DB_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def _has_server_programs(bindir: Path) -> bool:
    return all(os.access(bindir / name, os.X_OK) for name in _SERVER_PROGRAMS)


def _version_key(path: Path) -> tuple[int, ...]:
    # /usr/lib/postgresql/<version>/bin
    return tuple(int(part) for part in re.findall(r"\d+", path.parent.name)) or (0,)


def find_pg_bindir() -> Path:
    """The directory of the PostgreSQL server programs (initdb, pg_ctl, postgres, ...).

    Looked up with ``pg_config --bindir``, then the highest ``/usr/lib/postgresql/*/bin``,
    then ``pg_ctl`` on PATH. Raises DevStackError when none has the server programs.
    """
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        try:
            out = _proc.run([pg_config, "--bindir"], timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out:
            candidates.append(Path(out))
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl is not None:
        candidates.append(Path(pg_ctl).parent)
    for bindir in candidates:
        if _has_server_programs(bindir):
            return bindir
    raise DevStackError(
        "PostgreSQL server programs (initdb, pg_ctl, postgres) not found via pg_config, "
        "/usr/lib/postgresql/*/bin or PATH; install them with "
        "`apt-get install -y postgresql` (run as root)"
    )


def ensure_pg_installed() -> Path:
    """:func:`find_pg_bindir`, installing the ``postgresql`` apt package first if needed.

    Concurrent callers (the two test workers of `make test` on a machine without
    PostgreSQL) serialize on a lock file: two apt-get runs at once fail on dpkg's lock.
    """
    try:
        return find_pg_bindir()
    except DevStackError:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise
    with _proc.file_lock(Path("/var/lock/ackline-pg-install.lock")):
        with contextlib.suppress(DevStackError):
            return find_pg_bindir()  # installed by another caller while this one waited
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "postgresql"]):
            try:
                proc = _proc.run(argv, env=env, timeout=1800)
            except subprocess.TimeoutExpired as exc:
                raise DevStackError(f"`{' '.join(argv)}` timed out") from exc
            if proc.returncode != 0:
                lines = (proc.stdout + proc.stderr).splitlines()[-_LOG_TAIL_LINES:]
                raise DevStackError(
                    f"`{' '.join(argv)}` failed (exit {proc.returncode}):\n" + "\n".join(lines)
                )
        return find_pg_bindir()


def _client_env() -> dict[str, str]:
    """Our environment without PG* variables that could redirect client programs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGCONNECT_TIMEOUT"] = "5"
    return env


class PostgresNode:
    """The local PostgreSQL server whose state lives in ``<state_dir>/pg``.

    Construction does no I/O. :meth:`start` installs PostgreSQL if needed (root only),
    runs initdb once, writes the settings and starts the server detached.

    Longer than the house's ~300 lines per class because one server's whole life is here
    (install, the unprivileged OS user, initdb, settings, start, readiness, psql, stop,
    kill): each step is short, and they share the paths and the user they act as.
    """

    def __init__(self, state_dir: Path, port: int, os_user: str = PG_OS_USER) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.port = port
        self.home = self.state_dir / "pg"
        self.data_dir = self.home / "data"
        self.run_dir = self.home / "run"
        self.log_dir = self.home / "log"
        self.log_path = self.log_dir / "postgres.log"
        self.as_root = os.geteuid() == 0
        # The OS user the server runs as: ``os_user`` when we are root, else ourselves.
        self.os_user = os_user if self.as_root else pwd.getpwuid(os.geteuid()).pw_name
        self._bindir: Path | None = None

    def __repr__(self) -> str:
        return f"PostgresNode({str(self.state_dir)!r}, port={self.port})"

    @property
    def socket_dir(self) -> Path:
        """``pg/run``, or /tmp when the socket path would exceed the unix limit."""
        if len(os.fsencode(self.run_dir / f".s.PGSQL.{self.port}")) <= _SOCKET_PATH_MAX:
            return self.run_dir
        return Path("/tmp")

    @property
    def bindir(self) -> Path:
        if self._bindir is None:
            self._bindir = ensure_pg_installed()
        return self._bindir

    def dsn(self, dbname: str = "postgres") -> str:
        """``postgresql://postgres@127.0.0.1:<port>/<dbname>``."""
        return f"postgresql://{PG_ROLE}@{HOST}:{self.port}/{dbname}"

    # -- state ---------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The postmaster's pid (from ``data/postmaster.pid``) when it is running."""
        pid = _proc.read_pid_file(self.data_dir / "postmaster.pid")
        if pid is None or not _proc.is_alive(pid):
            return None
        argv = _proc.cmdline(pid)
        if argv and not (argv[0].endswith("postgres") or argv[0].endswith("postmaster")):
            return None  # a stale postmaster.pid whose pid was reused
        return pid

    def is_running(self) -> bool:
        return self.pid is not None

    # -- start ---------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        """Start the server (no-op when running) and wait until it accepts connections."""
        if self.is_running():
            self.wait_ready(timeout)
            return
        bindir = self.bindir
        self._remove_stale_pid_file()
        self._prepare_dirs()
        self._initdb(bindir)
        self._write_settings()
        if not wait_port_free(self.port, 10.0):
            raise DevStackError(
                f"cannot start PostgreSQL: port {HOST}:{self.port} is already in use"
            )
        argv = [
            str(bindir / "pg_ctl"),
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_path),
            "-w",
            "-t",
            str(max(1, int(timeout))),
            "-s",
            "start",
        ]
        proc = self._run_as_server_user(argv, timeout + 15)
        if proc.returncode != 0:
            self.kill()
            raise DevStackError(
                f"PostgreSQL did not start (pg_ctl exit {proc.returncode}): "
                f"{(proc.stdout + proc.stderr).strip()}\nlast log lines:\n{self._log_tail()}"
            )
        postmaster = self.pid
        if postmaster is not None:  # pg_ctl starts it in a session of its own
            _proc.nice_session(postmaster)
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the server accepts connections on 127.0.0.1:<port> (pg_isready)."""
        deadline = time.monotonic() + timeout
        argv = [
            str(self.bindir / "pg_isready"),
            "-q",
            "-h",
            HOST,
            "-p",
            str(self.port),
            "-U",
            PG_ROLE,
            "-d",
            "postgres",
            "-t",
            "2",
        ]
        while True:
            if not self.is_running():
                raise DevStackError(
                    "PostgreSQL is not running; last log lines:\n" + self._log_tail()
                )
            if port_accepts(self.port):
                ready = _proc.run(argv, env=_client_env(), timeout=10)
                if ready.returncode == 0:
                    return
            if time.monotonic() >= deadline:
                raise DevStackError(
                    f"PostgreSQL did not accept connections on {HOST}:{self.port} within "
                    f"{timeout:.0f} s; last log lines:\n{self._log_tail()}"
                )
            time.sleep(0.2)

    def _prepare_dirs(self) -> None:
        for directory in (self.home, self.run_dir, self.log_dir):
            directory.mkdir(parents=True, exist_ok=True)
        if not self.as_root:
            return
        uid, gid = ensure_system_user(self.os_user)
        for path in (self.home, self.run_dir, self.log_dir, self.log_path):
            if path.exists():
                os.chown(path, uid, gid)
        self.home.chmod(0o755)
        self._check_traversable()

    def _check_traversable(self) -> None:
        """The server user must reach ``pg/``: every parent directory needs o+x (or so)."""
        if self._as_user_ok(["test", "-w", str(self.home), "-a", "-x", str(self.home)]):
            return
        for directory in [*reversed(self.home.parents), self.home]:
            if not self._as_user_ok(["test", "-x", str(directory)]):
                raise DevStackError(
                    f"PostgreSQL runs as the unprivileged user {self.os_user!r} (it refuses to "
                    f"run as root), and that user cannot traverse {directory}: every parent "
                    f"directory of the state dir must be traversable (e.g. `chmod o+x "
                    f"{directory}`), or use a state dir elsewhere (e.g. under /tmp)"
                )
        raise DevStackError(f"the user {self.os_user!r} cannot write to {self.home}")

    def _as_user_ok(self, argv: Sequence[str]) -> bool:
        return self._run_as_server_user(argv, 30).returncode == 0

    def _run_as_server_user(
        self, argv: Sequence[str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        full = ["runuser", "-u", self.os_user, "--", *argv] if self.as_root else list(argv)
        try:
            return _proc.run(full, cwd=self.home, timeout=timeout, new_session=True)
        except subprocess.TimeoutExpired as exc:
            raise DevStackError(f"`{' '.join(full)}` timed out after {timeout:.0f} s") from exc

    def _initdb(self, bindir: Path) -> None:
        """initdb once; a half-finished cluster (no PG_VERSION) is removed and redone."""
        if (self.data_dir / "PG_VERSION").is_file():
            return
        shutil.rmtree(self.data_dir, ignore_errors=True)
        argv = [
            str(bindir / "initdb"),
            "-D",
            str(self.data_dir),
            "-U",
            PG_ROLE,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
        ]
        proc = self._run_as_server_user(argv, 300)
        if proc.returncode != 0 or not (self.data_dir / "PG_VERSION").is_file():
            raise DevStackError(
                f"initdb failed (exit {proc.returncode}):\n"
                + "\n".join((proc.stdout + proc.stderr).splitlines()[-_LOG_TAIL_LINES:])
            )
        with (self.data_dir / "postgresql.conf").open("a", encoding="utf-8") as fh:
            fh.write(f"\n{_INCLUDE_LINE}\n")

    def _write_settings(self) -> None:
        """Rewrite ``data/ackline.conf`` (port and socket dir may change between runs)."""
        settings = {
            "listen_addresses": f"'{HOST}'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "max_connections": "200",
            "shared_buffers": "256MB",
            "fsync": "on",
            "logging_collector": "off",
            "log_line_prefix": "'%m [%p] %q%u@%d '",
        }
        text = "# Written by ackline.dev.postgres on every start; edits are overwritten.\n"
        text += "".join(f"{key} = {value}\n" for key, value in settings.items())
        path = self.data_dir / "ackline.conf"
        path.write_text(text, encoding="utf-8")
        if self.as_root:
            uid, gid = ensure_system_user(self.os_user)
            os.chown(path, uid, gid)
        path.chmod(0o600)

    def _log_tail(self) -> str:
        return _proc.tail(self.log_path, _LOG_TAIL_LINES) or "(no server log)"

    # -- databases -----------------------------------------------------------------

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        """Run ``sql`` with psql as the ``postgres`` role; returns unaligned output."""
        argv = [
            str(self.bindir / "psql"),
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            HOST,
            "-p",
            str(self.port),
            "-U",
            PG_ROLE,
            "-d",
            dbname,
            "-c",
            sql,
        ]
        proc = _proc.run(argv, env=_client_env(), timeout=60)
        if proc.returncode != 0:
            raise DevStackError(f"psql failed: {proc.stderr.strip()} (sql: {sql})")
        return proc.stdout.strip()

    def ensure_database(self, name: str) -> bool:
        """Create database ``name`` when absent; True when it was created."""
        if not _DB_NAME.fullmatch(name):
            raise DevStackError(f"invalid database name {name!r}: use [a-z_][a-z0-9_]*")
        exists = self.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'")
        if exists == "1":
            return False
        try:
            self.psql(f'CREATE DATABASE "{name}"')
        except DevStackError as exc:
            if "already exists" in str(exc):
                return False
            raise
        return True

    # -- stop ----------------------------------------------------------------------

    def stop(self, mode: StopMode = "fast", timeout: float = 60.0) -> None:
        """Shut down in ``mode`` (smart/fast/immediate), SIGKILL after ``timeout``.

        Returns once the postmaster and all its children are gone.
        """
        pid = self.pid
        if pid is None:
            return
        group = [pid, *_proc.children(pid)]
        _proc.send(pid, _STOP_SIGNALS[mode])
        if not _proc.wait_gone(group, timeout):
            self._kill_group(pid)

    def kill(self) -> None:
        """Crash the server: SIGKILL the postmaster and its children (for chaos tests).

        Like a power loss of the database host minus the OS page cache: the next
        :meth:`start` runs crash recovery from the WAL.
        """
        pid = self.pid
        if pid is not None:
            self._kill_group(pid)

    def _kill_group(self, pid: int) -> None:
        group = [pid, *_proc.children(pid)]
        for member in group:
            _proc.send(member, signal.SIGKILL)
        if not _proc.wait_gone(group, 15.0):
            raise DevStackError(f"PostgreSQL processes {group} survived SIGKILL")
        self._remove_stale_pid_file()

    def _remove_stale_pid_file(self) -> None:
        """Drop the lock files (``postmaster.pid``, socket lock) of a killed server.

        PostgreSQL itself only ignores a stale lock file when ``kill(pid, 0)`` fails,
        which it does not for a zombie, and a killed postmaster stays a zombie where
        PID 1 does not reap orphans (some containers and sandboxes).
        """
        for path in (
            self.data_dir / "postmaster.pid",
            self.socket_dir / f".s.PGSQL.{self.port}.lock",
        ):
            pid = _proc.read_pid_file(path)
            if pid is not None and not _proc.is_alive(pid):
                path.unlink(missing_ok=True)

    def restart(self, mode: StopMode = "fast", timeout: float = 60.0) -> None:
        """:meth:`stop` in ``mode``, then :meth:`start`."""
        self.stop(mode)
        self.start(timeout)
