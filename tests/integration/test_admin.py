"""Topic administration against the real broker."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from ackline.load.produce import Knobs, produce
from ackline.streams import admin as admin_module
from ackline.streams.admin import (
    KAFKA_MAX_MESSAGE_BYTES,
    broker_max_message_bytes,
    delete_topic,
    ensure_topic,
    max_message_bytes,
    stable_ends,
    stable_ends_and_why,
    topic_shape,
)
from tests.integration.harness import Services, wait_until
from tests.integration.test_aio_producer import frozen_broker
from tests.integration.windows import watermarks

pytestmark = pytest.mark.integration


def test_ensure_topic_creates_a_topic_through_one_admin_client(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ensure_topic made a client to look for the topic, one to create it, and one more
    for every metadata read while it waited for the topic to show (each connecting
    anew, every 0.1 s for up to 30 s). Now one real client does it all; this one only
    counts the clients made."""
    made: list[AdminClient] = []

    class Counted(AdminClient):  # type: ignore[misc]
        def __init__(self, conf: dict[str, Any]) -> None:
            super().__init__(conf)
            made.append(self)

    monkeypatch.setattr(admin_module, "AdminClient", Counted)
    name = f"t-{uuid.uuid4().hex[:12]}"
    try:
        assert ensure_topic(services.bootstrap, name, partitions=2) == 2
        assert len(made) == 1, f"{len(made)} admin clients for one ensure_topic"
        assert ensure_topic(services.bootstrap, name, partitions=2) == 2  # exists: as is
    finally:
        monkeypatch.undo()
        delete_topic(services.bootstrap, name)


def test_stable_ends_leaves_out_what_did_not_answer_in_time(services: Services, topic: str) -> None:
    """From a hostile review: a partition whose list_offsets future did not finish in
    time raised TimeoutError out of stable_ends (its docstring says such partitions are
    left out), which ended a worker starting from "latest" at its assignment; and with
    the broker frozen a future also came back with OFFSET_INVALID (-1001), which a worker
    starting from "latest" would have stored as its partition's start."""
    client = admin_module.admin(services.bootstrap)
    tps = [(topic, 0), (topic, 1)]
    # a topic just made: its leaders may take a moment to answer
    wait_until(lambda: set(stable_ends(client, tps, 5.0)) == set(tps), 60, "both ends")
    with frozen_broker(services):
        assert stable_ends(client, tps, 0.5) == {}


def test_the_ends_of_a_topic_just_made_are_asked_again_until_its_leaders_answer(
    services: Services,
) -> None:
    """An operator's hunt: a worker starting from "latest" on a topic just made warned "no
    end offset for partitions [...] within 5 s" after 0.4 s, and started them at the log
    start: a leader not elected yet answered with a retriable error, which was taken as
    the end's absence at once."""
    from confluent_kafka.admin import NewTopic

    name, other = (f"just-made-{uuid.uuid4().hex[:8]}" for _ in range(2))
    client = admin_module.admin(services.bootstrap)
    try:
        # asked the moment the controller has it, before the leaders answer (ensure_topic
        # waits until it is visible, which a worker starting then need not)
        made = client.create_topics(
            [NewTopic(name, 12, 1), NewTopic(other, 12, 1)], operation_timeout=30
        )
        for future in made.values():
            future.result(timeout=60)
        tps = [(name, p) for p in range(12)]
        ends, why = stable_ends_and_why(client, tps, 10.0)
        assert set(ends) == set(tps) and why == {}, (ends, why)
        # the tests' own reader of the ends, the same way (a flake of `make test`)
        assert set(watermarks(services.bootstrap, other, 12)) == set(range(12))
        with frozen_broker(services):
            ends, why = stable_ends_and_why(client, tps[:2], 0.5)
        assert ends == {} and set(why) == set(tps[:2]), why
    finally:
        delete_topic(services.bootstrap, name)
        delete_topic(services.bootstrap, other)


def test_the_load_producers_topic_takes_what_the_brokers_topics_take(
    services: Services, tmp_path: Path
) -> None:
    """A load run with poison gives its topic a ``max.message.bytes`` big enough for its
    oversize records. Its floor was librdkafka's 1,000,000, below Kafka's default
    1,048,588: with small oversize records the topic took less than any topic of the
    broker, and a producer at the SDK's setting had batches refused there."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    knobs = Knobs(poison=0.05, oversize_bytes=5_000)
    try:
        manifest = tmp_path / "m.jsonl.gz"
        produce(services.bootstrap, name, 1, 40, knobs, manifest_path=manifest, out=None)
        shape = topic_shape(services.bootstrap, name)
        assert max_message_bytes(shape) == broker_max_message_bytes(services.bootstrap)
        assert broker_max_message_bytes(services.bootstrap) >= KAFKA_MAX_MESSAGE_BYTES
    finally:
        delete_topic(services.bootstrap, name)
