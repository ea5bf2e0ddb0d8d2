"""Erasure: remove the bodies of an agent's, a request's or one event's activity, keep
their keys and hashes as tombstones, and record who erased what and when.

What is removed, in ONE transaction (:func:`erase`):

* the ``activity`` rows (every partition): deleted; each leaves a tombstone in
  ``erased_events`` (event_id, txn_id, body hash, batch and Kafka coordinates; no content);
* the incoming bodies of ``conflicts`` on those events' keys, or whose body names the
  agent or request: set to NULL (the conflict row, its keys and hashes stay);
* the raw key, value, headers and detail of ``rejects`` whose key equals the identifier
  or whose key or value holds it as a JSON string (a reject did not decode: it is matched
  by bytes): set to NULL/empty.

What stays: the dedup keys (``txn_ledger``, ``event_keys``), so a replay of an erased
event is a counted duplicate (or a conflict if its body changed), never a new row. What
cannot be erased here: the dead-letter copies of the erased rejects (Kafka records; the
erasure lists their offsets) and the source topic's records (its retention removes them).

Against ingest in flight: the erasure holds the erasure lock ("ACKE", a transaction-level
advisory lock) exclusive for its whole transaction, and every batch that writes conflicts
or rejects holds it shared from just before those INSERTs to its COMMIT
(:mod:`ackline.sinks.ingest.writer`, step 5). So such a batch either commits before the
erasure's statements run (they see its rows and blank them) or writes them after the
erasure committed (its INSERTs see the tombstones: a conflict with an erased event keeps
no body). Before, a conflicting replay (or a reject naming the identifier) written by a
batch in flight was seen by neither and stored the erased content again. Batches of only
new events and duplicates do not wait: what they commit after the DELETE's snapshot is
not erased (run the erasure again).

The audit row (``erasures``) says who (the login), what (selector, value, counts, the
dead-letter offsets) and when; no content. Its ``commit_xid`` places the erasure in the
changefeed, where every reader meets one ``ackline.erased`` notice per erased event
(docs/changefeed.md).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal, get_args

import asyncpg

from ackline.sinks.errors import SinkError

Selector = Literal["agent", "request", "event"]
SELECTORS: Final = get_args(Selector)


class ErasureError(SinkError):
    """The erasure could not run (bad selector, missing privilege, database error);
    nothing was erased."""


@dataclass(frozen=True, slots=True)
class Coordinates:
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class SourceRange:
    """Erased events' records in the source topic: they stay until its retention."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    events: int


@dataclass(frozen=True)
class Erasure:
    """What one erasure did (or, dry run, would do)."""

    erasure_id: int
    selector: Selector
    value: str
    requested_by: str
    erased_at: datetime
    events: int
    conflicts: int
    rejects: int
    dead_letters: list[Coordinates] = field(default_factory=list)
    source: list[SourceRange] = field(default_factory=list)
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "erasure_id": None if self.dry_run else self.erasure_id,
            "dry_run": self.dry_run,
            "selector": self.selector,
            "value": self.value,
            "requested_by": self.requested_by,
            "erased_at": self.erased_at.isoformat(),
            "events": self.events,
            "conflicts": self.conflicts,
            "rejects": self.rejects,
            "dead_letters_not_erased": [
                {"topic": d.topic, "partition": d.partition, "offset": d.offset}
                for d in self.dead_letters
            ],
            "source_records_not_erased": [
                {
                    "topic": s.topic,
                    "partition": s.partition,
                    "first_offset": s.first_offset,
                    "last_offset": s.last_offset,
                    "events": s.events,
                }
                for s in self.source
            ],
        }


# The erasure lock ("ACKE"), exclusive, before the audit row (only SET ROLE, which locks
# nothing, comes first): it waits for every batch in flight that writes conflicts or
# rejects (they hold it shared from just before their INSERTs to their COMMIT:
# ackline.sinks.ingest.writer._AFTER_ERASURES), so this transaction's later statements
# see their rows committed, and such batches wait for this one to end, so their INSERTs
# see its tombstones. No deadlock: it is taken holding nothing, and a batch holding it
# shared waits for nothing the erasure holds (its offset-row locks are no erasure's
# concern). No grant needed: executable by PUBLIC.
ERASURE_LOCK_KEY: Final = 0x41434B45  # "ACKE"
"""The key of the erasure lock, shared by the writer (ackline.sinks.ingest.writer)."""
_ERASURE_LOCK = "SELECT pg_advisory_xact_lock($1)"
_MAY_ERASE = "SELECT pg_has_role(current_user, 'ackline_eraser', 'MEMBER')"
_BE_ERASER = "SET LOCAL ROLE ackline_eraser"

_AUDIT = """
INSERT INTO erasures (selector, value, reason) VALUES ($1, $2, $3)
RETURNING erasure_id, requested_by, erased_at
"""

# One statement per selector, so each uses its own index (agent_id, request_id, event_id
# are indexed in every partition).
_TOMBSTONES = """
INSERT INTO erased_events
    (event_id, txn_id, body_hash, batch_id, src_topic, src_partition, src_offset, erasure_id)
SELECT event_id, txn_id, body_hash, batch_id, src_topic, src_partition, src_offset, $2
FROM gone
RETURNING src_topic, src_partition, src_offset
"""
_SOURCE = """
SELECT src_topic, src_partition, min(src_offset) AS first, max(src_offset) AS last,
       count(*) AS events
FROM kept GROUP BY src_topic, src_partition ORDER BY src_topic, src_partition
"""
_RETURNING = "RETURNING event_id, txn_id, body_hash, batch_id, src_topic, src_partition, src_offset"
_ERASE_AGENT = (
    f"WITH gone AS (DELETE FROM activity WHERE agent_id = $1 {_RETURNING}), "
    f"kept AS ({_TOMBSTONES}) {_SOURCE}"
)
_ERASE_REQUEST = (
    f"WITH gone AS (DELETE FROM activity WHERE request_id = $1 {_RETURNING}), "
    f"kept AS ({_TOMBSTONES}) {_SOURCE}"
)
_ERASE_EVENT = (
    f"WITH gone AS (DELETE FROM activity WHERE event_id = $1::uuid {_RETURNING}), "
    f"kept AS ({_TOMBSTONES}) {_SOURCE}"
)

_CONFLICTS = """
UPDATE conflicts AS c SET incoming_body = NULL, erasure_id = $1
WHERE c.incoming_body IS NOT NULL
  AND (EXISTS (SELECT 1 FROM erased_events AS e
               WHERE e.erasure_id = $1
                 AND (e.event_id IN (c.event_id, c.stored_event_id) OR e.txn_id = c.txn_id))
       OR ($2 = 'agent' AND c.incoming_body ->> 'agent_id' = $3)
       OR ($2 = 'request' AND c.incoming_body ->> 'request_id' = $3)
       OR ($2 = 'event' AND $3 IN (c.event_id::text, c.stored_event_id::text)))
"""

_REJECTS = """
WITH needle AS (
    SELECT convert_to($2, 'UTF8') AS raw, convert_to(to_json($2::text)::text, 'UTF8') AS quoted
)
UPDATE rejects AS r
SET raw_key = NULL, raw_value = NULL, headers = '[]', detail = 'erased', erasure_id = $1
FROM needle AS n
WHERE r.erasure_id IS NULL
  AND (r.raw_key = n.raw
       OR position(n.quoted IN r.raw_key) > 0
       OR position(n.quoted IN r.raw_value) > 0)
RETURNING r.dlq_topic, r.dlq_partition, r.dlq_offset
"""

_COUNTS = """
UPDATE erasures SET events = $2, conflicts = $3, rejects = $4, dead_letters = $5::jsonb
WHERE erasure_id = $1
"""


def check_value(selector: str, value: str) -> str:
    """The identifier to erase, validated (an event id must be a UUID). Pure."""
    if selector not in SELECTORS:
        raise ErasureError(f"erase by one of {', '.join(SELECTORS)}, not {selector!r}")
    if not value.strip():
        raise ErasureError(f"the {selector} to erase is empty")
    if selector == "event":
        try:
            return str(uuid.UUID(value))
        except ValueError as exc:
            raise ErasureError(f"--event needs an event id (a UUID), not {value!r}") from exc
    return value


async def erase(
    conn: asyncpg.Connection,
    selector: Selector,
    value: str,
    *,
    reason: str = "",
    dry_run: bool = False,
) -> Erasure:
    """Erase what ``selector`` = ``value`` names (see the module docstring).

    Order of effects, in ONE transaction: take the ackline_eraser role when the login is a
    member (the transaction can then do only what that role may); take the erasure lock
    exclusive (:data:`_ERASURE_LOCK`), waiting for the ingest batches in flight that write
    conflicts or rejects to end (each is bounded by the writer's statement and commit
    timeouts, and an idle one by idle_in_transaction_session_timeout), and from then on
    making such batches wait for this transaction; insert the audit row; delete the
    activity rows and insert their tombstones (one statement); blank the matching conflict
    bodies; blank the matching rejects; write the counts into the audit row; COMMIT
    (``dry_run``: ROLLBACK, nothing changes), which releases the lock. A crash anywhere
    before COMMIT leaves nothing erased and no audit row (the lock goes with the
    transaction); the erasure can simply be run again. Events committed after the
    DELETE's snapshot are not erased (run it again, or stop their producer first).
    """
    value = check_value(selector, value)
    tr = conn.transaction()
    await tr.start()
    try:
        if await conn.fetchval(_MAY_ERASE):
            await conn.execute(_BE_ERASER)
        await conn.execute(_ERASURE_LOCK, ERASURE_LOCK_KEY)
        audit = await conn.fetchrow(_AUDIT, selector, value, reason)
        if audit is None:
            raise ErasureError("the audit row was not written")
        erasure_id = int(audit["erasure_id"])
        if selector == "agent":
            ranges = await conn.fetch(_ERASE_AGENT, value, erasure_id)
        elif selector == "request":
            ranges = await conn.fetch(_ERASE_REQUEST, value, erasure_id)
        else:
            ranges = await conn.fetch(_ERASE_EVENT, value, erasure_id)
        conflicts = await conn.execute(_CONFLICTS, erasure_id, selector, value)
        dead = await conn.fetch(_REJECTS, erasure_id, value)
        dead_letters = [
            Coordinates(str(d["dlq_topic"]), int(d["dlq_partition"]), int(d["dlq_offset"]))
            for d in dead
        ]
        source = [
            SourceRange(
                str(r["src_topic"]),
                int(r["src_partition"]),
                int(r["first"]),
                int(r["last"]),
                int(r["events"]),
            )
            for r in ranges
        ]
        result = Erasure(
            erasure_id=erasure_id,
            selector=selector,
            value=value,
            requested_by=str(audit["requested_by"]),
            erased_at=audit["erased_at"],
            events=sum(s.events for s in source),
            conflicts=int(conflicts.split()[-1]),
            rejects=len(dead_letters),
            dead_letters=dead_letters,
            source=source,
            dry_run=dry_run,
        )
        await conn.execute(
            _COUNTS,
            erasure_id,
            result.events,
            result.conflicts,
            result.rejects,
            json.dumps(result.to_json()["dead_letters_not_erased"]),
        )
    except asyncpg.PostgresError as exc:
        await _rollback(tr, conn)
        # the shell adds the fix when it is a database never migrated (commands/guard.py)
        raise ErasureError(f"nothing was erased: {exc}") from exc
    except BaseException:
        await _rollback(tr, conn)
        raise
    if dry_run:
        await tr.rollback()
    else:
        await tr.commit()
    return result


async def _rollback(tr: Any, conn: asyncpg.Connection) -> None:
    if not conn.is_closed():
        with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
            await tr.rollback()
