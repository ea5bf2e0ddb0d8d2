"""Time-ordered event ids: UUIDv7 (RFC 9562, section 5.7).

Why: ``event_keys`` is a B-tree keyed by ``event_id``. Random (v4) ids spread each batch's
keys over the whole index, so once the index outgrows memory most inserts and probes touch
a cold page (docs/retention.md, "Cost as the table grows"). A v7 id starts with its
creation time in milliseconds, so a batch's keys land on the index's newest pages.
Python gains ``uuid.uuid7`` only in 3.14; the layout is 16 lines, so it is written here
rather than added as a dependency. Ids are still unique by their 74 random bits; the
time prefix is a hint for locality, never trusted for ordering or deduplication.
"""

from __future__ import annotations

import secrets
import time
import uuid

RAND_BITS = 74
"""Random bits in a v7 id: 12 of ``rand_a`` and 62 of ``rand_b``."""


def uuid7(unix_ms: int | None = None, rand: int | None = None) -> uuid.UUID:
    """A UUIDv7 for ``unix_ms`` (default now) with ``rand``'s low 74 bits (default random).

    Pure when both are given (the load generator passes its seeded clock and bits)."""
    ms = time.time_ns() // 1_000_000 if unix_ms is None else unix_ms
    if not 0 <= ms < 1 << 48:
        raise ValueError(f"unix_ms {ms} does not fit UUIDv7's 48-bit timestamp")
    bits = secrets.randbits(RAND_BITS) if rand is None else rand & ((1 << RAND_BITS) - 1)
    rand_a, rand_b = bits >> 62, bits & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    return uuid.UUID(int=value)


def unix_ms_of(event_id: uuid.UUID) -> int | None:
    """The creation time a v7 id carries, in Unix milliseconds; None for other versions."""
    return event_id.int >> 80 if event_id.version == 7 else None
