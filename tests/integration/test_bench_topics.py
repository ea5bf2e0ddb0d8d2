"""A bench run deletes the topics it made: each run writes gigabytes under fresh names, and
twenty runs filled a 90 GB disk with topics nobody would read again."""

from __future__ import annotations

import time
import uuid

from ackline.load.bench.common import drop_run_topics
from ackline.streams.admin import admin_client, ensure_topic

from .harness import Services


def _topics(bootstrap: str) -> set[str]:
    with admin_client(bootstrap) as client:
        return set(client.list_topics(timeout=10).topics)


def test_a_run_deletes_its_topics_and_no_other(services: Services) -> None:
    run_id = uuid.uuid4().hex[:8]
    other = uuid.uuid4().hex[:8]
    mine = [f"bench-events-{run_id}", f"bench-events-{run_id}.connect", f"lat-ackline-{run_id}"]
    theirs = f"bench-events-{other}"
    for name in [*mine, theirs]:
        ensure_topic(services.bootstrap, name, partitions=1)
    try:
        assert drop_run_topics(services.bootstrap, run_id) == sorted(mine)
        deadline = time.monotonic() + 15  # the broker's metadata catches up
        while (left := _topics(services.bootstrap)) & set(mine) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left & set(mine)
        assert theirs in left
    finally:
        drop_run_topics(services.bootstrap, other)
