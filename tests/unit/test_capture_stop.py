"""A capture stops on SIGTERM while the broker does not answer (an operator probe: with
--timeout -5 it hung, and only SIGKILL ended it)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from ackline.core.errors import Terminated
from ackline.core.signals import terminate_as_exit
from ackline.load.capture import topics
from ackline.load.capture.topics import RangeSpec, open_range

NOBODY = "127.0.0.1:1"  # nothing listens there


@pytest.mark.parametrize("read", ["metadata", "watermarks"])
def test_a_stop_is_served_while_the_broker_does_not_answer(
    read: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """librdkafka's metadata and offset reads block in C, where Python's signal handlers
    do not run: a SIGTERM waited for the whole timeout (for ever with a negative one,
    which confluent_kafka takes as no timeout). A range is now resolved in short reads,
    the handlers running between them."""
    if read == "watermarks":  # the topic's partitions known: the offset read blocks
        monkeypatch.setattr(topics, "_partitions", lambda *_: [0])
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    started = time.monotonic()
    with terminate_as_exit(), pytest.raises(Terminated):
        timer.start()
        try:
            open_range(NOBODY, "t", RangeSpec(), timeout=30)
        finally:
            timer.cancel()
    assert time.monotonic() - started < 5
