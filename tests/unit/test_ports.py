"""Ports for the local stack are chosen where no outgoing connection can take them
(ackline.dev.ports): a chaos run's broker once failed to start with "Address already in
use" because its port, chosen from the kernel's ephemeral range, was taken as a source
port by the test suite's own connections before the broker bound it."""

from __future__ import annotations

import socket

import pytest

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
    low, high = ephemeral_range()
    chosen = [pick_free_port() for _ in range(50)]
    assert all(not low <= port <= high for port in chosen), chosen
    assert all(is_port_free(port) for port in chosen)


def test_a_taken_or_excluded_port_is_not_chosen() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", pick_free_port()))
        taken = int(held.getsockname()[1])
        held.listen()
        assert pick_free_port(preferred=taken) != taken
        free = pick_free_port()
        assert pick_free_port(preferred=free) == free
        assert pick_free_port(preferred=free, exclude=[free]) != free
