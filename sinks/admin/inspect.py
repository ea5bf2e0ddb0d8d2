"""Read-only queries for the operator commands: conflicts and rejects.

Nothing here writes. Rows come back as plain dataclasses whose ``to_json`` gives the
JSON form the CLI prints: hashes as hex, bytes as base64, times as ISO 8601.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from ackline.sinks.errors import SinkError


class NotFoundError(SinkError):
    """The conflict or reject asked for does not exist (for this consumer group)."""


@dataclass(frozen=True, slots=True)
class ConflictRow:
    conflict_id: int
    layer: str
    event_id: str
    txn_id: str
    stored_event_id: str
    stored_hash: bytes
    incoming_hash: bytes
    topic: str
    partition: int
    offset: int
    batch_id: int
    detected_at: datetime
    erasure_id: int | None = None  # set when an erasure cleared (or withheld) the body
    # the topic's incarnation (migration 0016): '' none recorded, None the database
    # predates 0016; two rows at one source after `offsets adopt-topic` differ here
    topic_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "conflict_id": self.conflict_id,
            "layer": self.layer,
            "event_id": self.event_id,
            "txn_id": self.txn_id,
            "stored_event_id": self.stored_event_id,
            "stored_hash": self.stored_hash.hex(),
            "incoming_hash": self.incoming_hash.hex(),
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "batch_id": self.batch_id,
            "detected_at": self.detected_at.isoformat(),
            "erasure_id": self.erasure_id,
            "topic_id": self.topic_id,
        }


@dataclass(frozen=True, slots=True)
class ConflictDetail:
    row: ConflictRow
    incoming_body: Any
    stored: dict[str, Any] | None  # the activity row that won; None if it is gone
    stored_erasure_id: int | None = None  # the erasure that removed that row, if one did

    def to_json(self) -> dict[str, Any]:
        return {
            **self.row.to_json(),
            "incoming_body": self.incoming_body,
            "stored": self.stored,
            "stored_erasure_id": self.stored_erasure_id,
        }


@dataclass(frozen=True, slots=True)
class RejectRow:
    reject_id: int
    reason: str
    detail: str
    topic: str
    partition: int
    offset: int
    dlq_topic: str
    dlq_partition: int
    dlq_offset: int
    batch_id: int
    rejected_at: datetime
    value_bytes: int | None
    erasure_id: int | None = None  # set when an erasure cleared the raw key, value, headers
    topic_id: str | None = None  # as ConflictRow's

    def to_json(self) -> dict[str, Any]:
        return {
            "reject_id": self.reject_id,
            "reason": self.reason,
            "detail": self.detail,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "dlq_topic": self.dlq_topic,
            "dlq_partition": self.dlq_partition,
            "dlq_offset": self.dlq_offset,
            "batch_id": self.batch_id,
            "rejected_at": self.rejected_at.isoformat(),
            "value_bytes": self.value_bytes,
            "erasure_id": self.erasure_id,
            "topic_id": self.topic_id,
        }


@dataclass(frozen=True, slots=True)
class RejectDetail:
    row: RejectRow
    raw_key: bytes | None
    raw_value: bytes | None
    headers: Any

    def to_json(self) -> dict[str, Any]:
        return {
            **self.row.to_json(),
            "raw_key_b64": _b64(self.raw_key),
            "raw_value_b64": _b64(self.raw_value),
            "headers": self.headers,
        }


_CONFLICT_COLUMNS = """
conflict_id, layer, event_id::text AS event_id, txn_id,
stored_event_id::text AS stored_event_id, stored_hash, incoming_hash, src_topic,
src_partition, src_offset, batch_id, detected_at, erasure_id
"""

_REJECT_COLUMNS = """
reject_id, reason, detail, src_topic, src_partition, src_offset, dlq_topic, dlq_partition,
dlq_offset, batch_id, rejected_at, octet_length(raw_value) AS value_bytes, erasure_id
"""

_STORED = """
SELECT event_id::text AS event_id, txn_id, type, agent_id, request_id, occurred_at,
       schema_version, payload::text AS payload, body_hash, src_topic, src_partition,
       src_offset, batch_id, ingested_at
FROM activity WHERE event_id = $1::uuid
"""

_TOMBSTONE = "SELECT erasure_id FROM erased_events WHERE event_id = $1::uuid"

# Migration 0016's column, read apart from the rows: workers are upgraded before
# `ackline migrate` runs (docs/schema.md), and an operator's commands must work between
# the two, where naming the column in the row's query would fail.
_INCARNATED = "SELECT to_regclass('public.rejects_source_key') IS NOT NULL"
_CONFLICT_TOPIC_IDS = """
SELECT conflict_id AS id, src_topic_id FROM conflicts WHERE conflict_id = ANY($1::bigint[])
"""
_REJECT_TOPIC_IDS = """
SELECT reject_id AS id, src_topic_id FROM rejects WHERE reject_id = ANY($1::bigint[])
"""


async def _topic_ids(
    conn: asyncpg.Connection, ids: Sequence[int], *, conflicts: bool
) -> dict[int, str]:
    """Each conflict's (or reject's) topic ID by its id; none where the database
    predates migration 0016."""
    if not ids or not await conn.fetchval(_INCARNATED):
        return {}
    if conflicts:
        rows = await conn.fetch(_CONFLICT_TOPIC_IDS, list(ids))
    else:
        rows = await conn.fetch(_REJECT_TOPIC_IDS, list(ids))
    return {int(r["id"]): str(r["src_topic_id"]) for r in rows}


async def list_conflicts(conn: asyncpg.Connection, group_id: str, limit: int) -> list[ConflictRow]:
    """The newest ``limit`` conflicts of ``group_id``."""
    rows = await conn.fetch(
        f"SELECT {_CONFLICT_COLUMNS} FROM conflicts WHERE group_id = $1 "
        "ORDER BY conflict_id DESC LIMIT $2",
        group_id,
        limit,
    )
    ids = await _topic_ids(conn, [r["conflict_id"] for r in rows], conflicts=True)
    return [_conflict(r, ids) for r in rows]


async def count_conflicts(conn: asyncpg.Connection, group_id: str) -> int:
    """How many conflicts ``group_id`` has (a list says when it shows fewer)."""
    return int(await conn.fetchval("SELECT count(*) FROM conflicts WHERE group_id = $1", group_id))


async def count_rejects(conn: asyncpg.Connection, group_id: str) -> int:
    """How many rejects ``group_id`` has (a list says when it shows fewer)."""
    return int(await conn.fetchval("SELECT count(*) FROM rejects WHERE group_id = $1", group_id))


async def get_conflict(conn: asyncpg.Connection, group_id: str, conflict_id: int) -> ConflictDetail:
    """One conflict with the incoming body and the stored activity row it clashed with."""
    row = await conn.fetchrow(
        f"SELECT {_CONFLICT_COLUMNS}, incoming_body::text AS incoming_body FROM conflicts "
        "WHERE group_id = $1 AND conflict_id = $2",
        group_id,
        conflict_id,
    )
    if row is None:
        raise NotFoundError(f"no conflict {conflict_id} for group {group_id}")
    ids = await _topic_ids(conn, [conflict_id], conflicts=True)
    stored = await conn.fetchrow(_STORED, row["stored_event_id"])
    # a stored row that is gone was erased (a tombstone says by which erasure) or dropped
    # by retention (no tombstone)
    gone_by = (
        None if stored is not None else await conn.fetchval(_TOMBSTONE, row["stored_event_id"])
    )
    return ConflictDetail(
        row=_conflict(row, ids),
        # NULL once erased (sinks/admin/erase.py): the keys and hashes stay
        incoming_body=None if row["incoming_body"] is None else json.loads(row["incoming_body"]),
        stored=None if stored is None else _stored(stored),
        stored_erasure_id=None if gone_by is None else int(gone_by),
    )


async def list_rejects(conn: asyncpg.Connection, group_id: str, limit: int) -> list[RejectRow]:
    """The newest ``limit`` rejects of ``group_id``."""
    rows = await conn.fetch(
        f"SELECT {_REJECT_COLUMNS} FROM rejects WHERE group_id = $1 "
        "ORDER BY reject_id DESC LIMIT $2",
        group_id,
        limit,
    )
    ids = await _topic_ids(conn, [r["reject_id"] for r in rows], conflicts=False)
    return [_reject(r, ids) for r in rows]


async def get_reject(conn: asyncpg.Connection, group_id: str, reject_id: int) -> RejectDetail:
    """One reject with its raw key, value and headers."""
    row = await conn.fetchrow(
        f"SELECT {_REJECT_COLUMNS}, raw_key, raw_value, headers::text AS headers FROM rejects "
        "WHERE group_id = $1 AND reject_id = $2",
        group_id,
        reject_id,
    )
    if row is None:
        raise NotFoundError(f"no reject {reject_id} for group {group_id}")
    ids = await _topic_ids(conn, [reject_id], conflicts=False)
    return RejectDetail(
        row=_reject(row, ids),
        raw_key=_bytes(row["raw_key"]),
        raw_value=_bytes(row["raw_value"]),
        headers=json.loads(row["headers"]),
    )


def _conflict(r: asyncpg.Record, topic_ids: dict[int, str]) -> ConflictRow:
    return ConflictRow(
        conflict_id=int(r["conflict_id"]),
        layer=str(r["layer"]),
        event_id=str(r["event_id"]),
        txn_id=str(r["txn_id"]),
        stored_event_id=str(r["stored_event_id"]),
        stored_hash=bytes(r["stored_hash"]),
        incoming_hash=bytes(r["incoming_hash"]),
        topic=str(r["src_topic"]),
        partition=int(r["src_partition"]),
        offset=int(r["src_offset"]),
        batch_id=int(r["batch_id"]),
        detected_at=r["detected_at"],
        erasure_id=None if r["erasure_id"] is None else int(r["erasure_id"]),
        topic_id=topic_ids.get(int(r["conflict_id"])),
    )


def _reject(r: asyncpg.Record, topic_ids: dict[int, str]) -> RejectRow:
    return RejectRow(
        reject_id=int(r["reject_id"]),
        reason=str(r["reason"]),
        detail=str(r["detail"]),
        topic=str(r["src_topic"]),
        partition=int(r["src_partition"]),
        offset=int(r["src_offset"]),
        dlq_topic=str(r["dlq_topic"]),
        dlq_partition=int(r["dlq_partition"]),
        dlq_offset=int(r["dlq_offset"]),
        batch_id=int(r["batch_id"]),
        rejected_at=r["rejected_at"],
        value_bytes=None if r["value_bytes"] is None else int(r["value_bytes"]),
        erasure_id=None if r["erasure_id"] is None else int(r["erasure_id"]),
        topic_id=topic_ids.get(int(r["reject_id"])),
    )


def _stored(r: asyncpg.Record) -> dict[str, Any]:
    return {
        "event_id": r["event_id"],
        "txn_id": r["txn_id"],
        "type": r["type"],
        "agent_id": r["agent_id"],
        "request_id": r["request_id"],
        "occurred_at": r["occurred_at"].isoformat(),
        "schema_version": r["schema_version"],
        "payload": json.loads(r["payload"]),
        "body_hash": bytes(r["body_hash"]).hex(),
        "topic": r["src_topic"],
        "partition": r["src_partition"],
        "offset": r["src_offset"],
        "batch_id": r["batch_id"],
        "ingested_at": r["ingested_at"].isoformat(),
    }


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _b64(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode()
