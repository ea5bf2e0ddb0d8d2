"""The writer's rules for a database that failed over (issue 12; docs/faults.md). Pure."""

from __future__ import annotations

import asyncpg

from ackline.sinks.connection import is_transient
from ackline.sinks.ingest.batch import PartitionRange
from ackline.sinks.ingest.offsets import Claim
from ackline.sinks.ingest.writer import reconciled

RANGES = (PartitionRange("t", 0, 10, 20, 3), PartitionRange("t", 1, 5, 9, 4))


def test_a_batch_committed_when_every_row_holds_its_epoch_and_end() -> None:
    rows = [Claim("t", 0, 20, 3), Claim("t", 1, 9, 4)]
    assert reconciled(RANGES, rows) == "committed"


def test_a_row_behind_the_batch_means_rolled_back_whatever_batch_rows_exist() -> None:
    # After an async failover one partition may even be further behind than the batch's
    # start (an earlier acknowledged batch was lost too): still not committed.
    assert reconciled(RANGES, [Claim("t", 0, 10, 3), Claim("t", 1, 5, 4)]) == "rolled back"
    assert reconciled(RANGES, [Claim("t", 0, 4, 3), Claim("t", 1, 5, 4)]) == "rolled back"


def test_another_epoch_or_a_missing_row_is_fenced() -> None:
    assert reconciled(RANGES, [Claim("t", 0, 20, 4), Claim("t", 1, 9, 4)]) == "fenced"
    assert reconciled(RANGES, [Claim("t", 0, 20, 3)]) == "fenced"
    # a claim lost with the old primary: the epoch went back
    assert reconciled(RANGES, [Claim("t", 0, 10, 2), Claim("t", 1, 5, 4)]) == "fenced"


def test_a_read_only_server_is_transient() -> None:
    """A node that came back as a standby answers writes with 25006; a worker on a
    multi-host DSN reconnects and finds the primary."""
    exc = asyncpg.exceptions.ReadOnlySQLTransactionError(
        "cannot execute UPDATE in a read-only transaction"
    )
    assert is_transient(exc)
