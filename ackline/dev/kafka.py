"""A single-node Kafka broker (KRaft, combined broker+controller) run from Maven jars.

The jars of ``org.apache.kafka:kafka_2.13`` are fetched once with Maven into
``${XDG_CACHE_HOME:-~/.cache}/ackline/kafka-<version>/libs`` (see :func:`ensure_jars`);
the broker runs as a detached JVM (its own session, so it outlives the Python process
that started it) whose state lives under ``<state_dir>/kafka/``::

    server.properties   written on every start (ports may change between runs)
    log4j2.properties   copied from the package on every start
    data/               log.dirs, formatted once (meta.properties is kept)
    logs/server.log     the broker log (log4j2)
    logs/kafka.out      the JVM's stdout/stderr
    kafka.pid           pid of the running JVM
"""

from __future__ import annotations

import base64
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from ackline.dev import _proc
from ackline.dev.errors import DevStackError
from ackline.dev.ports import HOST, port_accepts, wait_port_free

KAFKA_VERSION = "4.1.1"
MAIN_CLASS = "kafka.Kafka"
READY_MESSAGE = "Kafka Server started"
JVM_FLAGS: tuple[str, ...] = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)
_PACKAGE_DATA = Path(__file__).resolve().parent / "kafka"
_MAVEN_TIMEOUT_S = 1800.0
_LOG_TAIL_LINES = 30

# Backgrounds the command with its output appended to $1, then prints its pid. The
# shell exits at once, so the JVM is re-parented away from us (no zombie to reap, and
# no subprocess.Popen object left behind for a process we do not wait for).
_DETACH_SCRIPT = 'out=$1; shift; "$@" </dev/null >>"$out" 2>&1 & echo $!'


def cache_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/ackline/kafka-<version>``."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "ackline" / f"kafka-{KAFKA_VERSION}"


def ensure_jars() -> Path:
    """The directory of the broker's jars, fetched with Maven on first use.

    A marker file is written only after a complete copy, so an interrupted fetch is
    redone. Concurrent callers serialize on a lock file in the cache directory.
    """
    root = cache_dir()
    libs = root / "libs"
    marker = root / "libs.complete"
    if marker.is_file() and libs.is_dir():
        return libs
    root.mkdir(parents=True, exist_ok=True)
    with _proc.file_lock(root / ".lock"):
        if marker.is_file() and libs.is_dir():
            return libs
        count = _fetch_jars(libs)
        marker.write_text(f"kafka_2.13 {KAFKA_VERSION}: {count} jars\n", encoding="utf-8")
    return libs


def _fetch_jars(libs: Path) -> int:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DevStackError(
            "Maven (`mvn`) is not on PATH; it is needed once to fetch the Kafka jars "
            "(install it with `apt-get install -y maven`)"
        )
    shutil.rmtree(libs, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=libs.parent) as work:
        pom = Path(work) / "pom.xml"
        shutil.copyfile(_PACKAGE_DATA / "pom.xml", pom)
        out = Path(work) / "libs"
        argv = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={out}",
            *_maven_repo_override(),
        ]
        try:
            proc = _proc.run(argv, cwd=work, timeout=_MAVEN_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise DevStackError(f"fetching the Kafka jars with Maven timed out: {argv}") from exc
        if proc.returncode != 0:
            output = "\n".join((proc.stdout + proc.stderr).splitlines()[-_LOG_TAIL_LINES:])
            raise DevStackError(
                f"fetching the Kafka jars with Maven failed (exit {proc.returncode}):\n{output}"
            )
        if not (out / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file():
            raise DevStackError(f"Maven finished but kafka_2.13-{KAFKA_VERSION}.jar is missing")
        count = len(list(out.glob("*.jar")))
        out.rename(libs)
    return count


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _maven_repo_override() -> list[str]:
    """Maven's local repository under $HOME when $HOME is not the passwd home.

    Java takes ``user.home`` from the passwd entry, not from $HOME, so a user whose
    passwd home is missing (service accounts, CI containers) could not fetch at all.
    """
    try:
        passwd_home = Path(pwd.getpwuid(os.geteuid()).pw_dir)
    except KeyError:
        passwd_home = None
    home = Path.home()
    if passwd_home is not None and passwd_home == home:
        return []
    return [f"-Dmaven.repo.local={home / '.m2' / 'repository'}"]


def new_cluster_id() -> str:
    """A KRaft cluster id: 22 chars of URL-safe base64 (no padding), not starting with '-'."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def server_properties(data_dir: Path, port: int, controller_port: int) -> str:
    """The broker configuration of the single combined-mode node."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
        # Fast tests of both group protocols (KIP-848 "consumer" and "classic").
        "group.consumer.min.session.timeout.ms": "3000",
        "group.consumer.session.timeout.ms": "10000",
        "group.consumer.min.heartbeat.interval.ms": "500",
        "group.consumer.heartbeat.interval.ms": "1000",
        "group.min.session.timeout.ms": "3000",
        # After a crash (SIGKILL) the restarted broker cannot register until the
        # controller expires its previous registration (DUPLICATE_BROKER_REGISTRATION):
        # a 4 s session instead of the default 9 s keeps hard restarts short.
        "broker.session.timeout.ms": "4000",
        "broker.heartbeat.interval.ms": "1000",
    }
    lines = ["# Written by ackline.dev.kafka on every start; edits are overwritten."]
    lines += [f"{key}={_escape(value)}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\")


class KafkaNode:
    """The local broker whose state lives in ``<state_dir>/kafka``.

    Construction does no I/O; :meth:`start` fetches the jars if needed, formats the
    storage once, launches the JVM detached and waits until it serves.
    """

    def __init__(
        self,
        state_dir: Path,
        port: int,
        controller_port: int,
        *,
        home: Path | None = None,
        cluster_id: str | None = None,
    ) -> None:
        """``home`` (default ``<state_dir>/kafka``) and ``cluster_id`` (default: a new one
        at the first format) let several nodes of one cluster share a state directory
        (ackline.dev.cluster)."""
        self.state_dir = Path(state_dir).absolute()
        self.port = port
        self.controller_port = controller_port
        self.home = Path(home).absolute() if home is not None else self.state_dir / "kafka"
        self.cluster_id = cluster_id
        self.data_dir = self.home / "data"
        self.logs_dir = self.home / "logs"
        self.properties_path = self.home / "server.properties"
        self.log4j_path = self.home / "log4j2.properties"
        self.log_path = self.logs_dir / "server.log"
        self.stdout_path = self.logs_dir / "kafka.out"
        self.pid_path = self.home / "kafka.pid"
        self._log_offset = 0  # sizes of the logs at launch: readiness and errors
        self._out_offset = 0  # look only at what this run wrote

    def __repr__(self) -> str:
        return f"KafkaNode({str(self.state_dir)!r}, port={self.port})"

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:<port>`` for ``bootstrap.servers``."""
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The pid of this node's running JVM, or None."""
        pid = _proc.read_pid_file(self.pid_path)
        if pid is not None and self._is_ours(pid):
            return pid
        # Pid file missing or stale: look for a JVM running our server.properties.
        found = _proc.find_processes([MAIN_CLASS, str(self.properties_path)])
        return found[0] if found else None

    def is_running(self) -> bool:
        return self.pid is not None

    def _is_ours(self, pid: int) -> bool:
        argv = _proc.cmdline(pid)
        return MAIN_CLASS in argv and str(self.properties_path) in argv and _proc.is_alive(pid)

    # -- start ---------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> None:
        """Start the broker (no-op when running) and wait until it serves clients."""
        if self.is_running():
            self._wait_port(timeout)
            return
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> int:
        """Launch the JVM without waiting for readiness; returns its pid.

        Use :meth:`wait_ready` afterwards (``start`` does both).
        """
        running = self.pid
        if running is not None:
            return running
        for port in (self.port, self.controller_port):
            if not wait_port_free(port, 10.0):
                raise DevStackError(
                    f"cannot start Kafka: port {HOST}:{port} is already in use by another process"
                )
        libs = ensure_jars()
        java = shutil.which("java")
        if java is None:
            raise DevStackError("`java` is not on PATH; the local Kafka broker needs Java 17+")
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.properties_path.write_text(self.properties(), encoding="utf-8")
        shutil.copyfile(_PACKAGE_DATA / "log4j2.properties", self.log4j_path)
        self._format_storage(java, libs)
        self._log_offset = _file_size(self.log_path)
        self._out_offset = _file_size(self.stdout_path)
        argv = [*self._java_argv(java, libs), MAIN_CLASS, str(self.properties_path)]
        proc = _proc.run(
            ["/bin/sh", "-c", _DETACH_SCRIPT, "ackline-kafka", str(self.stdout_path), *argv],
            cwd=self.home,
            new_session=True,
            timeout=30,
        )
        try:
            pid = int(proc.stdout.strip())
        except ValueError as exc:
            raise DevStackError(
                f"could not launch the Kafka JVM (exit {proc.returncode}): {proc.stderr.strip()}"
            ) from exc
        _proc.write_pid_file(self.pid_path, pid)
        _proc.nice_session(pid)  # its own session: keep the priority it was started at
        return pid

    def properties(self) -> str:
        """The text of ``server.properties`` (written on every launch)."""
        return server_properties(self.data_dir, self.port, self.controller_port)

    def _java_argv(self, java: str, libs: Path) -> list[str]:
        return [
            java,
            *JVM_FLAGS,
            f"-Dlog4j2.configurationFile={self.log4j_path}",
            f"-Dkafka.logs.dir={self.logs_dir}",
            "-cp",
            f"{libs}/*",
        ]

    def _format_storage(self, java: str, libs: Path) -> None:
        """Format ``data/`` once; an unfinished format (no meta.properties) is redone."""
        if (self.data_dir / "meta.properties").is_file():
            return
        shutil.rmtree(self.data_dir, ignore_errors=True)
        argv = [
            *self._java_argv(java, libs),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            self.cluster_id or new_cluster_id(),
            "-c",
            str(self.properties_path),
        ]
        try:
            proc = _proc.run(argv, cwd=self.home, timeout=120)
        except subprocess.TimeoutExpired as exc:
            raise DevStackError("formatting the Kafka storage timed out") from exc
        if proc.returncode != 0 or not (self.data_dir / "meta.properties").is_file():
            output = "\n".join((proc.stdout + proc.stderr).splitlines()[-_LOG_TAIL_LINES:])
            raise DevStackError(
                f"formatting the Kafka storage in {self.data_dir} failed "
                f"(exit {proc.returncode}):\n{output}"
            )

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Wait for "Kafka Server started" (logged after :meth:`launch`) and an open port.

        On failure or timeout the JVM is killed and DevStackError carries the log tail.
        """
        deadline = time.monotonic() + timeout
        while True:
            pid = self.pid
            if pid is None:
                raise DevStackError(
                    "Kafka exited during startup; last log lines:\n" + self._log_tail()
                )
            if self._logged_ready() and port_accepts(self.port):
                return
            if time.monotonic() >= deadline:
                self.kill()
                raise DevStackError(
                    f"Kafka did not become ready on {self.bootstrap} within {timeout:.0f} s; "
                    "last log lines:\n" + self._log_tail()
                )
            time.sleep(0.2)

    def _logged_ready(self) -> bool:
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                if fh.tell() < self._log_offset:  # truncated or replaced meanwhile
                    self._log_offset = 0
                fh.seek(self._log_offset)
                return READY_MESSAGE.encode() in fh.read()
        except FileNotFoundError:
            return False

    def _wait_port(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not port_accepts(self.port):
            if not self.is_running():
                raise DevStackError("Kafka is not running; last log lines:\n" + self._log_tail())
            if time.monotonic() >= deadline:
                raise DevStackError(
                    f"Kafka is running but {self.bootstrap} does not accept connections"
                )
            time.sleep(0.2)

    def _log_tail(self) -> str:
        """The last lines of the broker log and JVM output written since :meth:`launch`."""
        text = _proc.tail(self.log_path, _LOG_TAIL_LINES, self._log_offset)
        text = text or f"(nothing new in {self.log_path})"
        out = _proc.tail(self.stdout_path, _LOG_TAIL_LINES, self._out_offset)
        if out:
            text += f"\n--- {self.stdout_path} ---\n{out}"
        return text

    # -- stop ----------------------------------------------------------------------

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (controlled shutdown), SIGKILL after ``timeout``; returns once gone."""
        pid = self.pid
        if pid is not None:
            _proc.send(pid, signal.SIGTERM)
            if not _proc.wait_gone([pid], timeout):
                self._kill_pid(pid)
        self.pid_path.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL the JVM (a crash, for chaos tests); returns once it is gone."""
        pid = self.pid
        if pid is not None:
            self._kill_pid(pid)
        self.pid_path.unlink(missing_ok=True)

    def _kill_pid(self, pid: int) -> None:
        _proc.send(pid, signal.SIGKILL)
        if not _proc.wait_gone([pid], 15.0):
            raise DevStackError(f"Kafka JVM pid {pid} survived SIGKILL")

    def restart(self, timeout: float = 90.0) -> None:
        """A clean stop followed by :meth:`start`."""
        self.stop()
        self.start(timeout)
