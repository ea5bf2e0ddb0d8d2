"""What retention took from the feed after a cursor: a reader from there will not read it.

Retention drops a partition only once every reader in ``feed_cursors`` has read past its
batches, unless forced (docs/retention.md). A reader can still start behind a drop: a
cursor kept outside ``feed_cursors`` (``ackline tail --from-cursor``), a reader or
processor a forced drop left behind, one created after a drop (it starts at the feed's
start, after the dropped days), or a processor reset to rebuild from the start. The feed
then goes on from the first batch it still holds, and nothing in the events says some
were taken: this module tells.

The I/O is one read of ``retention_drops`` joined with ``ingest_batches`` (the newest
transaction of each drop's batches that inserted rows on its days); :func:`lost_after`
is pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from ackline.sinks.feed.types import Cursor

# What each drop took of the feed: the newest transaction of the batches that inserted
# rows on one of its days (a row's ingested_on is its batch's commit day, UTC) and had
# committed when it dropped them (visible in the snapshot the drop recorded after its
# DETACH, which waited for any batch in flight: a batch of the same day committed after
# the drop went into a partition made anew, and the feed holds it). A reader from a
# cursor before that transaction would lack what the drop took. A scan of ingest_batches:
# read once per reader's start or per reset, never per read.
_DROPPED_UP_TO = """
SELECT d.partition_name, d.ends_before, d.dropped_at, max(b.commit_xid)::text AS up_to
FROM retention_drops AS d
JOIN ingest_batches AS b
  ON b.inserted > 0
 AND b.committed_at >= d.lower_day::timestamp AT TIME ZONE 'UTC'
 AND b.committed_at < d.ends_before
 AND pg_visible_in_snapshot(b.commit_xid, d.snap)
GROUP BY d.drop_id, d.partition_name, d.ends_before, d.dropped_at
ORDER BY d.drop_id
"""


@dataclass(frozen=True, slots=True)
class Drop:
    """One partition retention dropped: its name, the end of its days, when it was
    dropped, and the newest transaction whose events it held."""

    partition_name: str
    ends_before: datetime
    dropped_at: datetime
    up_to: Cursor

    def describe(self) -> str:
        return f"{self.partition_name}, up to {self.ends_before:%Y-%m-%d}"


async def drops(conn: asyncpg.Connection) -> list[Drop]:
    """Every drop retention recorded, oldest first. Raises what the read raises (a role
    that may not read the tables: InsufficientPrivilegeError; before migration 0011:
    UndefinedTableError), for the caller to say so."""
    rows = await conn.fetch(_DROPPED_UP_TO)
    return [
        Drop(str(r["partition_name"]), r["ends_before"], r["dropped_at"], Cursor(int(r["up_to"])))
        for r in rows
    ]


def lost_after(recorded: Sequence[Drop], cursor: Cursor) -> list[Drop]:
    """The drops that took events after ``cursor``, oldest first. Pure."""
    here = cursor.sort_key()
    return [d for d in recorded if d.up_to.sort_key() > here]
