"""A vanishing network path for tests and chaos: two network namespaces and a veth pair.

A proxy is not a vanished host: it terminates TCP itself, so its kernel ACKs everything
and it forwards closes (ackline.dev.toxiproxy). A host that vanishes — a crash, a
failover, a firewall that starts dropping — answers nothing and closes nothing. This
module builds one out of the kernel's own parts, touching nothing outside what it
creates (the root namespace gets no interface, address or route)::

    server namespace  <name>-s   veth "vs"  SERVER_IP/30   (a PostgreSQL: NetnsPostgres)
    client namespace  <name>-c   veth "vc"  CLIENT_IP/30   (the process under test)

:meth:`VanishingLink.vanish` sets the server's end down: every packet is dropped both
ways, with no FIN, RST or ICMP, and both peers keep their sockets. Permanent neighbour
entries are set on both ends; without them a failed ARP would tell the client "no route
to host" after about 3 s, which a vanished host never says. :meth:`VanishingLink.restore`
brings the link back.

A process in the client namespace cannot reach the root namespace's 127.0.0.1 (Kafka of
the local stack, say): :class:`Forwarder` relays a TCP port from one namespace to
another (its listening socket is made in one namespace, its outgoing ones in the other,
through ``setns`` on a short-lived thread).

Namespaces are named ``ackline-<tag>-<pid>-{s,c}``. :meth:`VanishingLink.destroy` deletes
them (the veth pair goes with them); creating a link first deletes the namespaces of the
same tag left behind by a process that no longer exists, and never any other.

Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), Linux and iproute2's ``ip``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

from ackline.dev import _proc
from ackline.dev.errors import DevStackError
from ackline.dev.pglogin import LoginBytes
from ackline.dev.postgres import PostgresNode

T = TypeVar("T")

NETNS_DIR = Path("/run/netns")
PREFIX = "ackline-"
SERVER_DEV, CLIENT_DEV = "vs", "vc"
SERVER_IP, CLIENT_IP = "10.231.7.2", "10.231.7.1"  # inside our namespaces only
NETWORK = "10.231.7.0/30"
_CLONE_NEWNET = 0x40000000
_NAME = re.compile(r"ackline-(?P<tag>[a-z0-9]+)-(?P<pid>\d+)-[sc]")


class NetnsError(DevStackError):
    """A namespace, link or relay of this module could not be made, changed or removed."""


def netns_problem() -> str | None:
    """Why this machine cannot run a vanishing link, or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not on PATH"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def list_namespaces() -> list[str]:
    """Names of the named network namespaces (``ip netns list``)."""
    out = _ip("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def stale_namespaces(tag: str, names: Sequence[str], alive: Callable[[int], bool]) -> list[str]:
    """The namespaces of ``tag`` whose creating process (pid in the name) is gone. Pure."""
    stale = []
    for name in names:
        m = _NAME.fullmatch(name)
        if m and m["tag"] == tag and not alive(int(m["pid"])):
            stale.append(name)
    return stale


def delete_namespace(name: str) -> None:
    """Delete ``name`` after killing what still runs in it (processes keep a namespace
    alive). Only ever called on namespaces of this module."""
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)
    _proc.wait_gone([int(p) for p in pids if p.isdigit()], 10.0)
    _ip("netns", "del", name, check=False)
    if name in list_namespaces():
        raise NetnsError(f"could not delete network namespace {name}")


class VanishingLink:
    """A client and a server namespace joined by a veth pair that can vanish.

    Use as a context manager (or :meth:`create` / :meth:`destroy`): the namespaces exist
    only inside it, and are deleted on the way out, also on failure.
    """

    def __init__(self, tag: str = "vanish") -> None:
        if not re.fullmatch(r"[a-z0-9]{1,12}", tag):
            raise NetnsError(f"tag must be 1-12 characters of [a-z0-9], not {tag!r}")
        self.tag = tag
        base = f"{PREFIX}{tag}-{os.getpid()}"
        self.server_ns = f"{base}-s"
        self.client_ns = f"{base}-c"
        self.server_ip = SERVER_IP
        self.client_ip = CLIENT_IP
        self.network = NETWORK
        self._created = False

    def __enter__(self) -> VanishingLink:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def create(self) -> None:
        """Make both namespaces, the veth pair, its addresses and neighbour entries."""
        problem = netns_problem()
        if problem is not None:
            raise NetnsError(problem)
        for name in stale_namespaces(self.tag, list_namespaces(), _proc.is_alive):
            delete_namespace(name)
        self._created = True
        try:
            _ip("netns", "add", self.server_ns)
            _ip("netns", "add", self.client_ns)
            _ip(
                "link", "add", SERVER_DEV, "netns", self.server_ns, "type", "veth",
                "peer", "name", CLIENT_DEV, "netns", self.client_ns,
            )  # fmt: skip
            server = (self.server_ns, SERVER_DEV, self.server_ip)
            client = (self.client_ns, CLIENT_DEV, self.client_ip)
            for ns, dev, ip in (server, client):
                _ip("-n", ns, "addr", "add", f"{ip}/30", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
            for (ns, dev, _), (peer_ns, peer_dev, peer_ip) in ((server, client), (client, server)):
                mac = self._mac(peer_ns, peer_dev)
                _ip("-n", ns, "neigh", "replace", peer_ip, "lladdr", mac, "dev", dev,
                    "nud", "permanent")  # fmt: skip
        except BaseException:
            self.destroy()
            raise

    def destroy(self) -> None:
        """Delete both namespaces (and with them the veth pair). Idempotent."""
        if not self._created:
            return
        present = set(list_namespaces())
        for ns in (self.client_ns, self.server_ns):
            if ns in present:
                delete_namespace(ns)
        self._created = False

    @staticmethod
    def _mac(ns: str, dev: str) -> str:
        out = _ip("-n", ns, "-o", "link", "show", dev).stdout
        try:
            return out.split("link/ether ")[1].split()[0]
        except IndexError:
            raise NetnsError(f"no MAC address for {dev} in {ns}: {out.strip()}") from None

    def vanish(self) -> None:
        """The server's end goes down: from now on nothing crosses, nothing is closed."""
        _ip("-n", self.server_ns, "link", "set", SERVER_DEV, "down")

    def restore(self) -> None:
        """The server's end comes back up; both peers' sockets are as they were."""
        _ip("-n", self.server_ns, "link", "set", SERVER_DEV, "up")

    def exec_prefix(self, ns: str) -> list[str]:
        """The argv prefix that runs a command inside namespace ``ns``."""
        return ["ip", "netns", "exec", ns]

    def sysctl(self, ns: str, key: str, value: str) -> None:
        """Set a per-namespace sysctl (e.g. ``net.ipv4.tcp_retries2``) inside ``ns``."""
        proc = subprocess.run(
            [*self.exec_prefix(ns), "sysctl", "-q", "-w", f"{key}={value}"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise NetnsError(f"sysctl {key}={value} in {ns} failed: {proc.stderr.strip()}")


# -- running code inside a namespace ------------------------------------------------


def _setns(ns: str) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fd = os.open(NETNS_DIR / ns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(f"setns({ns}) failed: {os.strerror(err)}")
    finally:
        os.close(fd)


def submit_in_namespace(ns: str | None, fn: Callable[[], T]) -> Future[T]:
    """Run ``fn()`` on a fresh thread that joined network namespace ``ns`` (None: ours);
    its result or exception arrives in the returned future.

    Every socket the thread makes belongs to ``ns`` (an asyncio loop run there connects
    from ``ns``), and sockets keep their namespace when used from any other thread.
    """
    future: Future[T] = Future()

    def target() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            if ns is not None:
                _setns(ns)
            future.set_result(fn())
        except BaseException as exc:  # handed to whoever waits on the future
            future.set_exception(exc)

    threading.Thread(target=target, name=f"netns-{ns}", daemon=True).start()
    return future


def in_namespace(ns: str | None, make: Callable[[], T]) -> T:
    """``make()`` called inside network namespace ``ns`` (None: ours), e.g.
    ``in_namespace(ns, socket.socket)`` for a socket of ``ns``."""
    if ns is None:
        return make()
    return submit_in_namespace(ns, make).result()


class Forwarder:
    """Relays TCP from ``listen`` in namespace ``listen_ns`` to ``target`` in ``target_ns``.

    ``None`` is this process's own namespace. Each accepted connection gets one outgoing
    connection; bytes are copied both ways by two threads, and an EOF is passed on as a
    half-close. :meth:`close` stops accepting and closes every relayed connection.
    :meth:`mute` makes it carry a PostgreSQL client's login and nothing after it.
    """

    def __init__(
        self,
        listen: tuple[str, int],
        target: tuple[str, int],
        listen_ns: str | None = None,
        target_ns: str | None = None,
        max_connections: int | None = None,
    ) -> None:
        """``max_connections``: relay that many connections, then close each new one at
        once (a server that took a client's first connections and then went away)."""
        self.listen = listen
        self.target = target
        self.listen_ns = listen_ns
        self.target_ns = target_ns
        self.max_connections = max_connections
        self.accepted = 0
        self._server: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._muted = threading.Event()

    def __enter__(self) -> Forwarder:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        if self._server is None:
            raise NetnsError("the forwarder is not started")
        return int(self._server.getsockname()[1])

    def start(self) -> None:
        def listener() -> socket.socket:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(self.listen)
            sock.listen(64)
            sock.settimeout(0.2)
            return sock

        try:
            self._server = in_namespace(self.listen_ns, listener)
        except OSError as exc:
            raise NetnsError(f"cannot listen on {self.listen} in {self.listen_ns}: {exc}") from exc
        threading.Thread(target=self._accept, name="forwarder-accept", daemon=True).start()

    def mute(self, muted: bool = True) -> None:
        """While muted, a PostgreSQL client's bytes after its login (ackline.dev.pglogin)
        are dropped, on open connections and new ones alike; both TCP legs stay open and
        the server's bytes still pass. The client connects and logs in, then no statement
        ever gets an answer: a connection pooler that logs clients in itself while its
        server is gone, or a link that goes dark right after each handshake. What was
        dropped is not sent when unmuted."""
        if muted:
            self._muted.set()
        else:
            self._muted.clear()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            socks = [*self._open, *([self._server] if self._server else [])]
            self._open.clear()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        assert self._server is not None
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            if self.max_connections is not None and self.accepted > self.max_connections:
                client.close()
                continue
            client.settimeout(None)
            try:
                upstream = in_namespace(self.target_ns, socket.socket)
                upstream.settimeout(10)
                upstream.connect(self.target)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed.is_set():
                    client.close()
                    upstream.close()
                    return
                self._open.update((client, upstream))
            for src, dst, login in ((client, upstream, LoginBytes()), (upstream, client, None)):
                threading.Thread(
                    target=self._pump, args=(src, dst, login), name="forwarder-pump", daemon=True
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, login: LoginBytes | None) -> None:
        """Copy ``src`` to ``dst``; ``login`` follows a client's bytes (for :meth:`mute`)."""
        try:
            while chunk := src.recv(65536):
                part = login.take(chunk) if login is not None else len(chunk)
                if self._muted.is_set():
                    chunk = chunk[:part]
                if chunk:
                    dst.sendall(chunk)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


# -- a PostgreSQL server inside the server namespace --------------------------------


class NetnsPostgres(PostgresNode):
    """A :class:`PostgresNode` run inside ``link.server_ns``, listening on its address.

    Reached over the link from the client namespace (``dsn()``: trust authentication for
    the link's /30), and from anywhere through its unix socket, a file that no link can
    take away (``socket_dsn()``: the observer's path that never vanishes).
    """

    def __init__(
        self,
        state_dir: Path,
        link: VanishingLink,
        port: int = 5432,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(state_dir, port)
        self.link = link
        self.settings = {"listen_addresses": link.server_ip, **(settings or {})}

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@{self.link.server_ip}:{self.port}/{dbname}"

    def socket_dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@/{dbname}?host={self.socket_dir}&port={self.port}"

    def _run_in_namespace(
        self, argv: Sequence[str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` as the server's OS user inside the server namespace (``ip netns exec``
        needs root, so it comes first)."""
        user = ["runuser", "-u", self.os_user, "--"] if self.as_root else []
        full = [*self.link.exec_prefix(self.link.server_ns), *user, *argv]
        try:
            return _proc.run(full, cwd=self.home, timeout=timeout, new_session=True)
        except subprocess.TimeoutExpired as exc:
            raise NetnsError(f"`{' '.join(full)}` timed out after {timeout:.0f} s") from exc

    def start(self, timeout: float = 60.0) -> None:
        """initdb once, trust the link's /30, start in the server namespace with
        ``settings`` on the command line (they win over the files), wait until ready."""
        if self.is_running():
            self.wait_ready(timeout)
            return
        bindir = self.bindir
        self._remove_stale_pid_file()
        self._prepare_dirs()
        self._initdb(bindir)
        self._write_settings()
        hba = self.data_dir / "pg_hba.conf"
        line = f"host all all {self.link.network} trust\n"
        if line not in hba.read_text(encoding="utf-8"):
            with hba.open("a", encoding="utf-8") as fh:
                fh.write(line)
        argv = [
            str(bindir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_path),
            "-w", "-t", str(max(1, int(timeout))), "-s",
            "-o", " ".join(f"-c {k}={v}" for k, v in self.settings.items()), "start",
        ]  # fmt: skip
        proc = self._run_in_namespace(argv, timeout + 15)
        if proc.returncode != 0:
            self.kill()
            raise NetnsError(
                f"PostgreSQL did not start in {self.link.server_ns} (pg_ctl exit "
                f"{proc.returncode}): {(proc.stdout + proc.stderr).strip()}\n{self._log_tail()}"
            )
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the server answers on its unix socket (pg_isready)."""
        argv = [str(self.bindir / "pg_isready"), "-q", "-h", str(self.socket_dir),
                "-p", str(self.port), "-U", "postgres", "-t", "2"]  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            if not self.is_running():
                raise NetnsError("PostgreSQL is not running; last log lines:\n" + self._log_tail())
            if _proc.run(argv, timeout=10).returncode == 0:
                return
            if time.monotonic() >= deadline:
                raise NetnsError(
                    f"PostgreSQL not ready within {timeout:.0f} s:\n{self._log_tail()}"
                )
            time.sleep(0.2)
