"""Free TCP ports on 127.0.0.1 for the local stack."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Collection

from ackline.dev.errors import DevStackError

HOST = "127.0.0.1"


def is_port_free(port: int, host: str = HOST) -> bool:
    """True when a server could bind ``host:port`` now.

    SO_REUSEADDR is set like Kafka and PostgreSQL do, so connections of a previous
    run lingering in TIME_WAIT do not make a recorded port look taken.
    """
    if not 0 < port < 65_536:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_free_port(
    preferred: int | None = None, exclude: Collection[int] = (), host: str = HOST
) -> int:
    """``preferred`` when it is still free (and not excluded), else a fresh free port."""
    if preferred is not None and preferred not in exclude and is_port_free(preferred, host):
        return preferred
    held: list[socket.socket] = []
    try:
        # Ask the kernel for ephemeral ports until one is not excluded; keep the
        # rejected ones bound meanwhile so they are not handed out again.
        for _ in range(64):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
            if port not in exclude:
                return port
    finally:
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()
    raise DevStackError("no free TCP port found on " + host)


def port_accepts(port: int, host: str = HOST, timeout: float = 1.0) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_port_free(port: int, timeout: float, host: str = HOST) -> bool:
    """Wait up to ``timeout`` s for ``host:port`` to become bindable (after a stop)."""
    deadline = time.monotonic() + timeout
    while not is_port_free(port, host):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True
