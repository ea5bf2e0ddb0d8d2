"""What retention took from the feed after a cursor: a reader from there will not read it.

Retention drops a partition only once every reader in ``feed_cursors`` has read past its
batches, unless forced (docs/retention.md). A reader can still start behind a drop: a
cursor kept outside ``feed_cursors`` (``ackline tail --from-cursor``), a reader or
processor a forced drop left behind, one created after a drop (it starts at the feed's
start, after the dropped days), or a processor reset to rebuild from the start. The feed
then goes on from the first batch it still holds, and nothing in the events says some
were taken: this module tells.

The I/O is one read of ``retention_drops``, where each drop recorded the newest
transaction whose rows it took (migration 0014), and, for a reader that runs on, a look at
its newest ``drop_id`` now and then; :func:`lost_after` and :class:`Told` are pure.
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
WHERE up_to IS NOT NULL AND drop_id > $1
ORDER BY drop_id
"""

# Whether a drop was made since a running reader last looked: the newest drop_id, read
# from the primary key's index (one row), a column the processor role may read (0014).
_NEWEST = "SELECT coalesce(max(drop_id), 0) AS newest FROM retention_drops"


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


async def drops(conn: asyncpg.Connection, after: int = 0) -> list[Drop]:
    """The drops retention recorded after drop id ``after`` (every one by default), oldest
    first. Raises what the read raises (a role that may not read the table:
    InsufficientPrivilegeError; before migration 0014: UndefinedColumnError), for the
    caller to say so."""
    rows = await conn.fetch(_DROPS, after)
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


async def newest_drop(conn: asyncpg.Connection) -> int:
    """The id of the newest drop retention recorded (0: none). Raises as :func:`drops`."""
    return int(await conn.fetchval(_NEWEST))


def lost_after(recorded: Sequence[Drop], cursor: Cursor) -> list[Drop]:
    """The drops that took events after ``cursor``, oldest first. Pure."""
    here = cursor.sort_key()
    return [d for d in recorded if d.up_to.sort_key() > here]


class Told:
    """What one reader has been told of retention's drops: their ids, the newest drop it
    looked at (``seen``) and its cursor then (``since``). Kept for as long as the reader
    runs in this process, across the follow() calls of a processor's runner too (it
    follows the feed again after narrowing a failing batch down, from a cursor that may
    still be behind a drop: the drop was told again each time). Pure."""

    def __init__(self) -> None:
        self.seen = 0
        self.since: Cursor | None = None
        self._told: set[int] = set()

    def news(
        self,
        recorded: Sequence[Drop],
        cursor: Cursor,
        newest: int = 0,
        stored: str | None = None,
    ) -> tuple[Cursor, list[Drop]]:
        """The drops of ``recorded`` to tell a reader now at ``cursor`` (not told yet, and
        holding events after it), now counted told, and the cursor they are measured from;
        ``newest``: the newest drop id the look found. A drop made since the last look is
        measured from the cursor of that look: the reader may have read on past some of
        what it took only after it went. A reader whose cursor is stored (``stored``: its
        name) is told such a drop only if the drop named it as left behind: retention
        drops unforced only once every stored reader has read past, so measuring from the
        last look would warn of a gap it does not have. A reader kept in memory is told of
        a gap it may not have, never not told of one it has (as migration 0014 counts)."""
        here = cursor
        if self.since is not None and self.since.sort_key() < cursor.sort_key():
            here = self.since
        if stored is not None and self.since is not None:
            taken = [d for d in recorded if stored in d.readers_behind]
        else:
            taken = lost_after(recorded, here)
        lost = [d for d in taken if d.drop_id not in self._told]
        self._told.update(d.drop_id for d in lost)
        self.seen = max([self.seen, newest, *(d.drop_id for d in recorded)])
        self.since = cursor
        return here, lost
