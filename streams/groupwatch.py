"""Is this worker still in its consumer group? Read from librdkafka's statistics.

With the KIP-848 ``consumer`` group protocol librdkafka has no client-side session
timeout: a worker whose connections stop answering (a black hole, no reset) keeps its
assignment and never hears that the broker gave its partitions away until the link
returns (measured: a 90 s black hole, 85 s of overlap with the new owner). The classic
protocol revokes them itself after ``session.timeout.ms``. librdkafka's statistics do say
when the group handler left the "up" state; :class:`GroupWatch` turns "not up for longer
than a grace" into "suspect", and the runtime then stops consuming what it owns (its
partitions are suspended until the group is up again and they are taken back). It is
advisory: PostgreSQL's epoch fence stays the authority; this shortens the zombie window,
avoids doomed batches and keeps a cut-off worker from taking partitions back. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class GroupWatch:
    """Feed it each statistics JSON; ask :meth:`suspect` (times in seconds, monotonic)."""

    grace_s: float
    state: str = "init"
    not_up_since: float | None = None
    seen_at: float | None = None
    """When the last statistics came: only they say how long the group was seen away."""

    def on_stats(self, raw: str, now: float) -> None:
        try:
            stats: dict[str, Any] = json.loads(raw)
        except ValueError:
            return
        self.observe(stats, now)

    def observe(self, stats: Mapping[str, Any], now: float) -> None:
        """:meth:`on_stats` of statistics already parsed (the consumer reads more of them:
        one parse a second, not one per reader)."""
        cgrp = stats.get("cgrp")
        if not isinstance(cgrp, dict):
            return
        self.state = str(cgrp.get("state"))
        self.seen_at = now
        if self.state == "up":
            self.not_up_since = None
        elif self.not_up_since is None:
            # stateage: milliseconds since the state changed; backdate to the change
            self.not_up_since = now - float(cgrp.get("stateage", 0) or 0) / 1000

    def suspect(self) -> bool:
        """True when statistics showed the group handler not up for longer than the grace.

        Judged at the last statistics, not now: they come only while the consumer thread
        polls, and a thread waiting on its writes for a second heard nothing; the last
        ones, from before its group came up, then made a healthy worker drop its
        partitions. A worker really cut off still polls, so it is suspected at the first
        statistics past the grace (``statistics.interval.ms`` later at most)."""
        if self.not_up_since is None or self.seen_at is None:
            return False
        return self.seen_at - self.not_up_since >= self.grace_s
