"""When a held partition may be released: both runtimes' one gate.

A partition held because its DB offset is past its log end (a retention race, or a
topic deleted and made again) is released once the log end reaches the offset again.
A topic made again grows past the old offsets too, and its records below them would then
never be read: so the release also waits for a read of the topic's incarnation that began
once the partition was due (``fresh_since``, from
:class:`ackline.runtime.incarnation_watch.IncarnationWatch`). The gate remembers when
each partition became due, which is all it keeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container

from ackline.sinks.ingest.batch import TP


class ReleaseGate:
    """The due times of held partitions whose log end reached their DB offset."""

    def __init__(self, fresh_since: Callable[[float], bool]) -> None:
        self._fresh_since = fresh_since
        self._due_at: dict[TP, float] = {}

    def keep_only(self, held: Container[TP]) -> None:
        """Forget the partitions no longer held (released, revoked)."""
        self._due_at = {tp: at for tp, at in self._due_at.items() if tp in held}

    def may_release(self, tp: TP) -> bool:
        """``tp``'s log end reached its DB offset: whether it may be released now (its due
        time is forgotten then). False asks the watch for a read (``fresh_since``)."""
        if self._fresh_since(self._due_at.setdefault(tp, time.monotonic())):
            del self._due_at[tp]
            return True
        return False
