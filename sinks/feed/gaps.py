"""What retention took from the feed after a cursor: a reader from there will not read it.

Retention drops a partition only once every reader in ``feed_cursors`` has read past its
batches, unless forced (docs/retention.md). A reader can still start behind a drop: a
cursor kept outside ``feed_cursors`` (``ackline tail --from-cursor``), a reader or
processor a forced drop left behind, one created after a drop (it starts at the feed's
start, after the dropped days), or a processor reset to rebuild from the start. The feed
then goes on from the first batch it still holds, and nothing in the events says some
were taken: this module tells.

The I/O is one read of ``retention_drops``, where each drop recorded the newest
transaction whose rows it took (migration 0014); :func:`lost_after` and :class:`Told`
are pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from ackline.sinks.feed.types import Cursor

# What each drop took of the feed, as the drop recorded it (migration 0014: the newest
# transaction of the batches whose rows it dropped; NULL when it took none). A reader from
# a cursor before that transaction lacks what the drop took.
_DROPS = """
SELECT drop_id, partition_name, ends_before, readers_behind, up_to::text AS up_to
FROM retention_drops
WHERE up_to IS NOT NULL
ORDER BY drop_id
"""


@dataclass(frozen=True, slots=True)
class Drop:
    """One partition retention dropped: its drop's id, its name, the end of its days, the
    stored readers it left behind (a forced drop), and the newest transaction whose events
    it held."""

    drop_id: int
    partition_name: str
    ends_before: datetime
    readers_behind: tuple[str, ...]
    up_to: Cursor

    def describe(self) -> str:
        return f"{self.partition_name}, rows ingested before {self.ends_before:%Y-%m-%d %H:%M} UTC"


async def drops(conn: asyncpg.Connection) -> list[Drop]:
    """Every drop retention recorded, oldest first. Raises what the read raises (a role
    that may not read the table: InsufficientPrivilegeError; before migration 0014:
    UndefinedColumnError), for the caller to say so."""
    rows = await conn.fetch(_DROPS)
    return [
        Drop(
            int(r["drop_id"]),
            str(r["partition_name"]),
            r["ends_before"],
            tuple(r["readers_behind"] or ()),
            Cursor(int(r["up_to"])),
        )
        for r in rows
    ]


def lost_after(recorded: Sequence[Drop], cursor: Cursor) -> list[Drop]:
    """The drops that took events after ``cursor``, oldest first. Pure."""
    here = cursor.sort_key()
    return [d for d in recorded if d.up_to.sort_key() > here]


class Told:
    """The drops one reader has been told of, by id: kept for as long as the reader runs
    in this process, across the follow() calls of a processor's runner (it follows the
    feed again after narrowing a failing batch down, from a cursor that may still be
    behind the drop: the drop was told again each time). Pure."""

    def __init__(self) -> None:
        self._told: set[int] = set()

    def news(self, lost: Sequence[Drop]) -> list[Drop]:
        """Those of ``lost`` not told yet, now counted told."""
        new = [d for d in lost if d.drop_id not in self._told]
        self._told.update(d.drop_id for d in new)
        return new
