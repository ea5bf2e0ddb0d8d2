"""ackline.dev.pglogin: where a client's login ends, however its bytes are cut."""

from __future__ import annotations

import struct

import pytest

from ackline.dev.pglogin import LoginBytes

SSL_REQUEST = struct.pack("!ii", 8, 80877103)
STARTUP = struct.pack("!ii", 8 + 22, 196608) + b"user\0ackline\0\0" + b"x" * 8
QUERY = b"Q" + struct.pack("!i", 13) + b"SELECT 1\0"


@pytest.mark.parametrize("ssl", [False, True])
@pytest.mark.parametrize("cut", [1, 3, 7, 8, 13, 64])
def test_the_login_is_the_encryption_request_and_the_startup_message(ssl: bool, cut: int) -> None:
    login = (SSL_REQUEST if ssl else b"") + STARTUP
    stream = login + QUERY
    follow = LoginBytes()
    passed = b""
    for i in range(0, len(stream), cut):
        chunk = stream[i : i + cut]
        passed += chunk[: follow.take(chunk)]
    assert passed == login
    assert follow.done


def test_nothing_after_the_login_is_taken() -> None:
    follow = LoginBytes()
    assert follow.take(STARTUP) == len(STARTUP)
    assert follow.take(QUERY) == 0


def test_bytes_that_are_no_login_end_it_at_once() -> None:
    """A relay of another protocol (Kafka) follows its bytes too: a length below the
    header's never makes the count go back."""
    follow = LoginBytes()
    assert follow.take(struct.pack("!ii", 3, 0) + b"rest") == 8
    assert follow.done
