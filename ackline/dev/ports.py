"""Free TCP ports on 127.0.0.1 for the local stack.

Ports are chosen outside the kernel's ephemeral range (``ip_local_port_range``): a port
chosen there is bound by its service seconds later, and again after every restart on the
same port, and meanwhile any outgoing connection on the machine may take it as its source
port ("Address already in use": a chaos run's broker failed to start that way while the
test suite beside it churned connections). Below the range no connection takes it.
"""

from __future__ import annotations

import contextlib
import random
import socket
import time
from collections.abc import Collection
from pathlib import Path

from ackline.dev.errors import DevStackError

HOST = "127.0.0.1"
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000  # above the well-known and most registered service ports; unprivileged
_TRIES = 200


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


def parse_ephemeral_range(text: str) -> tuple[int, int]:
    """``ip_local_port_range``'s two numbers, e.g. ``"32768\\t60999\\n"`` → (32768, 60999)."""
    low, high = (int(part) for part in text.split())
    return low, high


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range; Linux's default when it cannot be read."""
    try:
        return parse_ephemeral_range(EPHEMERAL_RANGE_FILE.read_text())
    except (OSError, ValueError):
        return 32_768, 60_999


def outside_ephemeral(ephemeral: tuple[int, int]) -> range:
    """The ports to choose from: the larger stretch of ``LOWEST..65535`` below or above the
    ephemeral range (below it on Linux's default). Empty when the range covers them all."""
    low, high = ephemeral
    below = range(LOWEST, max(LOWEST, low))
    above = range(max(LOWEST, high + 1), 65_536)
    return below if len(below) >= len(above) else above


def pick_free_port(
    preferred: int | None = None, exclude: Collection[int] = (), host: str = HOST
) -> int:
    """``preferred`` when it is still free (and not excluded), else a free port outside
    the ephemeral range (else, when the range leaves none, one the kernel hands out)."""
    if preferred is not None and preferred not in exclude and is_port_free(preferred, host):
        return preferred
    candidates = outside_ephemeral(ephemeral_range())
    if candidates:
        rng = random.SystemRandom()  # two stacks starting at once rarely draw the same
        for _ in range(_TRIES):
            port = rng.choice(candidates)
            if port not in exclude and is_port_free(port, host):
                return port
    return _kernel_port(exclude, host)


def _kernel_port(exclude: Collection[int], host: str) -> int:
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
