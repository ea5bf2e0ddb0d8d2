"""When a worker gives up on a consumer group whose join Kafka keeps refusing.

A join refused with an error no retry cures while the group or the broker stays as it is
(:data:`~ackline.streams.errors.JOIN_REFUSED`: a member of the other runtime, a session
timeout the broker refuses, a group the worker may not join) is tried again and again by
both clients, for ever, the worker owning nothing. Once such errors have kept coming for
:func:`~ackline.streams.errors.join_refused_grace_s` (a member gone without leaving can
stay that long), the worker stops (exit 2). The default runtime counts the errors
librdkafka hands it; the faust runtime those aiokafka's group coordinator holds for the
user (:meth:`~ackline.streams.faust_runtime.transport.AcklineConsumerThread._take_group_errors`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GroupErrorStreak:
    """Errors taken one after another, since when, the last one when, and at which
    generation of the coordinator they began. Pure: the caller passes the time and the
    generation."""

    grace_s: float
    since: float | None = None
    generation: int | None = None
    last: float | None = None

    def error(self, now: float, generation: int) -> bool:
        """An error taken at ``now``: True once the streak has lasted ``grace_s``. An error
        after a silence of half the grace begins a streak of its own: both clients retry a
        refused join every second or two, and an error that came once (librdkafka's
        coordinator lookup can be refused outside any join) must not stop a worker days
        later, with no grace, at the next one."""
        if self.since is None or (self.last is not None and now - self.last > self.grace_s / 2):
            self.since, self.generation = now, generation
        self.last = now
        return now - self.since >= self.grace_s

    def lasted(self, now: float) -> bool:
        """Whether a streak begun at least ``grace_s`` before ``now`` is still open (no join
        since), whether or not errors still come. Pure."""
        return self.since is not None and now - self.since >= self.grace_s

    def clean(self, generation: int) -> None:
        """A look with no error: the streak ends once the worker joined since it began
        (another generation); between two failed joins the generation stays."""
        if self.since is not None and generation != self.generation:
            self.joined()

    def joined(self) -> None:
        """The worker is in the group: the streak, if any, ends."""
        self.since = self.generation = self.last = None
