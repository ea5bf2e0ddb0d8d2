"""Toxiproxy 2.5.0 for tests, chaos and benchmarks: build it once, run it, drive it.

Toxiproxy (github.com/Shopify/toxiproxy) is built from source with ``go install`` into
``${XDG_CACHE_HOME:-~/.cache}/ackline/toxiproxy-2.5.0`` (GOPATH, GOCACHE and GOMODCACHE all
there; nothing in ``~/go``; never in the repository): about a minute on two cores the first
time, seconds after. :class:`ToxiproxyServer` runs it on a free 127.0.0.1 port; its
:class:`Proxy` objects add and remove toxics through the HTTP API (stdlib only)::

    with ToxiproxyServer.start() as server:
        pg = server.create_proxy("pg", upstream="127.0.0.1:5432")  # listens on a free port
        pg.add_latency("slow", latency_ms=1, stream="both")        # +1 ms each way
        ...

What each toxic really does (checked against the v2.5.0 source and measured):

* ``stream="upstream"`` is client -> server, ``"downstream"`` server -> client (the API's
  default). ``stream="both"`` here adds two toxics, ``<name>_up`` and ``<name>_down``;
  :meth:`Proxy.remove_toxic` removes both. A toxic applies at once to open connections too.
* ``timeout`` with ``timeout_ms=0`` drops every byte in its direction and keeps both TCP
  legs open, **but still forwards a close** (FIN) from the side it reads: it is a black
  hole for data, not a vanished host. Toxiproxy terminates TCP itself, so its kernel ACKs
  everything: client TCP keepalives and TCP_USER_TIMEOUT never fire through it, nor do
  the server's. For a host that vanishes use ackline.dev.netns. ``timeout_ms>0``: the same,
  then a FIN after that long. Removing a ``timeout`` toxic closes the connections it held.
* ``reset_peer`` sends a real RST (SO_LINGER=0) only on connections opened while the toxic
  exists; an older connection gets a FIN. For an RST on an established connection, add
  the toxic with ``toxicity=0`` before connecting, then ``update_toxic(..., toxicity=1)``.
* ``latency``: each chunk waits ``latency ± jitter`` ms (uniform), once per direction that
  has the toxic; a round trip through ``stream="both"`` pays it twice.
* ``bandwidth``: KB/s per direction.
* Disabling a proxy closes its listener and sends a FIN to both peers of every connection;
  new connects are refused until it is enabled. :meth:`ToxiproxyServer.reset` enables every
  proxy and removes every toxic.
* The API refuses a User-Agent starting with ``Mozilla/``; ``GET /version`` proves the
  server is up (a source build reports ``git``, not its version). SIGTERM stops it at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ackline.dev import _proc
from ackline.dev.errors import DevStackError
from ackline.dev.ports import HOST, pick_free_port

log = logging.getLogger(__name__)

VERSION = "v2.5.0"
MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
USER_AGENT = "ackline-toxiproxy"
_BUILD_TIMEOUT_S = 900.0

Stream = Literal["upstream", "downstream"]
Streams = Literal["upstream", "downstream", "both"]


class ToxiproxyError(DevStackError):
    """Toxiproxy could not be built or started, or its API answered with an error."""


def cache_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/ackline/toxiproxy-2.5.0``."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "ackline" / f"toxiproxy-{VERSION.lstrip('v')}"


def binary_path(root: Path | None = None) -> Path:
    """Where ``go install`` puts the server: ``<cache>/bin/server``."""
    return (root or cache_dir()) / "bin" / "server"


def build_command() -> list[str]:
    return ["go", "install", f"{MODULE}@{VERSION}"]


def build_env(root: Path, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with every Go path under ``root``: nothing lands in ``~/go``, and the
    module cache is writable so ``rm -rf root`` removes it all."""
    return {
        **base,
        "GOPATH": str(root),
        "GOBIN": str(root / "bin"),
        "GOCACHE": str(root / "gocache"),
        "GOMODCACHE": str(root / "pkg" / "mod"),
        "GOFLAGS": "-modcacherw",
        "GOTOOLCHAIN": "local",  # build with the Go that is there, never download one
    }


def ensure_binary() -> Path:
    """The toxiproxy server binary, built with ``go install`` on first use.

    Concurrent callers serialize on a lock file in the cache directory; a failed build
    leaves no binary, so the next call builds again.
    """
    binary = binary_path()
    if os.access(binary, os.X_OK):
        return binary
    root = binary.parent.parent
    root.mkdir(parents=True, exist_ok=True)
    with _proc.file_lock(root / ".lock"):
        if os.access(binary, os.X_OK):
            return binary
        if shutil.which("go") is None:
            raise ToxiproxyError(
                f"toxiproxy {VERSION} is not built and `go` is not on PATH; it is needed once "
                f"to build it into {root}"
            )
        log.info("building toxiproxy %s with go install into %s (about a minute)", VERSION, root)
        try:
            proc = _proc.run(
                build_command(), cwd=root, env=build_env(root, os.environ), timeout=_BUILD_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as exc:
            raise ToxiproxyError(
                f"building toxiproxy timed out after {_BUILD_TIMEOUT_S:.0f}s"
            ) from exc
        if proc.returncode != 0 or not os.access(binary, os.X_OK):
            output = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
            raise ToxiproxyError(
                f"go install of toxiproxy failed (exit {proc.returncode}):\n{output}"
            )
    return binary


def toxic_body(
    name: str, type: str, stream: Stream, attributes: Mapping[str, Any], toxicity: float
) -> dict[str, Any]:
    """The JSON body of ``POST /proxies/<proxy>/toxics``."""
    if not 0.0 <= toxicity <= 1.0:
        raise ToxiproxyError(f"toxicity must be within [0, 1], not {toxicity}")
    return {
        "name": name,
        "type": type,
        "stream": stream,
        "toxicity": toxicity,
        "attributes": dict(attributes),
    }


def expand(name: str, stream: Streams) -> list[tuple[Stream, str]]:
    """The (direction, toxic name) pairs of one toxic: ``both`` is ``_up`` and ``_down``."""
    if stream == "both":
        return [("upstream", f"{name}_up"), ("downstream", f"{name}_down")]
    return [(stream, name)]


def present_names(name: str, present: set[str]) -> list[str]:
    """The toxics ``name`` stands for among ``present``: itself, or its two halves."""
    if name in present:
        return [name]
    halves = [n for n in (f"{name}_up", f"{name}_down") if n in present]
    if not halves:
        raise ToxiproxyError(f"no toxic {name!r} (present: {sorted(present)})")
    return halves


def split_listen(listen: str) -> tuple[str, int]:
    """``"127.0.0.1:8474"`` -> ``("127.0.0.1", 8474)``."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ToxiproxyError(f"not a host:port address: {listen!r}")
    return host, int(port)


@dataclass(frozen=True)
class Toxic:
    name: str
    type: str
    stream: Stream
    toxicity: float
    attributes: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Toxic:
        return cls(
            name=str(raw["name"]),
            type=str(raw["type"]),
            stream=raw["stream"],
            toxicity=float(raw.get("toxicity", 1.0)),
            attributes=dict(raw.get("attributes") or {}),
        )


class Api:
    """The HTTP API of one server (JSON in and out; an error status raises)."""

    def __init__(self, base_url: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "User-Agent": USER_AGENT},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                payload = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            raise ToxiproxyError(f"{method} {path}: HTTP {exc.code}: {detail}") from None
        except OSError as exc:  # URLError, refused, timed out
            raise ToxiproxyError(f"{method} {path}: {exc}") from exc
        return json.loads(payload) if payload.strip() else None

    def version(self, timeout: float = 5.0) -> str:
        request = urllib.request.Request(
            self.base_url + "/version", headers={"User-Agent": USER_AGENT}
        )
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return str(resp.read().decode().strip())


class Proxy:
    """One proxy: toxiproxy listens on ``listen`` and connects each client to ``upstream``."""

    def __init__(self, api: Api, name: str, listen: str, upstream: str) -> None:
        self._api = api
        self.name = name
        self.listen = listen
        self.upstream = upstream

    def __repr__(self) -> str:
        return f"Proxy({self.name!r}, {self.listen} -> {self.upstream})"

    @property
    def host(self) -> str:
        return split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return split_listen(self.listen)[1]

    def set_enabled(self, enabled: bool) -> None:
        """Disabled: the listener closes and every connection gets a FIN (not an RST)."""
        self._api.call("POST", f"/proxies/{self.name}", {"enabled": enabled})

    def delete(self) -> None:
        self._api.call("DELETE", f"/proxies/{self.name}")

    def toxics(self) -> list[Toxic]:
        return [Toxic.from_json(t) for t in self._api.call("GET", f"/proxies/{self.name}/toxics")]

    def add_toxic(
        self,
        name: str,
        type: str,
        attributes: Mapping[str, Any],
        stream: Streams = "downstream",
        toxicity: float = 1.0,
    ) -> list[Toxic]:
        """Add a toxic (two with ``stream="both"``: ``<name>_up``, ``<name>_down``)."""
        return [
            Toxic.from_json(
                self._api.call(
                    "POST",
                    f"/proxies/{self.name}/toxics",
                    toxic_body(toxic, type, direction, attributes, toxicity),
                )
            )
            for direction, toxic in expand(name, stream)
        ]

    def update_toxic(self, name: str, attributes: Mapping[str, Any], toxicity: float = 1.0) -> None:
        for toxic in present_names(name, {t.name for t in self.toxics()}):
            self._api.call(
                "POST",
                f"/proxies/{self.name}/toxics/{toxic}",
                {"attributes": dict(attributes), "toxicity": toxicity},
            )

    def remove_toxic(self, name: str) -> None:
        """Remove a toxic, or both halves of a ``stream="both"`` one. Removing a
        ``timeout`` toxic closes the connections it held."""
        for toxic in present_names(name, {t.name for t in self.toxics()}):
            self._api.call("DELETE", f"/proxies/{self.name}/toxics/{toxic}")

    def add_latency(
        self, name: str, latency_ms: int, jitter_ms: int = 0, stream: Streams = "downstream"
    ) -> list[Toxic]:
        return self.add_toxic(name, "latency", {"latency": latency_ms, "jitter": jitter_ms}, stream)

    def add_timeout(self, name: str, timeout_ms: int = 0, stream: Streams = "both") -> list[Toxic]:
        """A black hole for data (0: for good). Closes still get through (module doc)."""
        return self.add_toxic(name, "timeout", {"timeout": timeout_ms}, stream)

    def add_reset_peer(
        self, name: str, timeout_ms: int = 0, stream: Streams = "downstream", toxicity: float = 1.0
    ) -> list[Toxic]:
        return self.add_toxic(name, "reset_peer", {"timeout": timeout_ms}, stream, toxicity)

    def add_bandwidth(
        self, name: str, rate_kb_s: int, stream: Streams = "downstream"
    ) -> list[Toxic]:
        return self.add_toxic(name, "bandwidth", {"rate": rate_kb_s}, stream)

    @contextlib.contextmanager
    def toxic(
        self,
        name: str,
        type: str,
        attributes: Mapping[str, Any],
        stream: Streams = "downstream",
    ) -> Iterator[list[Toxic]]:
        """``with proxy.toxic(...):`` adds the toxic and removes it on the way out."""
        added = self.add_toxic(name, type, attributes, stream)
        try:
            yield added
        finally:
            self.remove_toxic(name)


class ToxiproxyServer:
    """A toxiproxy server process on 127.0.0.1; :meth:`start` picks a free API port."""

    def __init__(self, process: subprocess.Popen[bytes], host: str, port: int) -> None:
        self.process = process
        self.host = host
        self.port = port
        self.api = Api(f"http://{host}:{port}")

    @classmethod
    def start(
        cls,
        host: str = HOST,
        port: int | None = None,
        log_path: Path | None = None,
        ready_timeout: float = 10.0,
    ) -> ToxiproxyServer:
        """Build if needed, start, and wait until ``/version`` answers."""
        binary = ensure_binary()
        for _attempt in range(3):  # a free port can be taken between probe and bind
            api_port = port or pick_free_port(host=host)
            out: Any = subprocess.DEVNULL
            if log_path is not None:
                out = log_path.open("ab")
            try:
                process = subprocess.Popen(
                    [str(binary), "-host", host, "-port", str(api_port)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "LOG_LEVEL": "warn"},
                    start_new_session=True,
                )
            finally:
                if log_path is not None:
                    out.close()
            server = cls(process, host, api_port)
            if server._wait_ready(ready_timeout):
                return server
            server.stop()
            if port is not None:
                break
        raise ToxiproxyError(f"toxiproxy did not start on {host} (log: {log_path or 'none'})")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                self.api.version(timeout=1.0)
                return True
            except OSError:
                time.sleep(0.05)
        return False

    def create_proxy(
        self, name: str, upstream: str, listen: str | None = None, exclude: Collection[int] = ()
    ) -> Proxy:
        """A proxy to ``upstream`` listening on ``listen``; by default on a free port below
        the kernel's ephemeral range (:func:`pick_free_port`, not in ``exclude``: ports
        planned for services not yet listening). Not port 0: toxiproxy binds the port again
        on every enable and reset, and meanwhile an outgoing connection could take an
        ephemeral one as its source port."""
        for _attempt in range(3):  # a free port can be taken between probe and bind
            address = listen or f"{self.host}:{pick_free_port(exclude=exclude, host=self.host)}"
            try:
                raw = self.api.call(
                    "POST", "/proxies", {"name": name, "listen": address, "upstream": upstream}
                )
            except ToxiproxyError as exc:
                if listen is not None or "address already in use" not in str(exc):
                    raise
                continue
            return Proxy(self.api, raw["name"], raw["listen"], raw["upstream"])
        raise ToxiproxyError(f"no free port for proxy {name!r} on {self.host}")

    def proxies(self) -> dict[str, Proxy]:
        raw = self.api.call("GET", "/proxies")
        return {n: Proxy(self.api, p["name"], p["listen"], p["upstream"]) for n, p in raw.items()}

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self.api.call("POST", "/reset")

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (toxiproxy exits 0 at once), SIGKILL after ``timeout``."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def __enter__(self) -> ToxiproxyServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
