"""The infrastructure-fault stack: three brokers, a PostgreSQL pair, fault proxies, small disks.

One state directory (default ``.ackline/chaos-infra``) holds, started by :func:`up` and
stopped by :func:`down` (which also works from another process, from ``infra.json``)::

    kafka1..3/          a three-broker KRaft cluster (ackline.dev.cluster)
    pg/a, pg/b          a primary and a streaming standby (ackline.dev.pgpair)
    ts/a, ts/b          a tmpfs per node holding its tablespace ``ackline_ts`` (disk=True)
    toxiproxy.log       one Toxiproxy server (ackline.dev.toxiproxy) on 127.0.0.1
    infra.json          every port, pid and mount, for down() and for clients

Every *client slot* (a worker of a chaos run, a test's worker) reaches Kafka and
PostgreSQL only through proxies of its own: ``k<node>-s<slot>`` in front of its listener
on each broker (which advertises the proxy's port, so the client never leaves its
proxies) and ``pg<a|b>-s<slot>`` in front of each PostgreSQL node (its DSN lists both,
``target_session_attrs=read-write``). A fault on slot n's proxies hits that client alone.
Everything listens on 127.0.0.1; nothing else is ever a target.

When a PostgreSQL node is down, its proxies are disabled (connections refused): a proxy
in front of a dead server would accept and then close, which asyncpg takes for an error
of that host instead of moving on to the next host of the DSN.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ackline.dev import _proc
from ackline.dev.cluster import ClusterLayout, KafkaCluster
from ackline.dev.errors import DevStackError
from ackline.dev.kafka import ensure_jars
from ackline.dev.pgpair import NAMES, Mode, PairNode, PgPair
from ackline.dev.ports import HOST, pick_free_port
from ackline.dev.postgres import PG_OS_USER, PG_ROLE, ensure_pg_installed
from ackline.dev.tmpfs import Tmpfs, mounted
from ackline.dev.toxiproxy import Api, Proxy, ToxiproxyServer, ensure_binary

DEFAULT_STATE_DIR = Path(".ackline/chaos-infra")
STATE_FILE = "infra.json"
TABLESPACE = "ackline_ts"
TMPFS_SIZE = 32 << 30
"""A tablespace's tmpfs limit while no disk fault is on (memory is used only as written)."""


def kafka_proxy(node: int, slot: int) -> str:
    return f"k{node}-s{slot}"


def pg_proxy(name: str, slot: int) -> str:
    return f"pg{name}-s{slot}"


@dataclass
class InfraLayout:
    """Every port, pid and mount of one stack (``infra.json``)."""

    slots: int
    cluster: ClusterLayout
    pg_ports: dict[str, int]
    pg_proxy_ports: dict[str, int]  # pg_proxy(name, slot) -> listen port
    toxiproxy_port: int
    toxiproxy_pid: int = 0
    primary: str = "a"
    disk: bool = False
    mounts: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "slots": self.slots,
            "cluster": self.cluster.to_json(),
            "pg_ports": self.pg_ports,
            "pg_proxy_ports": self.pg_proxy_ports,
            "toxiproxy_port": self.toxiproxy_port,
            "toxiproxy_pid": self.toxiproxy_pid,
            "primary": self.primary,
            "disk": self.disk,
            "mounts": self.mounts,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> InfraLayout:
        return cls(
            slots=int(raw["slots"]),
            cluster=ClusterLayout.from_json(raw["cluster"]),
            pg_ports={str(k): int(v) for k, v in raw["pg_ports"].items()},
            pg_proxy_ports={str(k): int(v) for k, v in raw["pg_proxy_ports"].items()},
            toxiproxy_port=int(raw["toxiproxy_port"]),
            toxiproxy_pid=int(raw.get("toxiproxy_pid", 0)),
            primary=str(raw.get("primary", "a")),
            disk=bool(raw.get("disk", False)),
            mounts=[str(m) for m in raw.get("mounts", [])],
        )


class Infra:
    """A running stack: the cluster, the pair, the proxies, the tmpfs of each node."""

    def __init__(
        self, state_dir: Path, layout: InfraLayout, server: ToxiproxyServer | None = None
    ) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.layout = layout
        self.server = server
        self.api = Api(f"http://{HOST}:{layout.toxiproxy_port}")
        self.cluster = KafkaCluster(self.state_dir, layout.cluster)
        self.tmpfs = {n: Tmpfs(self.state_dir / "ts" / n, PG_OS_USER) for n in NAMES}
        nodes = {
            n: PairNode(
                n,
                self.state_dir / "pg",
                layout.pg_ports[n],
                self.tmpfs[n].dir if layout.disk else None,
            )
            for n in NAMES
        }
        other = next(n for n in NAMES if n != layout.primary)
        self.pair = PgPair(self.state_dir / "pg", nodes[layout.primary], nodes[other])

    # -- where clients connect -----------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Direct Kafka (harness, producers): never through a proxy."""
        return self.cluster.bootstrap

    def admin_dsn(self, dbname: str = "postgres") -> str:
        """Both PostgreSQL nodes directly (the harness's superuser): finds the primary."""
        return self.pair.dsn(dbname)

    def slot_bootstrap(self, slot: int) -> str:
        return self.cluster.client_bootstrap(slot)

    def slot_dsn(self, slot: int, dbname: str) -> str:
        """Slot ``slot``'s DSN: both nodes through its proxies, read-write wanted."""
        ports = [self.layout.pg_proxy_ports[pg_proxy(n, slot)] for n in NAMES]
        hosts = ",".join(f"{HOST}:{p}" for p in ports)
        return f"postgresql://{PG_ROLE}@{hosts}/{dbname}?target_session_attrs=read-write"

    # -- proxies -------------------------------------------------------------------

    def proxy(self, name: str) -> Proxy:
        raw = self.api.call("GET", f"/proxies/{name}")
        return Proxy(self.api, raw["name"], raw["listen"], raw["upstream"])

    def kafka_proxies(self, slot: int) -> list[Proxy]:
        return [self.proxy(kafka_proxy(n.node_id, slot)) for n in self.layout.cluster.nodes]

    def pg_proxies(self, slot: int) -> list[Proxy]:
        return [self.proxy(pg_proxy(n, slot)) for n in NAMES]

    def all_proxies(self) -> list[Proxy]:
        raw = self.api.call("GET", "/proxies")
        return [Proxy(self.api, p["name"], p["listen"], p["upstream"]) for p in raw.values()]

    def set_node_reachable(self, name: str, reachable: bool) -> None:
        """Enable or disable every proxy in front of PostgreSQL node ``name``."""
        for slot in range(self.layout.slots):
            self.proxy(pg_proxy(name, slot)).set_enabled(reachable)

    def reset_proxies(self) -> None:
        """Remove every toxic; enable every proxy except those of a node that is down."""
        self.api.call("POST", "/reset")
        if self.pair.standby_down:
            self.set_node_reachable(self.pair.standby.name, False)

    # -- PostgreSQL role changes (recorded) ----------------------------------------

    def record(self) -> None:
        self.layout.primary = self.pair.primary.name
        _write_layout(self.state_dir, self.layout)


def _write_layout(state_dir: Path, layout: InfraLayout) -> None:
    path = state_dir / STATE_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(layout.to_json(), indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def read_layout(state_dir: Path) -> InfraLayout | None:
    try:
        raw = json.loads((Path(state_dir) / STATE_FILE).read_text(encoding="utf-8"))
        return InfraLayout.from_json(raw)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def up(
    state_dir: Path = DEFAULT_STATE_DIR,
    slots: int = 3,
    mode: Mode = "sync",
    disk: bool = True,
    timeout: float = 300.0,
) -> Infra:
    """A fresh stack in ``state_dir`` (whatever ran there before is stopped and wiped).

    Order: stop leftovers; Toxiproxy; the Kafka proxies (their ports are advertised by
    the brokers); the brokers' JVMs launched; the tmpfs mounts and the PostgreSQL pair
    (the primary, its tablespace, the standby by base backup, streaming, ``mode``); the
    PostgreSQL proxies; wait for the brokers. On any failure everything started is
    stopped again (:func:`down`).
    """
    state_dir = Path(state_dir).absolute()
    down(state_dir, wipe=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o755)  # the PostgreSQL server user must traverse it
    ensure_jars()
    ensure_pg_installed()
    ensure_binary()
    server = ToxiproxyServer.start(log_path=state_dir / "toxiproxy.log")
    cluster = ClusterLayout.plan(client_slots=slots)
    taken = [p for n in cluster.nodes for p in (n.port, n.controller_port)]
    taken += [p for n in cluster.nodes for c in n.clients for p in (c.bind_port, c.advertised_port)]
    pg_ports: dict[str, int] = {}
    for name in NAMES:
        pg_ports[name] = pick_free_port(exclude=taken)
        taken.append(pg_ports[name])
    layout = InfraLayout(
        slots=slots,
        cluster=cluster,
        pg_ports=pg_ports,
        pg_proxy_ports={},
        toxiproxy_port=server.port,
        toxiproxy_pid=server.process.pid,
        disk=disk,
    )
    _write_layout(state_dir, layout)
    infra = Infra(state_dir, layout, server)
    try:
        for node in cluster.nodes:
            for client in node.clients:
                server.create_proxy(
                    kafka_proxy(node.node_id, client.slot),
                    upstream=f"{HOST}:{client.bind_port}",
                    listen=f"{HOST}:{client.advertised_port}",
                )
        for n in infra.cluster.nodes:
            n.launch()
        if disk:
            for fs in infra.tmpfs.values():
                fs.mount(TMPFS_SIZE)
                layout.mounts.append(str(fs.path))
                _write_layout(state_dir, layout)
        infra.pair.start(mode, timeout)
        for name in NAMES:
            for slot in range(slots):
                upstream = f"{HOST}:{pg_ports[name]}"
                # not a broker's port: the brokers are not listening yet
                proxy = server.create_proxy(pg_proxy(name, slot), upstream, exclude=taken)
                layout.pg_proxy_ports[proxy.name] = proxy.port
                taken.append(proxy.port)
        _write_layout(state_dir, layout)
        infra.cluster.start(timeout)
    except BaseException:
        with contextlib.suppress(Exception):
            down(state_dir)
        raise
    return infra


def attach(state_dir: Path = DEFAULT_STATE_DIR) -> Infra:
    """The stack recorded in ``state_dir`` (started by another process)."""
    layout = read_layout(Path(state_dir).absolute())
    if layout is None:
        raise DevStackError(f"no infrastructure stack recorded in {state_dir}")
    return Infra(Path(state_dir), layout)


def down(state_dir: Path = DEFAULT_STATE_DIR, wipe: bool = False) -> None:
    """Stop everything recorded in ``state_dir``: Toxiproxy, the brokers, both PostgreSQL
    nodes; unmount the tmpfs mounts; verify nothing is left. ``wipe`` also deletes the
    directory. Idempotent; safe when nothing was ever started."""
    state_dir = Path(state_dir).absolute()
    layout = read_layout(state_dir)
    problems = _stop_services(state_dir, layout) if layout is not None else []
    mounts = {state_dir / "ts" / n for n in NAMES}  # also when infra.json is gone
    mounts |= {Path(m) for m in (layout.mounts if layout is not None else [])}
    for mount in sorted(mounts):
        if mounted(mount):
            with contextlib.suppress(DevStackError):
                Tmpfs(mount, PG_OS_USER).unmount()
            if mounted(mount):
                problems.append(f"{mount} is still mounted")
    if problems:
        raise DevStackError("the infrastructure stack did not stop cleanly: " + "; ".join(problems))
    if wipe and state_dir.is_dir():
        shutil.rmtree(state_dir, ignore_errors=True)


def _stop_services(state_dir: Path, layout: InfraLayout) -> list[str]:
    """Stop Toxiproxy (only the pid recorded, and only if it still is a toxiproxy), the
    brokers and both PostgreSQL nodes; what could not be stopped."""
    problems: list[str] = []
    infra = Infra(state_dir, layout)
    pid = layout.toxiproxy_pid
    if pid and _proc.is_alive(pid) and any("toxiproxy" in a for a in _proc.cmdline(pid)):
        _proc.send(pid, signal.SIGTERM)
        if not _proc.wait_gone([pid], 5.0):
            _proc.send(pid, signal.SIGKILL)
    for node in infra.cluster.nodes:  # a throwaway cluster: no controlled shutdown
        try:
            node.kill()
        except DevStackError as exc:
            problems.append(str(exc))
    for pg in infra.pair.nodes:
        try:
            pg.stop("immediate", timeout=30)
        except DevStackError:
            pg.kill()
    return problems


def env_without_ackline() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ACKLINE_")}


__all__ = [
    "DEFAULT_STATE_DIR",
    "TABLESPACE",
    "Infra",
    "InfraLayout",
    "attach",
    "down",
    "kafka_proxy",
    "pg_proxy",
    "read_layout",
    "up",
]
