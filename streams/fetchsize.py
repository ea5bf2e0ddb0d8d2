"""How many records the consumer thread may take from librdkafka in one call.

``consume(num_messages=n)`` returns up to ``n`` records whatever their size, so a count
alone let one call overshoot a batch's byte bound by all that librdkafka had queued (a
flood of 1 MiB records peaked at 314 MB of RSS so). The count is also bounded by the bytes
left in the batch over a hint of the next records' size: the largest recent record,
decaying by :data:`DECAY` per record, so one large record makes the next calls small for a
few hundred records and ordinary traffic soon takes whole calls again.

What this bounds: while records are no larger than the hint, a batch ends at most one
record past ``batch_max_bytes`` (the last record taken is never split). A burst of large
records after many small ones can still overshoot by one call's worth (at most what
librdkafka had queued: ``queued.max.messages.kbytes`` plus a fetch response) before the
hint catches up; records released from a hold (``streams.holds``) go back to the buffer
whole. Headers do not count.
"""

from __future__ import annotations

from typing import Final

DECAY: Final = 0.99
CALL_CAP: Final = 1_000  # records per call at most: keeps the loop's other checks frequent


def next_size_hint(hint: float, size: int) -> float:
    """The hint after a record of ``size`` bytes (pure)."""
    return max(float(size), hint * DECAY)


def fetch_room(events_left: int, bytes_left: int, size_hint: float) -> int:
    """Records the next call may take: within the batch's count, :data:`CALL_CAP`, and the
    bytes left at ``size_hint`` bytes a record; at least 1, so a batch always moves (pure)."""
    by_bytes = int(bytes_left // size_hint) if size_hint >= 1 else CALL_CAP
    return max(1, min(events_left, CALL_CAP, by_bytes))
