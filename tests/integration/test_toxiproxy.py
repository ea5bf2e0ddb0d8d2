"""ackline.dev.toxiproxy against the real server and the local PostgreSQL: the semantics its
docstring promises, which chaos and benchmark runs rely on."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import asyncpg
import pytest

from ackline.dev.ports import ephemeral_range, port_accepts
from ackline.dev.toxiproxy import ToxiproxyServer
from tests.integration.harness import Services


def test_toxiproxy_black_hole_latency_and_disable(services: Services) -> None:
    pg = urlsplit(services.database_url)
    with ToxiproxyServer.start() as server:
        proxy = server.create_proxy("pg", upstream=f"{pg.hostname}:{pg.port}")
        dsn = services.database_url.replace(f"{pg.hostname}:{pg.port}", proxy.listen)

        async def go() -> None:
            conn = await asyncpg.connect(dsn)
            assert await conn.fetchval("SELECT 1") == 1
            proxy.add_timeout("bh", stream="both")  # data dropped, nothing closed
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(conn.fetchval("SELECT 2"), 1.0)
            assert not conn.is_closed()
            proxy.remove_toxic("bh")  # closes the connections the toxic held
            conn.terminate()
            proxy.add_latency("slow", latency_ms=5, jitter_ms=1, stream="both")
            assert {t.name for t in proxy.toxics()} == {"slow_up", "slow_down"}
            conn = await asyncpg.connect(dsn)
            assert await conn.fetchval("SELECT 3") == 3
            proxy.set_enabled(False)  # every connection closed, new ones refused
            with pytest.raises((asyncpg.PostgresConnectionError, asyncpg.InterfaceError)):
                await conn.fetchval("SELECT 4")
            with pytest.raises(OSError):
                await asyncpg.connect(dsn, timeout=5)
            server.reset()  # enabled again, no toxics
            assert proxy.toxics() == []
            conn = await asyncpg.connect(dsn)
            assert await conn.fetchval("SELECT 5") == 5
            await conn.close()

        asyncio.run(go())


def test_a_proxys_default_port_is_outside_the_ephemeral_range_and_kept() -> None:
    """A proxy listened on a kernel-chosen ephemeral port, which toxiproxy binds again on
    every enable and reset: an outgoing connection meanwhile could take it as its source
    port. Now its default port is chosen below the range (ackline.dev.ports), and kept."""
    low, high = ephemeral_range()
    with ToxiproxyServer.start() as server:
        proxies = [server.create_proxy(f"p{i}", upstream="127.0.0.1:9") for i in range(5)]
        ports = [proxy.port for proxy in proxies]
        assert all(not low <= port <= high for port in ports), ports
        proxies[0].set_enabled(False)
        proxies[0].set_enabled(True)
        server.reset()
        assert sorted(p.port for p in server.proxies().values()) == sorted(ports)
        assert all(port_accepts(port) for port in ports)
