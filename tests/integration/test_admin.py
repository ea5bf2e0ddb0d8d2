"""Topic administration against the real broker."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from ackline.streams import admin as admin_module
from ackline.streams.admin import delete_topic, ensure_topic
from tests.integration.harness import Services

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
