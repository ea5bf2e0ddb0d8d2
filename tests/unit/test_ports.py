"""Ports for the local stack are chosen where no outgoing connection can take them
(ackline.dev.ports): a chaos run's broker once failed to start with "Address already in
use" because its port, chosen from the kernel's ephemeral range, was taken as a source
port by the test suite's own connections before the broker bound it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ackline.dev import ports
from ackline.dev.ports import (
    LOWEST,
    ephemeral_range,
    is_port_free,
    outside_ephemeral,
    parse_ephemeral_range,
    pick_free_port,
)


def test_the_kernel_range_is_parsed() -> None:
    assert parse_ephemeral_range("32768\t60999\n") == (32768, 60999)
    with pytest.raises(ValueError):
        parse_ephemeral_range("32768\n")


@pytest.mark.parametrize(
    ("ephemeral", "expected"),
    [
        ((32768, 60999), range(LOWEST, 32768)),  # Linux's default: below it
        ((1024, 40000), range(40001, 65536)),  # most of it below: above it
        ((15000, 64000), range(LOWEST, 15000)),
        ((1024, 65535), range(0)),  # nothing left: the kernel's choice
    ],
)
def test_the_ports_outside_the_ephemeral_range(ephemeral: tuple[int, int], expected: range) -> None:
    assert outside_ephemeral(ephemeral) == expected


def test_a_chosen_port_is_free_and_outside_this_machines_ephemeral_range() -> None:
    """Outside the range when it leaves room (it does on Linux's default); on a machine
    whose range covers 10000-65535, the kernel's choice (the fallback)."""
    low, high = ephemeral_range()
    chosen = [pick_free_port() for _ in range(50)]
    if outside_ephemeral((low, high)):
        assert all(not low <= port <= high for port in chosen), chosen
    else:
        assert all(low <= port <= high for port in chosen), chosen
    assert all(is_port_free(port) for port in chosen)


def test_with_no_room_outside_the_range_the_kernel_chooses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A machine whose ephemeral range covers every port from LOWEST up: a free port the
    kernel hands out, not an error (and not one excluded)."""
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("1024\t65535\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", ranges)
    assert outside_ephemeral(ephemeral_range()) == range(0)
    first = pick_free_port()
    assert is_port_free(first)
    assert pick_free_port(exclude=[first]) != first


def test_a_taken_or_excluded_port_is_not_chosen() -> None:
    with socket.socket() as held:
        # SO_REUSEADDR as is_port_free: a chosen port may hold a TIME_WAIT connection of
        # an earlier test, which a plain bind refuses ("Address already in use")
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", pick_free_port()))
        taken = int(held.getsockname()[1])
        held.listen()
        assert pick_free_port(preferred=taken) != taken
        free = pick_free_port()
        assert pick_free_port(preferred=free) == free
        assert pick_free_port(preferred=free, exclude=[free]) != free
