"""When a faust worker gives up on a consumer group whose errors keep coming back.

aiokafka's group coordinator hands a failed join's error to the user and joins again
once it is taken (:meth:`~.transport.AcklineConsumerThread._take_group_errors`). An error
that comes back at every try for as long as a member gone without leaving can stay in
the group (:func:`~ackline.streams.errors.join_refused_grace_s`) will not pass: a member of
the other runtime, a session timeout the broker refuses, a group the worker may not
join. The worker then stops (exit 2) instead of retrying for ever, owning nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GroupErrorStreak:
    """Errors taken one after another, since when, and at which generation of the
    coordinator they began. Pure: the caller passes the time and the generation."""

    grace_s: float
    since: float | None = None
    generation: int | None = None

    def error(self, now: float, generation: int) -> bool:
        """An error taken at ``now``: True once the streak has lasted ``grace_s``."""
        if self.since is None:
            self.since, self.generation = now, generation
            return False
        return now - self.since >= self.grace_s

    def clean(self, generation: int) -> None:
        """A look with no error: the streak ends once the worker joined since it began
        (another generation); between two failed joins the generation stays."""
        if self.since is not None and generation != self.generation:
            self.since = self.generation = None
