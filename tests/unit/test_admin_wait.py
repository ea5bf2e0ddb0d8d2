"""A created topic's wait to show in metadata ends at its deadline."""

from __future__ import annotations

import time

import pytest

from ackline.streams.admin import admin, drain, wait_visible
from ackline.streams.errors import KafkaUnavailableError


def test_the_wait_for_a_created_topic_ends_at_its_deadline() -> None:
    """Each metadata read is bounded by the time left: a read not answered (nothing
    listens on port 1) raises when the wait's time is up, not up to 10 s later."""
    client = admin("127.0.0.1:1")
    began = time.monotonic()
    try:
        with pytest.raises(KafkaUnavailableError):
            wait_visible(client, "127.0.0.1:1", "t-unit", within=1.0)
    finally:
        drain(client)
    took = time.monotonic() - began
    assert took < 3, f"a 1 s wait took {took:.1f} s"
