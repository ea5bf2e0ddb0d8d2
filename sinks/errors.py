"""Errors of the PostgreSQL stage; asyncpg errors are wrapped here at the boundary."""

from __future__ import annotations

from ackline.core.errors import AcklineError


class SinkError(AcklineError):
    """Root of the PostgreSQL stage's errors."""


class MigrationError(SinkError):
    """A migration file is missing, altered after it was applied, or failed."""


class FencedError(SinkError):
    """The batch's owner epoch is no longer current: another worker took a partition.

    The batch must be dropped, never retried: the new owner reads on from the DB offsets.
    Its transaction was rolled back, unless ``outcome_lost``: its COMMIT's reply was lost
    and the claim came before the read that would have told (it may have committed first;
    either way the offset rows and the rows move together).
    """

    def __init__(self, partitions: list[tuple[str, int]], *, outcome_lost: bool = False) -> None:
        super().__init__(f"fenced on {partitions}: another worker owns them now")
        self.partitions = partitions
        self.outcome_lost = outcome_lost

    @property
    def verdict(self) -> str:
        """What became of the batch, for its log line (both begin alike: tools look for
        "fenced and rolled back")."""
        if self.outcome_lost:
            return (
                "fenced and rolled back, or committed before the claim "
                "(its COMMIT's reply was lost)"
            )
        return "fenced and rolled back"


class RaceLostError(SinkError):
    """A COPY met a key it was not told of: a concurrent writer's, or (before the keys
    were read, docs/design.md "One probe per key") a stored one.

    Either way the transaction is rolled back and the batch retried, reading the stored
    keys first (again, if it had read them).
    """


class RepeatRejectedError(SinkError):
    """Records written undecoded as exact copies that the ledger does not vouch for did not
    decode: poison in the canonical shape, which must reach the dead-letter topic before a
    reject row, so the writer cannot take it. The batch rolls back; the consumer reads it
    again and decodes ``coords`` ((topic, partition, offset) of each) like any record."""

    def __init__(self, message: str, coords: list[tuple[str, int, int]]) -> None:
        super().__init__(message)
        self.coords = coords


class TransientDatabaseError(SinkError):
    """A connection or server error that a retry with backoff may cure."""


RETRY_MAX_BACKOFF_S = 5.0
"""The longest wait between two retries of a transient error (the backoff doubles up to
it); the settings count it in how long an assign callback's claim may hold a rebalance."""


class FeedError(SinkError):
    """A changefeed cursor, filter or reader cannot be used as given."""


class WaitStoppedError(SinkError):
    """A stop was requested while waiting on PostgreSQL (retrying through an outage).

    Nothing was done since the operation's last attempt failed; the caller unwinds.
    """
