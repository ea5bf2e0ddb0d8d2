"""The batch writer: one PostgreSQL transaction per batch, set-based.

Statement order inside the transaction (docs/design.md, "One batch, one transaction"):

1. fence: compare-and-set every offset row the batch advances, on its owner epoch (and,
   where this writer committed the partition's last batch under that epoch, on the
   offset that batch left: see "Where this writer left each partition" below), and take
   a batch id, in one statement (which also says whether the schema is partitioned and
   which UTC day this transaction's rows belong to);
2. read the stored hashes of the batch's keys (the ledger by txn_id and the key table
   ``event_keys`` by event_id, one statement, one index probe per key; before migration
   0008, activity by event_id);
3. classify in memory (:func:`ackline.sinks.ingest.classify.classify`): insert, duplicate
   or conflict;
4. binary COPY of the new events straight into the ledger, then ``event_keys``, then
   activity (into the partition of the day of step 1). Their keys were read in step 2
   and are unique within the batch, so after a read the only way a COPY meets an
   existing key is a concurrent writer that committed (or still holds) it after step 2:
   the unique index raises UniqueViolationError (after waiting for that writer), the
   transaction rolls back and the batch is retried, re-reading the keys - the race of
   crash window 14 of docs/design.md. Nothing is ever overwritten or silently skipped.
   A day whose partition is missing (docs/retention.md) rolls the batch back; the writer
   makes the partitions (:class:`ackline.sinks.admin.partitions.Upkeep`) and retries it;

   A batch's exact copies (:class:`~ackline.sinks.ingest.batch.Repeat`: records a
   replaying worker did not decode, ``ackline.schemas.exact``) are confirmed first, in
   one statement (:data:`_UNCONFIRMED`, one ledger probe each): those whose ledger row
   stores their hash are layer-1 duplicates; any other (a changed body, a new event) is
   decoded here and joins the events in its place, and poison among them rolls the batch
   back (:class:`RepeatRejectedError`: its dead letters must go first);

   While batches meet no stored key (a first ingest), steps 2-4 become one probe per
   key: classify against nothing stored, COPY; the unique indexes are the probe. There
   a unique violation is the normal sign of a stored key (a replay, or a concurrent
   writer's): the transaction rolls back and the batch is retried at once, with steps
   2-4 as above (:meth:`BatchWriter._insert_new`). Measured on 500,000 new events (the
   writer alone): PostgreSQL 27.5 -> 22-23 us per event;
5. conflicts and rejects, each one INSERT … SELECT FROM unnest(...) (a conflict with an
   erased event keeps its keys and hashes but not its incoming body: a replay must not
   bring erased content back), unique on their source coordinates and, since migration
   0016, on the topic's incarnation (:data:`_CONFLICTS_INCARNATED`). A batch that has
   any first takes the erasure lock shared, in a statement of its own
   (:data:`_AFTER_ERASURES`): an erasure in progress
   (:func:`ackline.sinks.admin.erase.erase`, which holds it exclusive) commits first, and
   the INSERTs, whose snapshots are taken after the lock is granted, see its tombstones;
   an erasure that starts later waits for this batch to end, and its own statements see
   these rows committed. Without it each missed the other's uncommitted rows, and a
   conflicting replay (or a reject naming the agent) in flight stored the erased content
   again. The lock goes with the transaction: COMMIT, a rollback, or the end of the
   session of a crashed or dropped writer releases it. Batches of only new events and
   duplicates never take it;
6. the batch row, whose ``commit_xid`` defaults to this transaction's xid8 (the
   changefeed's order), and ``pg_notify('ackline_batches', batch_id)`` (sent on COMMIT
   only), in one statement;
7. COMMIT.

Every wait is bounded (ackline.sinks.connection): each statement by the connection's
statement timeout (the erasure lock of step 5 too), COMMIT by its own commit timeout. A
statement that times out fails the attempt like a lost connection (retried on a fresh
one); a COMMIT that times out, or fails in any way that is not the server's answer, has
an unknown outcome and goes to the reconcile (:meth:`BatchWriter._reconcile`), which
first ends the old server session: a host that vanished never closes it, and until it
ends it holds the batch's row locks and could still commit.

Between two of its batches, outside any transaction, a writer runs the worker's shared
:class:`Upkeep` (one writer at a time; another connection's batch may be in flight): it
makes the partitions ahead and applies the worker's retention when they are due.

Where this writer left each partition: an asynchronous failover can lose commits that
were acknowledged. Rows and offset rows roll back together (the new primary holds a
prefix of the WAL), but the worker's runtime has moved on past them, and a fence that only
asks ``next_offset <= first_offset`` (offsets are not contiguous) would let its next
batch commit past the lost records. So the writer remembers, per partition and epoch,
the offset its last committed batch left there, and the fence also asks for exactly that:
a row that holds something else fails the batch with FencedError, and the runtime
re-reads the partition from the offset PostgreSQL has (docs/design.md, "Fencing and
epochs"; docs/faults.md). Batch ids and xids are reused after such a failover too, so
the reconcile decides from the offset rows, never from the batch row's id.

Performance (docs/performance.md, "Where the time went"): COPY straight into the tables replaced
a COPY into a temporary staging table followed by INSERT … SELECT … ON CONFLICT DO
NOTHING, which made PostgreSQL write every row twice and cost most of the batch's server
time; the statements are merged to cut round trips (each one also waits for the GIL
while the consumer thread decodes the next batch).

Why this module is longer than the house's ~500 lines: every statement of the batch's
one transaction and the reconcile of an unknown COMMIT are here, in their order, so
the crash windows of docs/design.md can be read against one file; the pure parts
(classify, rows, batch, offsets) are modules of their own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date

import asyncpg

from ackline.core.faults import DISARMED, Faults
from ackline.schemas.decode import DEFAULT_LIMITS, Limits, Rejection, decode
from ackline.sinks.admin.erase import ERASURE_LOCK_KEY
from ackline.sinks.admin.partitions import PartitionError, Upkeep
from ackline.sinks.connection import Database, is_transient
from ackline.sinks.errors import (
    FencedError,
    MigrationError,
    RaceLostError,
    RepeatRejectedError,
    TransientDatabaseError,
)
from ackline.sinks.ingest.batch import (
    TP,
    Batch,
    Incoming,
    PartitionRange,
    Repeat,
    new_incoming,
    with_rows,
)
from ackline.sinks.ingest.classify import Classified, classify
from ackline.sinks.ingest.offsets import Claim, locked_offsets
from ackline.sinks.ingest.rows import (
    ACTIVITY_COLUMNS,
    EVENT_KEY_COLUMNS,
    LEDGER_COLUMNS,
    UNPARTITIONED_ACTIVITY_COLUMNS,
    copy_records,
)

log = logging.getLogger(__name__)

_FENCE = """
WITH fenced AS (
    UPDATE consumer_offsets AS o
    SET next_offset = u.next_offset, updated_at = now()
    FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[])
        AS u(topic, partition, first_offset, next_offset, epoch, left_at)
    WHERE o.group_id = $1 AND o.topic = u.topic AND o.partition = u.partition
      AND o.epoch = u.epoch
      AND (o.next_offset IS NULL OR o.next_offset <= u.first_offset)
      AND (u.left_at IS NULL OR o.next_offset = u.left_at)
    RETURNING o.topic, o.partition
), batch AS (
    SELECT nextval('ingest_batch_id_seq') AS batch_id,
           to_regclass('public.event_keys') IS NOT NULL AS keyed,
           to_regclass('public.rejects_source_key') IS NOT NULL AS incarnated,
           (now() AT TIME ZONE 'UTC')::date AS ingested_on
)
SELECT batch.batch_id, batch.keyed, batch.incarnated, batch.ingested_on, fenced.topic,
       fenced.partition
FROM batch LEFT JOIN fenced ON true
"""

# One index probe per key, whatever the statistics say: each key is looked up in a
# subquery that OFFSET 0 keeps from being flattened into a join, so the plan is a nested
# loop over the keys with a primary-key index scan inside. Written as `= ANY($1)`, the
# planner's estimate for 2,000 keys preferred a sequential scan of the whole ledger once
# it held ~200k rows (48 ms per read against 11 ms probed; linear in the table's size).
# Layer 2 is read only for the events whose txn_id the ledger does not hold: classify()
# judges the others on layer 1 and never looks at their event_id, so on a replay one row
# comes back per event, not two. The keys go once, as the batch's (txn_id, event_id)
# pairs ($1, $2); the ledger is probed once per distinct txn_id. A third array of the
# distinct txn_ids cost the worker ~40 % more bytes to encode and send on every replayed
# batch (docs/performance.md).
_KEYS_AND_LEDGER = """
WITH k AS MATERIALIZED (
    SELECT k.txn_id, k.event_id FROM unnest($1::text[], $2::uuid[]) AS k(txn_id, event_id)
), l AS MATERIALIZED (
    SELECT t.txn_id, t.body_hash, t.event_id
    FROM (SELECT DISTINCT k.txn_id FROM k) AS d
    CROSS JOIN LATERAL (
        SELECT t.txn_id, t.body_hash, t.event_id FROM txn_ledger AS t
        WHERE t.txn_id = d.txn_id OFFSET 0
    ) AS t
)
SELECT true AS ledger, l.txn_id, l.body_hash, l.event_id FROM l
UNION ALL
"""

_STORED_KEYS = (
    _KEYS_AND_LEDGER
    + """
SELECT false, NULL, e.body_hash, e.event_id
FROM k
CROSS JOIN LATERAL (
    SELECT x.body_hash, x.event_id FROM event_keys AS x WHERE x.event_id = k.event_id OFFSET 0
) AS e
WHERE k.txn_id NOT IN (SELECT txn_id FROM l)
"""
)

# Before migration 0008 (a worker of this version may run while it is applied): layer 2
# is activity's own primary key.
_STORED_KEYS_UNPARTITIONED = (
    _KEYS_AND_LEDGER
    + """
SELECT false, NULL, a.body_hash, a.event_id
FROM k
CROSS JOIN LATERAL (
    SELECT x.body_hash, x.event_id FROM activity AS x WHERE x.event_id = k.event_id OFFSET 0
) AS a
WHERE k.txn_id NOT IN (SELECT txn_id FROM l)
"""
)

# Which of these (txn_id, body_hash) pairs the ledger does not hold (0-based places): one
# index probe per key, as for _STORED_KEYS (OFFSET 0 keeps the lateral probe a nested loop).
_UNCONFIRMED = """
SELECT (k.i - 1)::int AS i
FROM unnest($1::text[], $2::bytea[]) WITH ORDINALITY AS k(txn_id, body_hash, i)
LEFT JOIN LATERAL (
    SELECT t.body_hash FROM txn_ledger AS t WHERE t.txn_id = k.txn_id OFFSET 0
) AS t ON true
WHERE t.body_hash IS DISTINCT FROM k.body_hash
"""

# Since migration 0016 rejects and conflicts are unique per incarnation of their topic
# too: src_topic_id is the ID recorded for the group's DB offsets (0015), read in this
# transaction, whose fence holds those offsets ('' where none is recorded). adopt-topic
# rewinds the offsets and records the new ID in one transaction, so the ID read is the
# incarnation the batch's offsets belong to: a row of the new incarnation at an offset
# where the old one had a row is kept beside it, not dropped by DO NOTHING.
_CONFLICTS_INCARNATED = """
INSERT INTO conflicts
    (layer, event_id, txn_id, stored_event_id, stored_hash, incoming_hash, incoming_body,
     group_id, src_topic, src_topic_id, src_partition, src_offset, batch_id, erasure_id)
SELECT u.layer, u.event_id, u.txn_id, u.stored_event_id, u.stored_hash, u.incoming_hash,
       CASE WHEN e.erasure_id IS NULL THEN u.incoming_body::jsonb END,
       $1, u.topic, coalesce(i.topic_id, ''), u.partition, u.src_offset, $2, e.erasure_id
FROM unnest($3::text[], $4::uuid[], $5::text[], $6::uuid[], $7::bytea[], $8::bytea[],
            $9::text[], $10::text[], $11::int[], $12::bigint[])
    AS u(layer, event_id, txn_id, stored_event_id, stored_hash, incoming_hash,
         incoming_body, topic, partition, src_offset)
LEFT JOIN erased_events AS e ON e.event_id = u.stored_event_id
LEFT JOIN topic_incarnations AS i ON i.group_id = $1 AND i.topic = u.topic
ON CONFLICT (group_id, src_topic, src_partition, src_offset, src_topic_id) DO NOTHING
"""

# Migrations 0008 to 0015: the key without the incarnation.
_CONFLICTS = """
INSERT INTO conflicts
    (layer, event_id, txn_id, stored_event_id, stored_hash, incoming_hash, incoming_body,
     group_id, src_topic, src_partition, src_offset, batch_id, erasure_id)
SELECT u.layer, u.event_id, u.txn_id, u.stored_event_id, u.stored_hash, u.incoming_hash,
       CASE WHEN e.erasure_id IS NULL THEN u.incoming_body::jsonb END,
       $1, u.topic, u.partition, u.src_offset, $2, e.erasure_id
FROM unnest($3::text[], $4::uuid[], $5::text[], $6::uuid[], $7::bytea[], $8::bytea[],
            $9::text[], $10::text[], $11::int[], $12::bigint[])
    AS u(layer, event_id, txn_id, stored_event_id, stored_hash, incoming_hash,
         incoming_body, topic, partition, src_offset)
LEFT JOIN erased_events AS e ON e.event_id = u.stored_event_id
ON CONFLICT (group_id, src_topic, src_partition, src_offset) DO NOTHING
"""

# Before migration 0008: no erasures, so no erased event to withhold a body for.
_CONFLICTS_UNPARTITIONED = """
INSERT INTO conflicts
    (layer, event_id, txn_id, stored_event_id, stored_hash, incoming_hash, incoming_body,
     group_id, src_topic, src_partition, src_offset, batch_id)
SELECT u.layer, u.event_id, u.txn_id, u.stored_event_id, u.stored_hash, u.incoming_hash,
       u.incoming_body::jsonb, $1, u.topic, u.partition, u.src_offset, $2
FROM unnest($3::text[], $4::uuid[], $5::text[], $6::uuid[], $7::bytea[], $8::bytea[],
            $9::text[], $10::text[], $11::int[], $12::bigint[])
    AS u(layer, event_id, txn_id, stored_event_id, stored_hash, incoming_hash,
         incoming_body, topic, partition, src_offset)
ON CONFLICT (group_id, src_topic, src_partition, src_offset) DO NOTHING
"""

# The erasure lock ("ACKE"), shared: batches that write conflicts or rejects do not wait
# for each other, only for an erasure, which takes it exclusive
# (ackline.sinks.admin.erase._ERASURE_LOCK). Its own statement, after the fence and the
# COPYs and right before the INSERTs: under READ COMMITTED each statement's snapshot is
# taken when it starts, so only a statement that starts after the lock is granted sees
# what the erasure committed. Bounded like every statement (the connection's statement
# timeout); past it the batch is retried (a transient error). No grant needed: the
# advisory lock functions are executable by PUBLIC.
_AFTER_ERASURES = "SELECT pg_advisory_xact_lock_shared($1)"  # ERASURE_LOCK_KEY

_REJECTS_INCARNATED = """
INSERT INTO rejects
    (reason, detail, raw_key, raw_value, headers, group_id, src_topic, src_topic_id,
     src_partition, src_offset, dlq_topic, dlq_partition, dlq_offset, batch_id)
SELECT u.reason, u.detail, u.raw_key, u.raw_value, u.headers::jsonb, $1, u.topic,
       coalesce(i.topic_id, ''), u.partition, u.src_offset, u.dlq_topic, u.dlq_partition,
       u.dlq_offset, $2
FROM unnest($3::text[], $4::text[], $5::bytea[], $6::bytea[], $7::text[], $8::text[],
            $9::int[], $10::bigint[], $11::text[], $12::int[], $13::bigint[])
    AS u(reason, detail, raw_key, raw_value, headers, topic, partition, src_offset,
         dlq_topic, dlq_partition, dlq_offset)
LEFT JOIN topic_incarnations AS i ON i.group_id = $1 AND i.topic = u.topic
ON CONFLICT (group_id, src_topic, src_partition, src_offset, src_topic_id) DO NOTHING
"""

# Before migration 0016 (see _CONFLICTS_INCARNATED).
_REJECTS = """
INSERT INTO rejects
    (reason, detail, raw_key, raw_value, headers, group_id, src_topic, src_partition,
     src_offset, dlq_topic, dlq_partition, dlq_offset, batch_id)
SELECT u.reason, u.detail, u.raw_key, u.raw_value, u.headers::jsonb, $1, u.topic,
       u.partition, u.src_offset, u.dlq_topic, u.dlq_partition, u.dlq_offset, $2
FROM unnest($3::text[], $4::text[], $5::bytea[], $6::bytea[], $7::text[], $8::text[],
            $9::int[], $10::bigint[], $11::text[], $12::int[], $13::bigint[])
    AS u(reason, detail, raw_key, raw_value, headers, topic, partition, src_offset,
         dlq_topic, dlq_partition, dlq_offset)
ON CONFLICT (group_id, src_topic, src_partition, src_offset) DO NOTHING
"""

# A batch's transaction begins in one round trip and lifts the server's statement and
# lock timeouts for itself: a shorter statement_timeout an operator sets on the role or
# the database (a guard against runaway queries) cancelled every try of a batch whose COPY
# outlasts it, the same batch at the same size, so the writer retried it for ever and kept
# its partitions. Every statement stays bounded by the client (command_timeout,
# statement_s; COMMIT by commit_s), and the server ends a vanished client's statement
# (client_connection_check_interval): ackline.sinks.connection. PostgreSQL 17's
# transaction_timeout ends the session instead (FATAL 25P04, the same batch retried for
# ever); a server before 17 refuses the name, so it has a string of its own (verified on
# 17.6: SET LOCAL transaction_timeout = 0 stops the timer of the transaction under way).
_BEGIN = "BEGIN; SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0"
_BEGIN_17 = _BEGIN + "; SET LOCAL transaction_timeout = 0"

_READ_BOUNDS = """
SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)
"""

_BATCH_ROW = """
WITH b AS (
    INSERT INTO ingest_batches
        (batch_id, group_id, worker, ranges, events, inserted, duplicates_ledger,
         duplicates_pk, conflicts_ledger, conflicts_pk, rejects)
    VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10, $11)
    RETURNING batch_id
)
SELECT pg_notify('ackline_batches', b.batch_id::text) FROM b
"""


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one committed batch did; metrics are counted from this, after COMMIT."""

    batch_id: int
    events: int
    inserted: int
    duplicates: dict[str, int]
    conflicts: dict[str, int]
    rejects: dict[str, int] = field(default_factory=dict)
    exact: int = 0
    """Of the ledger duplicates, the exact copies written undecoded (batch.repeats)."""


@dataclass(frozen=True, slots=True)
class _Fenced:
    """What the fence statement returned besides winning: the batch id, whether the
    schema has event_keys (migration 0008), the UTC day of this transaction, and whether
    rejects and conflicts are keyed by incarnation (migration 0016)."""

    batch_id: int
    keyed: bool
    ingested_on: date
    incarnated: bool = False


class _PartitionMissingError(Exception):
    """A COPY found no partition for this transaction's day: make it, retry the batch."""


class _StoredKeyMetError(Exception):
    """An unread batch met a stored key: roll back, retry it reading the keys first (a
    second attempt of the batch, so its fault points are reached again)."""


_SCHEMA_MOVES = 3
"""Schema moves one batch retries, over all its attempts (0008 and 0016 applied under it
in turn are two); past them MigrationError is raised."""


class _SchemaMovedError(Exception):
    """Migration 0008 (or 0016) committed under a batch that began before it: retry the
    batch, whose fence then reads the schema there is."""


def _unless_moved_too_often(moved: int, exc: _SchemaMovedError) -> None:
    """Raise MigrationError once one batch met more than :data:`_SCHEMA_MOVES`: not a
    migration under it (each comes once) but the same refusal again and again (a
    constraint renamed by hand), which was retried at once for ever."""
    if moved > _SCHEMA_MOVES:
        raise MigrationError(
            f"PostgreSQL refused a batch {moved} times as if a migration had just changed "
            f"the schema under it ({exc.__cause__!r}): the schema is not what ackline's "
            "migrations leave (0008's partitioned activity, 0016's keys rejects_source_key "
            "and conflicts_source_key); `ackline doctor` and `ackline migrate` say which"
        ) from exc.__cause__


class _CommitUncertainError(Exception):
    def __init__(self, result: WriteResult, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.result = result


async def unconfirmed(conn: asyncpg.Connection, copies: Sequence[Repeat]) -> list[int]:
    """The places of ``copies`` whose ledger row does not store their hash (absent, or
    another body): :data:`_UNCONFIRMED`. Reads only."""
    rows = await conn.fetch(_UNCONFIRMED, [c.txn_id for c in copies], [c.body_hash for c in copies])
    return [row[0] for row in rows]


def copy_refusal(exc: BaseException) -> str | None:
    """Why PostgreSQL refused a COPY's rows, read from the error's fields: its text is
    translated under ``lc_messages``, so matching English words made a German server's
    missing partition fatal.

    "no_partition": a row of ``activity`` was routed to no partition (SQLSTATE 23514
    naming the table and no constraint; a CHECK constraint's violation names its
    constraint). "no_ingested_on": ``ingested_on`` was NULL against NOT NULL (23502 naming
    the column). None: any other error, raised as it is.
    """
    if isinstance(exc, asyncpg.CheckViolationError):
        routed_nowhere = exc.table_name == "activity" and not exc.constraint_name
        return "no_partition" if routed_nowhere else None
    if isinstance(exc, asyncpg.NotNullViolationError):
        return "no_ingested_on" if exc.column_name == "ingested_on" else None
    return None


def _proven_by_copy(fresh: Classified) -> bool:
    """Whether a successful COPY of ``fresh``'s inserts proves ``fresh`` (classified
    against nothing stored) is the classification a read of the stored keys would give.

    An insert's two keys are both written, so the unique indexes check both. An event
    that met an earlier one of its batch on the ledger (same txn_id) was judged on layer
    1, as a read would judge it: that txn_id is an insert's, checked. But one judged on
    layer 2 (an earlier event's event_id, under a txn_id of its own) never had its
    txn_id checked, and a stored txn_id comes first (layer 1 before layer 2): only a
    read can tell (a replay of a stored event under a reused event id was taken for a
    conflict with its neighbour).
    """
    return fresh.duplicates["primary_key"] == 0 and fresh.conflicts_on("primary_key") == 0


class BatchWriter:
    """Writes batches for one consumer group; see the module docstring for the order."""

    def __init__(
        self,
        db: Database,
        group_id: str,
        worker: str,
        faults: Faults = DISARMED,
        on_retry: Callable[[str], None] | None = None,
        upkeep: Upkeep | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self._db = db
        self._limits = limits  # to decode an exact copy the ledger no longer vouches for
        self._group = group_id
        self._worker = worker
        self._faults = faults
        self._on_retry = on_retry
        self._upkeep = upkeep if upkeep is not None else Upkeep()
        self.retries: Counter[str] = Counter()
        # partition -> (epoch, next offset) its last batch committed by this writer left
        self._left: dict[TP, tuple[int, int]] = {}
        # whether the next batch is COPYed before reading its keys (_insert_new)
        self._unread = True
        self._mid_copy_hit = False  # the mid_copy fault point was reached in this attempt

    @property
    def unreachable_since(self) -> float | None:
        """Monotonic time since which this writer cannot connect to PostgreSQL, or None."""
        return self._db.unreachable_since

    async def probe(self) -> None:
        """``SELECT 1`` on this writer's connection, retried through outages: it returns
        once PostgreSQL answers this writer again (and its run of failures is ended).
        Only while no batch is in flight: one connection serves one statement."""
        await self._db.answers()

    def _retrying(self, cause: str) -> None:
        self.retries[cause] += 1
        if self._on_retry is not None:
            self._on_retry(cause)

    async def write(self, batch: Batch) -> WriteResult:
        """Commit ``batch`` exactly once, or raise :class:`FencedError`.

        Order of effects: the transaction of the module docstring, every wait bounded.
        On a transient error before COMMIT (a lost connection, or a statement past its
        timeout: the peer may have vanished) the connection is dropped without waiting on
        the server, so the transaction cannot commit; the whole batch is retried on a fresh
        connection with backoff, after ending the dropped session (it may still hold the
        offset-row locks). When the COMMIT itself fails with the connection or times out,
        the outcome is unknown and is reconciled by reading (never by re-sending), on a
        fresh connection: end the old session and wait until it is gone (after that nothing
        it received can still commit); read the offset rows FOR SHARE under a lock and a
        statement timeout; then those rows decide (:meth:`_reconcile`): at the offset
        after the batch under its epoch means committed (return), elsewhere under it rolled
        back (retry under the same epoch), another epoch raises FencedError. A crash at any
        step leaves the database alone deciding what was committed; nothing outside it is
        changed here. Cancelling this coroutine is always
        safe: cancellation drops the connection at once (no polite ROLLBACK that could wait
        on a dead server), the server rolls back whatever had not committed, and the next
        write starts on a fresh connection after ending the old session, never sharing one
        with a cancelled write.
        """
        try:
            result = await self._write(batch)
        except asyncio.CancelledError:
            self._forget(batch)  # outcome unknown: the runtime re-reads from the DB offsets
            await self._db.discard()
            raise
        except FencedError:
            self._forget(batch)  # the runtime re-reads (or gives up) from the DB offsets
            raise
        for r in batch.ranges:
            self._left[(r.topic, r.partition)] = (r.epoch, r.next_offset)
        return result

    def _forget(self, batch: Batch) -> None:
        for r in batch.ranges:
            self._left.pop((r.topic, r.partition), None)

    def _left_at(self, r: PartitionRange) -> int | None:
        """The offset this writer's last committed batch left on ``r``'s partition under
        ``r``'s epoch (None: none under that epoch, since the claim or a re-read)."""
        left = self._left.get((r.topic, r.partition))
        return left[1] if left is not None and left[0] == r.epoch else None

    async def _write(self, batch: Batch) -> WriteResult:
        delay = 0.05
        make_partitions = False
        moved = 0  # schema moves met by this batch's attempts
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await self._db.get()
                if make_partitions:
                    make_partitions = False
                    await self._upkeep.ensure_now(conn)
                else:
                    await self._upkeep.run_if_due(conn)
                result = await self._attempt(conn, batch)
            except _PartitionMissingError as exc:
                self._retrying("partition_missing")
                log.warning("batch %s: %s; making partitions and retrying", batch.describe(), exc)
                make_partitions = True
            except PartitionError as exc:
                self._retrying("partition_missing")
                log.error("batch %s waits for its partition: %s", batch.describe(), exc)
                make_partitions = True
                pause = delay * (0.5 + random.random())
                await self._db.discard()
                await self._db.pause(pause)
                delay = min(delay * 2, 5.0)
            except _SchemaMovedError as exc:
                moved += 1
                _unless_moved_too_often(moved, exc)
                self._retrying("schema_moved")
                continue
            except _StoredKeyMetError:
                continue  # not a retry: how a replay's first batch learns to read first
            except _CommitUncertainError as uncertain:
                self._retrying("commit_uncertain")
                log.warning(
                    "batch %s: COMMIT outcome unknown (%r); reconciling",
                    batch.describe(),
                    uncertain.__cause__,
                )
                await self._db.discard()
                if await self._reconcile(batch):
                    return uncertain.result
                log.warning("batch %s did not commit; retrying", batch.describe())
            except RaceLostError:
                self._retrying("race")
                continue
            except Exception as exc:
                if not isinstance(exc, TransientDatabaseError) and not is_transient(exc, conn):
                    raise
                self._retrying("transient")
                pause = delay * (0.5 + random.random())
                self._db.failed(f"batch {batch.describe()}", exc, pause)
                await self._db.discard()
                await self._db.pause(pause)
                delay = min(delay * 2, 5.0)
            else:
                self._db.succeeded()
                return result

    async def _attempt(self, conn: asyncpg.Connection, batch: Batch) -> WriteResult:
        """BEGIN, the statements, COMMIT (bounded by the commit timeout, not the statement
        timeout: asyncpg's Transaction object cannot bound its COMMIT apart, so the
        transaction is plain SQL; :data:`_BEGIN` says why it lifts the server's timeouts)."""
        if conn.get_server_version().major >= 17:
            await conn.execute(_BEGIN_17)
        else:
            await conn.execute(_BEGIN)
        try:
            result = await self._statements(conn, batch)
            await self._faults.ahit("before_commit")
        except BaseException as exc:
            await self._abandon(conn, exc)
            raise
        try:
            await self._faults.ahit("during_commit")
            await conn.execute("COMMIT", timeout=self._db.bounds.commit_s)
            await self._faults.ahit("commit_reply_lost")
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
            if isinstance(exc, asyncpg.PostgresError) and not is_transient(exc, conn):
                raise  # the server answered: the transaction did not commit
            raise _CommitUncertainError(result, exc) from exc
        except Exception as exc:  # an injected fault stands for a lost connection
            raise _CommitUncertainError(result, exc) from exc
        return result

    async def _abandon(self, conn: asyncpg.Connection, exc: BaseException) -> None:
        """Leave the transaction after ``exc``: ROLLBACK (bounded) only when the connection
        is sound (the server answered with an error); after a cancellation, a lost
        connection or a timeout the caller drops the connection, never waiting on it."""
        if isinstance(exc, asyncio.CancelledError) or conn.is_closed() or is_transient(exc, conn):
            return
        try:
            await conn.execute("ROLLBACK")
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError):
            await self._db.discard()  # whatever state it is in, the next write starts afresh

    async def _statements(self, conn: asyncpg.Connection, batch: Batch) -> WriteResult:
        self._mid_copy_hit = False
        fenced = await self._fence(conn, batch)
        batch_id = fenced.batch_id
        verdict = await self._insert_new(conn, batch, fenced)
        if verdict.conflicts or batch.rejects:
            await self._after_erasures(conn, batch)
        try:
            if verdict.conflicts:
                await self._insert_conflicts(conn, batch_id, verdict, fenced)
            if batch.rejects:
                await self._insert_rejects(conn, batch_id, batch, fenced.incarnated)
        except asyncpg.InvalidColumnReferenceError as exc:
            if fenced.incarnated:
                raise
            # The old key named in ON CONFLICT is gone: migration 0016 committed after
            # this batch's fence read the schema (0016 locks both tables, which this
            # transaction had not touched yet). Retried, it writes the new key.
            raise _SchemaMovedError() from exc
        result = WriteResult(
            batch_id=batch_id,
            events=batch.size,
            inserted=len(verdict.inserts),
            duplicates={k: v for k, v in verdict.duplicates.items()},
            conflicts={
                "ledger": verdict.conflicts_on("ledger"),
                "primary_key": verdict.conflicts_on("primary_key"),
            },
            rejects=dict(Counter(r.reason for r in batch.rejects)),
            exact=len(batch.repeats),
        )
        ranges = {f"{r.topic}:{r.partition}": [r.first_offset, r.next_offset] for r in batch.ranges}
        await conn.execute(
            _BATCH_ROW,
            batch_id,
            self._group,
            self._worker,
            json.dumps(ranges),
            result.events,
            result.inserted,
            result.duplicates["ledger"],
            result.duplicates["primary_key"],
            result.conflicts["ledger"],
            result.conflicts["primary_key"],
            len(batch.rejects),
        )
        return result

    async def _fence(self, conn: asyncpg.Connection, batch: Batch) -> _Fenced:
        """The fence (first statement of the transaction): the new batch id, the schema's
        generation and the day of this transaction's rows."""
        ranges = batch.ranges
        rows = await conn.fetch(
            _FENCE,
            self._group,
            [r.topic for r in ranges],
            [r.partition for r in ranges],
            [r.first_offset for r in ranges],
            [r.next_offset for r in ranges],
            [r.epoch for r in ranges],
            [self._left_at(r) for r in ranges],
        )
        won = {(str(r["topic"]), int(r["partition"])) for r in rows if r["topic"] is not None}
        if len(won) != len(ranges):
            lost = [(r.topic, r.partition) for r in ranges if (r.topic, r.partition) not in won]
            raise FencedError(lost)
        head = rows[0]
        return _Fenced(
            int(head["batch_id"]),
            bool(head["keyed"]),
            head["ingested_on"],
            bool(head["incarnated"]),
        )

    async def _copy_inserts(
        self, conn: asyncpg.Connection, fenced: _Fenced, verdict: Classified
    ) -> None:
        """Binary COPY of the new events into txn_ledger, event_keys, then activity (same
        transaction; before migration 0008: txn_ledger, then activity).

        A key that exists (committed by a concurrent writer after the keys were read, or
        stored, when they were not read) fails the COPY with UniqueViolationError: raised
        as RaceLostError; the caller rolls back and retries the batch, which reads the
        keys (again, if it had read them). A missing partition
        (:func:`copy_refusal`) and a batch that began before
        migration 0008 and met the partitioned table (its rows carry no ingested_on,
        which has no default there) roll back and are retried too.
        """
        batch_id, day = fenced.batch_id, fenced.ingested_on
        ledger, keys, activity = copy_records(verdict.inserts, batch_id, day)
        try:
            await conn.copy_records_to_table("txn_ledger", columns=LEDGER_COLUMNS, records=ledger)
            if not self._mid_copy_hit:  # once per attempt, however many COPYs it makes
                self._mid_copy_hit = True
                await self._faults.ahit("mid_copy")
            if fenced.keyed:
                await conn.copy_records_to_table(
                    "event_keys", columns=EVENT_KEY_COLUMNS, records=keys
                )
                await conn.copy_records_to_table(
                    "activity", columns=ACTIVITY_COLUMNS, records=activity
                )
            else:
                await conn.copy_records_to_table(
                    "activity",
                    columns=UNPARTITIONED_ACTIVITY_COLUMNS,
                    records=[a[:-1] for a in activity],
                )
        except asyncpg.UniqueViolationError as exc:
            raise RaceLostError(f"a key of this batch was taken by another writer: {exc}") from exc
        except (asyncpg.CheckViolationError, asyncpg.NotNullViolationError) as exc:
            refusal = copy_refusal(exc)
            if refusal is not None and not fenced.keyed:
                # Begun before migration 0008, met the partitioned table: its ingested_on
                # (no default) is NULL, so no partition takes the row.
                raise _SchemaMovedError() from exc
            if refusal != "no_partition":
                raise
            raise _PartitionMissingError(f"no partition of activity for {day}") from exc

    async def _insert_new(
        self, conn: asyncpg.Connection, batch: Batch, fenced: _Fenced
    ) -> Classified:
        """Classify the batch's events and COPY the new ones (steps 2-4 of the module
        docstring), probing each key once when the keys are expected to be new.

        Unread (while the last batch met no stored key): classify against nothing stored,
        COPY. The unique indexes are the probe: if the COPY succeeds, no key it wrote was
        stored, so that classification is the one a read would have given
        (:func:`_proven_by_copy` says when the COPY writes every key that matters). If a
        key was stored (a replay, or a concurrent writer that committed it: the COPY waits
        for that writer first), the COPY fails with a unique violation and
        :class:`_StoredKeyMetError` rolls the whole transaction back (the ledger rows of a
        COPY that failed on event_keys included); the batch is retried at once, read first,
        and the next batches read first until one meets no stored key. The whole
        transaction, not a savepoint: a savepoint cost a round trip on every batch of a
        first ingest to spare a fence on the one batch where a replay begins.

        Read first: read the stored keys, classify, COPY the new events.

        Nothing here commits: a crash at any step leaves the transaction to roll back.
        """
        if batch.repeats:
            await self._confirm_repeats(conn, batch)
        unread = self._unread and batch.events and not batch.repeats
        fresh = classify(batch.events, {}, {}) if unread else None
        if fresh is not None and _proven_by_copy(fresh):
            try:
                await self._copy_inserts(conn, fenced, fresh)
            except RaceLostError as exc:  # a stored key: retry the batch, reading them all
                self._unread = False
                raise _StoredKeyMetError() from exc
            return fresh
        verdict, stored = await self._classify(conn, batch, fenced.keyed)
        verdict.duplicates["ledger"] += len(batch.repeats)
        self._unread = not stored and not batch.repeats
        if verdict.inserts:
            await self._copy_inserts(conn, fenced, verdict)
        return verdict

    async def _confirm_repeats(self, conn: asyncpg.Connection, batch: Batch) -> None:
        """Keep as repeats the exact copies whose ledger row stores their hash (read in
        this transaction: layer-1 duplicates, as a key read would find); decode the others
        into the batch's events, in their places (a changed body, a new event, a row lost
        in a failover). Any of those that does not decode raises
        :class:`RepeatRejectedError`: the transaction rolls back, nothing of the batch is
        written, and the consumer reads it again, decoding those records (their dead
        letters go first). Nothing here commits; a batch retried keeps what was decoded."""
        repeats = batch.repeats
        gone = await unconfirmed(conn, repeats)
        if not gone:
            return
        rows: dict[int, Incoming] = {}
        rejected: list[Repeat] = []
        for i in gone:
            rep = repeats[i]
            row = decode(rep.value, self._limits)
            if isinstance(row, Rejection):
                rejected.append(rep)
            else:
                rows[i] = new_incoming((rep.coord, row))
        if rejected:
            first = rejected[0].coord
            raise RepeatRejectedError(
                f"{len(rejected)} records written undecoded do not decode (the first: "
                f"{first.topic}[{first.partition}]@{first.offset})",
                [(r.coord.topic, r.coord.partition, r.coord.offset) for r in rejected],
            )
        batch.events, batch.repeats = with_rows(batch.events, repeats, rows)

    async def _classify(
        self, conn: asyncpg.Connection, batch: Batch, keyed: bool
    ) -> tuple[Classified, bool]:
        """The batch classified against its stored keys, and whether any key was stored."""
        pairs = {(i.row.txn_id, i.row.event_id) for i in batch.events}
        txn_ids = [txn_id for txn_id, _ in pairs]
        event_ids = [event_id for _, event_id in pairs]
        ledger: dict[str, tuple[bytes, uuid.UUID]] = {}
        activity: dict[uuid.UUID, bytes] = {}
        if pairs:
            if keyed:
                rows = await conn.fetch(_STORED_KEYS, txn_ids, event_ids)
            else:
                rows = await conn.fetch(_STORED_KEYS_UNPARTITIONED, txn_ids, event_ids)
            for is_ledger, txn_id, body_hash, event_id in rows:  # a row per replayed event
                if is_ledger:
                    ledger[txn_id] = (bytes(body_hash), event_id)
                else:
                    activity[event_id] = bytes(body_hash)
        return classify(batch.events, ledger, activity), bool(ledger or activity)

    async def _after_erasures(self, conn: asyncpg.Connection, batch: Batch) -> None:
        """Take the erasure lock shared (:data:`_AFTER_ERASURES`), waiting for an erasure
        in progress to commit. Nothing here commits. Past the statement timeout (an erasure
        that runs longer, or a server that stopped answering) the attempt fails like any
        statement that timed out: the connection is dropped, its session ended, and the
        whole batch written again, waiting again while the erasure runs."""
        try:
            await conn.execute(_AFTER_ERASURES, ERASURE_LOCK_KEY)
        except TimeoutError:
            log.warning(
                "batch %s: no erasure lock within %gs (an erasure in progress, or no answer)",
                batch.describe(),
                self._db.bounds.statement_s,
            )
            raise

    async def _insert_conflicts(
        self, conn: asyncpg.Connection, batch_id: int, verdict: Classified, fenced: _Fenced
    ) -> None:
        cs = verdict.conflicts
        args = (
            self._group,
            batch_id,
            [c.layer for c in cs],
            [c.incoming.row.event_id for c in cs],
            [c.incoming.row.txn_id for c in cs],
            [c.stored_event_id for c in cs],
            [c.stored_hash for c in cs],
            [c.incoming.row.body_hash for c in cs],
            [c.incoming.row.body_json for c in cs],
            [c.incoming.coord.topic for c in cs],
            [c.incoming.coord.partition for c in cs],
            [c.incoming.coord.offset for c in cs],
        )
        if fenced.incarnated:
            await conn.execute(_CONFLICTS_INCARNATED, *args)
        elif fenced.keyed:
            await conn.execute(_CONFLICTS, *args)
        else:
            await conn.execute(_CONFLICTS_UNPARTITIONED, *args)

    async def _insert_rejects(
        self, conn: asyncpg.Connection, batch_id: int, batch: Batch, incarnated: bool
    ) -> None:
        rs = batch.rejects
        args = (
            self._group,
            batch_id,
            [r.reason for r in rs],
            [r.detail for r in rs],
            [r.raw_key for r in rs],
            [r.raw_value for r in rs],
            [json.dumps(r.headers) for r in rs],
            [r.coord.topic for r in rs],
            [r.coord.partition for r in rs],
            [r.coord.offset for r in rs],
            [r.dlq_topic for r in rs],
            [r.dlq_partition for r in rs],
            [r.dlq_offset for r in rs],
        )
        if incarnated:
            await conn.execute(_REJECTS_INCARNATED, *args)
        else:
            await conn.execute(_REJECTS, *args)

    async def _reconcile(self, batch: Batch) -> bool:
        """After an unknown COMMIT outcome: True if it committed, False to retry.

        Raises FencedError when it did not commit and the epoch has moved on. Order of
        effects, on a fresh connection (retried through outages): the old session is ended
        and gone (ackline.sinks.connection.Database.get), so nothing can commit late; the
        offset rows are read FOR SHARE, which waits for any other transaction on them, with
        the server's lock and statement timeouts below the client's, so a wait that lasts
        ends as a clean error that is retried. Read-only. The rows decide
        (:func:`reconciled`), not the batch row: after an asynchronous failover the batch
        id this batch took may belong to another batch (sequence values are reused), while
        the offset rows roll back together with the batch's rows.
        """
        bounds = self._db.bounds
        lock_ms = str(max(100, int(bounds.statement_s * 1000 / 3)))
        statement_ms = str(max(200, int(bounds.statement_s * 1000 * 2 / 3)))

        async def read(conn: asyncpg.Connection) -> list[Claim]:
            async with conn.transaction():
                await conn.execute(_READ_BOUNDS, lock_ms, statement_ms)
                return await locked_offsets(
                    conn, self._group, [(r.topic, r.partition) for r in batch.ranges]
                )

        rows = await self._db.retrying("reconcile", read)
        outcome = reconciled(batch.ranges, rows)
        if outcome == "committed":
            log.info("batch %s had committed; reconciled by reading", batch.describe())
            return True
        if outcome == "fenced":
            theirs = {(c.topic, c.partition): c.epoch for c in rows}
            raise FencedError(
                [
                    (r.topic, r.partition)
                    for r in batch.ranges
                    if theirs.get((r.topic, r.partition)) != r.epoch
                ],
                outcome_lost=True,
            )
        return False


def reconciled(ranges: Sequence[PartitionRange], rows: Sequence[Claim]) -> str:
    """What an unknown COMMIT did, from the batch's offset rows read after it ended. Pure.

    "committed" when every partition's row holds the batch's epoch and the offset after
    the batch: only this batch could have put that offset there under that epoch (a
    partition's batches are written by one writer of its worker, one at a time, and they
    move forward). "fenced"
    when a partition's row holds another epoch (or is gone): another worker claimed it,
    whatever this batch did. Otherwise "rolled back": the batch may be written again
    under the same epoch (its fence then checks where the partitions really are).
    """
    held = {(c.topic, c.partition): c for c in rows}
    if any(
        (row := held.get((r.topic, r.partition))) is None or row.epoch != r.epoch for r in ranges
    ):
        return "fenced"
    if all(held[(r.topic, r.partition)].next_offset == r.next_offset for r in ranges):
        return "committed"
    return "rolled back"
