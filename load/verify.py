"""Compare a load manifest with what landed in PostgreSQL: exactly once, or not.

The expected outcome is derived from the manifest alone (:func:`expected_outcome`, pure):
replay the committed records in (partition, offset) order through the sink's dedup rules
(:mod:`ackline.sinks.ingest.classify`): a txn_id seen before makes a duplicate (equal
body hash) or a ledger conflict; else an event_id seen before makes a duplicate or a
primary-key conflict; else the record is a *winner*, the one activity row its event must
have. Poison must be rejected with the manifest's reason. Records of aborted transactions
count as produced and must leave no trace at all.

The database side (:func:`verify`) is set-based: the winners and every id of the run
are COPYed into temporary tables and compared with a handful of queries.

Retention and erasure (docs/retention.md) take activity rows away on purpose: a winner
counts as ingested when its key is in ``event_keys`` with its body hash and its row is
there, or was erased (a tombstone in ``erased_events`` with that hash), or went with a
partition retention dropped (its batch committed on that partition's days, before the
drop: ``retention_drops.snap``). Such winners are reported apart (``erased``,
``dropped_by_retention``); any other missing row is lost.

Why this module is longer than the house's ~500 lines: the expected outcome (pure)
and the set-based database check are two halves of one comparison that must agree
field for field; kept together so a rule changed in one is seen changed in the other.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import asyncpg

from ackline.load.errors import LoadError
from ackline.load.manifest import ManifestRecord, read_manifest

_DUPLICATE_KINDS = frozenset({"redelivery", "retry"})
_EXPECTED_LAYER = {"conflict_ledger": "ledger", "conflict_pk": "primary_key"}


# --- the expected outcome (pure) --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Winner:
    event_id: str
    txn_id: str
    body_hash: str
    partition: int
    offset: int


@dataclass
class Expected:
    """What the sink must make of a manifest."""

    produced: int = 0
    committed: int = 0
    aborted: int = 0
    winners: dict[str, Winner] = field(default_factory=dict)
    """event_id -> the record whose activity row must exist."""
    duplicates: Counter[str] = field(default_factory=Counter)
    """Committed records to be dropped as duplicates, by layer (ledger, primary_key)."""
    conflicts: dict[tuple[int, int], str] = field(default_factory=dict)
    """(partition, offset) -> layer of every committed record to be quarantined."""
    rejects: dict[tuple[int, int], str] = field(default_factory=dict)
    """(partition, offset) -> decode reason of every committed poison record."""
    max_offsets: dict[int, int] = field(default_factory=dict)
    """partition -> the largest offset of a committed record."""
    duplicate_at: set[tuple[int, int]] = field(default_factory=set)
    """(partition, offset) of every committed record to be dropped as a duplicate."""
    coords: set[tuple[int, int]] = field(default_factory=set)
    """(partition, offset) of every record of the manifest the broker placed (aborted too)."""
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    """partition -> (first, last) offset of the manifest's records on it (aborted too)."""
    event_ids: set[str] = field(default_factory=set)
    """Every event_id of the run (committed or not)."""
    txn_ids: set[str] = field(default_factory=set)
    """Every txn_id of the run (committed or not)."""
    inconsistent: int = 0
    """Committed records whose fate disagrees with their declared kind (a plan bug)."""

    @property
    def unique_expected(self) -> int:
        return len(self.winners)

    @property
    def duplicates_expected(self) -> int:
        return sum(self.duplicates.values())

    @property
    def conflicts_expected(self) -> int:
        return len(self.conflicts)

    @property
    def rejects_expected(self) -> int:
        return len(self.rejects)


def expected_outcome(records: Iterable[ManifestRecord]) -> Expected:
    """Replay the committed records through the dedup rules; first committed copy wins.

    All copies of an event share a key, hence a partition, so (partition, offset) order
    is the order the sink sees them in. Aborted records are counted and ignored.
    """
    out = Expected()
    committed: list[ManifestRecord] = []
    for rec in records:
        out.produced += 1
        if rec.offset >= 0 and rec.partition >= 0:
            out.coords.add((rec.partition, rec.offset))
            first, last = out.spans.get(rec.partition, (rec.offset, rec.offset))
            out.spans[rec.partition] = (min(first, rec.offset), max(last, rec.offset))
        if rec.event_id is not None:
            out.event_ids.add(rec.event_id)
        if rec.txn_id is not None:
            out.txn_ids.add(rec.txn_id)
        if not rec.committed:
            out.aborted += 1
            continue
        if rec.offset < 0 or rec.partition < 0:
            raise LoadError(f"manifest record seq {rec.seq} is committed but has no offset")
        committed.append(rec)
    committed.sort(key=lambda r: (r.partition, r.offset))
    out.committed = len(committed)
    ledger: dict[str, str] = {}  # txn_id -> body hash
    activity: dict[str, str] = {}  # event_id -> body hash
    for rec in committed:
        where = (rec.partition, rec.offset)
        out.max_offsets[rec.partition] = max(out.max_offsets.get(rec.partition, -1), rec.offset)
        if rec.poison is not None or rec.kind == "poison":
            out.rejects[where] = rec.poison or "?"
            out.inconsistent += rec.kind != "poison"
            continue
        if rec.event_id is None or rec.txn_id is None or rec.body_hash is None:
            raise LoadError(f"manifest record seq {rec.seq} lacks event_id, txn_id or hash")
        stored = ledger.get(rec.txn_id)
        layer = "ledger"
        if stored is None:
            stored, layer = activity.get(rec.event_id), "primary_key"
        if stored is None:
            ledger[rec.txn_id] = activity[rec.event_id] = rec.body_hash
            out.winners[rec.event_id] = Winner(
                rec.event_id, rec.txn_id, rec.body_hash, rec.partition, rec.offset
            )
            out.inconsistent += rec.kind != "original"
        elif stored == rec.body_hash:
            out.duplicates[layer] += 1
            out.duplicate_at.add(where)
            out.inconsistent += rec.kind not in _DUPLICATE_KINDS
        else:
            out.conflicts[where] = layer
            out.inconsistent += _EXPECTED_LAYER.get(rec.kind) != layer
    return out


def is_drained(max_offsets: Mapping[int, int], next_offsets: Mapping[int, int | None]) -> bool:
    """True when every partition's next_offset is past its last committed record."""
    for partition, last in max_offsets.items():
        nxt = next_offsets.get(partition)
        if nxt is None or nxt <= last:
            return False
    return True


# --- the verdict ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LossWindow:
    """When a run of lost winners on ``partition`` was lost (ackline.load.losses): from
    the first commit (``since``) to the last (``until``) of the batches before, over and
    after it on that partition, ISO 8601; "" when there is none. The chaos harness prints
    what the workers logged then."""

    partition: int
    since: str
    until: str


@dataclass(frozen=True)
class Verdict:
    run_id: str
    topic: str
    group_id: str
    produced: int
    aborted: int
    unique_expected: int
    ingested: int
    lost: int
    duplicated: int
    duplicates_expected: int
    duplicates_dropped: int
    conflicts_expected: int
    conflicts_quarantined: int
    conflicts_unexpected: int
    conflict_layer_mismatch: int
    rejects_expected: int
    rejected: int
    rejects_unexpected: int
    reject_reason_mismatch: int
    drained: bool
    plan_inconsistent: int = 0
    """Manifest records whose declared kind disagrees with the replay (informational)."""
    beyond_rows: int = 0
    """Activity rows of the topic at no coordinate of this manifest (other runs; not
    counted against it, reported)."""
    beyond_conflicts: int = 0
    """Conflicts of the group on the topic at no coordinate of this manifest (reported)."""
    beyond_rejects: int = 0
    """Rejects of the group on the topic at no coordinate of this manifest (reported)."""
    shared_duplicates: int = 0
    """Expected duplicates that sit in batches which also read records outside this
    manifest: batches count duplicates per batch, so these cannot be attributed and are
    left out of both ``duplicates_expected`` and ``duplicates_dropped`` (reported)."""
    erased: int = 0
    """Ingested winners whose row an erasure removed (a tombstone holds their key)."""
    dropped_by_retention: int = 0
    """Ingested winners whose row went with a partition retention dropped."""
    lost_at: tuple[str, ...] = ()
    """Where the lost winners were, and the batches around them (ackline.load.losses)."""
    lost_windows: tuple[LossWindow, ...] = ()
    """When each run described in ``lost_at`` was skipped."""

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicated == 0
            and self.ingested == self.unique_expected
            and self.conflicts_quarantined == self.conflicts_expected
            and self.conflicts_unexpected == 0
            and self.conflict_layer_mismatch == 0
            and self.rejected == self.rejects_expected
            and self.rejects_unexpected == 0
            and self.reject_reason_mismatch == 0
            and self.duplicates_dropped == self.duplicates_expected
        )

    def to_json(self) -> dict[str, Any]:
        """One JSON-ready object: every count, ``drained`` and ``ok``."""
        return {**asdict(self), "ok": self.ok}


_ROWS: tuple[tuple[str, str, str | None], ...] = (
    # (label, actual field, expected field)
    ("unique events ingested", "ingested", "unique_expected"),
    ("duplicates dropped", "duplicates_dropped", "duplicates_expected"),
    ("conflicts quarantined", "conflicts_quarantined", "conflicts_expected"),
    ("rejects (poison)", "rejected", "rejects_expected"),
    ("lost", "lost", None),
    ("duplicated", "duplicated", None),
    ("unexpected conflicts", "conflicts_unexpected", None),
    ("conflict layer mismatch", "conflict_layer_mismatch", None),
    ("unexpected rejects", "rejects_unexpected", None),
    ("reject reason mismatch", "reject_reason_mismatch", None),
)


def render_summary(verdict: Verdict) -> str:
    """A small aligned table of expected against actual, and the verdict."""
    data = asdict(verdict)
    lines = [
        f"run {verdict.run_id}  topic {verdict.topic}  group {verdict.group_id}",
        f"records produced {verdict.produced:,} "
        f"({verdict.aborted:,} in aborted transactions, which must leave no trace)",
        f"{'':<26}{'expected':>12}{'actual':>12}",
    ]
    for label, actual_name, expected_name in _ROWS:
        actual = int(data[actual_name])
        expected = int(data[expected_name]) if expected_name else 0
        mark = "ok" if actual == expected else "MISMATCH"
        lines.append(f"{label:<26}{expected:>12,}{actual:>12,}  {mark}")
    lines.append(f"{'consumer drained':<26}{'yes':>12}{'yes' if verdict.drained else 'no':>12}")
    if verdict.erased or verdict.dropped_by_retention:
        lines.append(
            f"of the ingested: {verdict.erased:,} erased, "
            f"{verdict.dropped_by_retention:,} dropped by retention (their keys kept)"
        )
    if verdict.plan_inconsistent:
        lines.append(f"note: {verdict.plan_inconsistent} manifest records had a mislabeled kind")
    beyond = (verdict.beyond_rows, verdict.beyond_conflicts, verdict.beyond_rejects)
    if any(beyond):
        lines.append(
            f"note: {verdict.topic} also holds {beyond[0]:,} rows, {beyond[1]:,} conflicts and "
            f"{beyond[2]:,} rejects that this manifest does not list (other runs on the topic); "
            "not counted in this verdict"
        )
    if verdict.shared_duplicates:
        lines.append(
            f"note: {verdict.shared_duplicates:,} expected duplicates sit in batches shared "
            "with records outside this manifest; left out of the duplicate counts"
        )
    lines.extend(verdict.lost_at)
    lines.append(
        "verdict: OK, exactly once" if verdict.ok else "verdict: FAILED (see MISMATCH rows)"
    )
    return "\n".join(lines)


def print_summary(verdict: Verdict, file: TextIO | None = None) -> None:
    print(render_summary(verdict), file=file or sys.stdout, flush=True)


# --- the database side ------------------------------------------------------------------

_TEMP = """
CREATE TEMP TABLE load_winner (
    event_id uuid PRIMARY KEY, body_hash bytea NOT NULL,
    src_partition integer NOT NULL, src_offset bigint NOT NULL
) ON COMMIT DROP;
CREATE TEMP TABLE load_event (event_id uuid PRIMARY KEY) ON COMMIT DROP;
CREATE TEMP TABLE load_txn (txn_id text PRIMARY KEY) ON COMMIT DROP;
CREATE TEMP TABLE load_coord (
    src_partition integer NOT NULL, src_offset bigint NOT NULL,
    PRIMARY KEY (src_partition, src_offset)
) ON COMMIT DROP;
"""

# Per winner: its row is there; else it was erased; else its key is stored and its batch's
# rows went with a partition that retention dropped after the batch committed. (Joins on
# event_id with the hash compared after: the planner cannot estimate both columns at once,
# and anti-joins planned on such estimates went quadratic on 100k winners.) The retention
# check runs only for a winner neither present nor erased (CASE evaluates lazily).
FATE = """
WITH stored AS (
    SELECT DISTINCT a.event_id, a.body_hash FROM activity a
    JOIN load_winner w ON w.event_id = a.event_id
), f AS (
    SELECT w.event_id, w.src_partition, w.src_offset,
           s.event_id IS NOT NULL AS present,
           e.body_hash IS NOT NULL AND e.body_hash = w.body_hash AS erased,
           CASE WHEN k.body_hash = w.body_hash THEN k.batch_id END AS batch_id
    FROM load_winner w
    LEFT JOIN stored s ON s.event_id = w.event_id AND s.body_hash = w.body_hash
    LEFT JOIN erased_events e ON e.event_id = w.event_id
    LEFT JOIN event_keys k ON k.event_id = w.event_id
), c AS (
    SELECT f.*,
           CASE WHEN f.present OR f.erased OR f.batch_id IS NULL THEN false
                ELSE EXISTS (
                    SELECT 1 FROM ingest_batches b, retention_drops d
                    WHERE b.batch_id = f.batch_id
                      AND pg_visible_in_snapshot(b.commit_xid, d.snap)
                      AND b.committed_at < d.ends_before
                      AND b.committed_at >= (d.lower_day::timestamp AT TIME ZONE 'UTC'))
           END AS dropped
    FROM f
)
"""
"""Each winner's fate (the CTE ``c``): present, erased, dropped by retention, or none
(lost); ``batch_id`` is the batch that stored its key, if any."""

_INGESTED = (
    FATE
    + """
SELECT count(*) FILTER (WHERE present) AS present,
       count(*) FILTER (WHERE NOT present AND erased) AS erased,
       count(*) FILTER (WHERE dropped) AS dropped
FROM c
"""
)

# Rows of this run that are not exactly a winner: any row read from one of the
# manifest's coordinates on the topic, or carrying one of the run's event_ids or
# txn_ids, whose (event_id, hash, coordinates) is not a winner's. Rows of other runs on
# the same topic are not this manifest's business (_BEYOND counts them).
_DUPLICATED = """
WITH candidates AS (
    SELECT a.event_id FROM activity a
    JOIN load_coord c ON c.src_partition = a.src_partition AND c.src_offset = a.src_offset
    WHERE a.src_topic = $1
    UNION
    SELECT a.event_id FROM activity a JOIN load_event e ON e.event_id = a.event_id
    UNION
    SELECT a.event_id FROM activity a JOIN load_txn t ON t.txn_id = a.txn_id
)
SELECT count(*) FROM candidates c
JOIN activity a ON a.event_id = c.event_id
LEFT JOIN load_winner w
    ON w.event_id = a.event_id AND w.body_hash = a.body_hash
   AND w.src_partition = a.src_partition AND w.src_offset = a.src_offset
   AND a.src_topic = $1
WHERE w.event_id IS NULL
"""

_BEYOND = """
SELECT count(*) FROM activity a
WHERE a.src_topic = $1
  AND NOT EXISTS (SELECT 1 FROM load_coord c
                  WHERE c.src_partition = a.src_partition AND c.src_offset = a.src_offset)
"""

_CONFLICTS = """
SELECT src_partition, src_offset, layer FROM conflicts
WHERE group_id = $1 AND src_topic = $2
"""

_REJECTS = """
SELECT src_partition, src_offset, reason FROM rejects
WHERE group_id = $1 AND src_topic = $2
"""

# Every batch of the group that read the topic: its ranges and duplicates.
_BATCHES = """
SELECT b.ranges::text AS ranges, (b.duplicates_ledger + b.duplicates_pk)::bigint AS dropped
FROM ingest_batches b
WHERE b.group_id = $1
  AND EXISTS (SELECT 1 FROM jsonb_object_keys(b.ranges) AS k(name)
              WHERE left(k.name, length($2) + 1) = $2 || ':')
"""

_OFFSETS = """
SELECT partition, next_offset FROM consumer_offsets WHERE group_id = $1 AND topic = $2
"""


async def _connect(dsn: str, timeout: float = 10.0) -> asyncpg.Connection:
    try:
        return await asyncpg.connect(dsn, timeout=timeout)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        where = urlsplit(dsn).netloc.rpartition("@")[2] or "the default host"
        # a TimeoutError's text is empty: "at host:  (check ...)" said nothing
        why = "no answer in time" if isinstance(exc, TimeoutError) else str(exc) or repr(exc)
        raise LoadError(
            f"cannot connect to PostgreSQL at {where}: {why} (check ACKLINE_DATABASE_URL)"
        ) from exc


async def _next_offsets(conn: asyncpg.Connection, group_id: str, topic: str) -> dict[int, Any]:
    rows = await conn.fetch(_OFFSETS, group_id, topic)
    return {int(r["partition"]): r["next_offset"] for r in rows}


async def verify(
    dsn: str, manifest_path: Path, group_id: str, connect_timeout: float = 10.0
) -> Verdict:
    """Check the database against the manifest for ``group_id`` (see the module doc),
    connecting within ``connect_timeout`` (ACKLINE_DB_CONNECT_TIMEOUT_S)."""
    manifest = read_manifest(Path(manifest_path))
    topic = manifest.header.topic
    exp = expected_outcome(manifest.records)
    conn = await _connect(dsn, connect_timeout)
    try:
        async with conn.transaction(isolation="repeatable_read"):
            return await _compare(conn, manifest.header.run_id, topic, group_id, exp)
    except asyncpg.UndefinedTableError as exc:  # as every other command says it
        raise LoadError(
            f"verify failed on PostgreSQL: {exc}: the database is not migrated (run "
            "`ackline migrate`)"
        ) from exc
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise LoadError(f"verify failed on PostgreSQL: {exc}") from exc
    finally:
        await conn.close()


async def _compare(
    conn: asyncpg.Connection, run_id: str, topic: str, group_id: str, exp: Expected
) -> Verdict:
    await conn.execute(_TEMP)
    await conn.copy_records_to_table(
        "load_winner",
        records=[
            (uuid.UUID(w.event_id), bytes.fromhex(w.body_hash), w.partition, w.offset)
            for w in exp.winners.values()
        ],
    )
    await conn.copy_records_to_table("load_event", records=[(uuid.UUID(e),) for e in exp.event_ids])
    await conn.copy_records_to_table("load_txn", records=[(t,) for t in exp.txn_ids])
    await conn.copy_records_to_table("load_coord", records=sorted(exp.coords))
    await conn.execute(
        "ANALYZE load_winner; ANALYZE load_event; ANALYZE load_txn; ANALYZE load_coord"
    )
    found = await conn.fetchrow(_INGESTED)
    if found is None:  # one row always
        raise LoadError("verify read no counts")
    erased, by_retention = int(found["erased"]), int(found["dropped"])
    ingested = int(found["present"]) + erased + by_retention
    duplicated = int(await conn.fetchval(_DUPLICATED, topic))
    beyond_rows = int(await conn.fetchval(_BEYOND, topic))

    quarantined = unexpected_conflicts = layer_mismatch = beyond_conflicts = 0
    for row in await conn.fetch(_CONFLICTS, group_id, topic):
        where = (int(row["src_partition"]), int(row["src_offset"]))
        layer = exp.conflicts.get(where)
        if where not in exp.coords:
            beyond_conflicts += 1
        elif layer is None:
            unexpected_conflicts += 1
        else:
            quarantined += 1
            layer_mismatch += layer != row["layer"]

    rejected = unexpected_rejects = reason_mismatch = beyond_rejects = 0
    for row in await conn.fetch(_REJECTS, group_id, topic):
        where = (int(row["src_partition"]), int(row["src_offset"]))
        reason = exp.rejects.get(where)
        if where not in exp.coords:
            beyond_rejects += 1
        elif reason is None:
            unexpected_rejects += 1
        else:
            rejected += 1
            reason_mismatch += reason != row["reason"]

    rows = await conn.fetch(_BATCHES, group_id, topic)
    batches = [(json.loads(r["ranges"]), int(r["dropped"])) for r in rows]
    dropped, shared = attribute_duplicates(batches, topic, exp)
    drained = is_drained(exp.max_offsets, await _next_offsets(conn, group_id, topic))
    lost = exp.unique_expected - ingested
    lost_at: tuple[str, ...] = ()
    lost_windows: tuple[LossWindow, ...] = ()
    if lost > 0:
        from ackline.load.losses import explain_losses  # it builds on this module

        lost_at, lost_windows = await explain_losses(conn, exp, topic, group_id)
    return Verdict(
        run_id=run_id,
        topic=topic,
        group_id=group_id,
        produced=exp.produced,
        aborted=exp.aborted,
        unique_expected=exp.unique_expected,
        ingested=ingested,
        lost=lost,
        duplicated=duplicated,
        duplicates_expected=exp.duplicates_expected - shared,
        duplicates_dropped=dropped,
        conflicts_expected=exp.conflicts_expected,
        conflicts_quarantined=quarantined,
        conflicts_unexpected=unexpected_conflicts,
        conflict_layer_mismatch=layer_mismatch,
        rejects_expected=exp.rejects_expected,
        rejected=rejected,
        rejects_unexpected=unexpected_rejects,
        reject_reason_mismatch=reason_mismatch,
        drained=drained,
        plan_inconsistent=exp.inconsistent,
        beyond_rows=beyond_rows,
        beyond_conflicts=beyond_conflicts,
        beyond_rejects=beyond_rejects,
        shared_duplicates=shared,
        erased=erased,
        dropped_by_retention=by_retention,
        lost_at=lost_at,
        lost_windows=lost_windows,
    )


BatchRanges = Mapping[str, Sequence[int]]
"""A batch's ``ranges`` column: ``"topic:partition" -> [first_offset, next_offset]``."""


def attribute_duplicates(
    batches: Iterable[tuple[BatchRanges, int]], topic: str, exp: Expected
) -> tuple[int, int]:
    """(duplicates dropped by this manifest's batches, expected duplicates that cannot be
    attributed). Pure.

    A batch counts its duplicates as one number. A batch whose every range lies inside
    the manifest's span on its partition is this manifest's: its count is taken. A batch
    with no range inside is another run's: ignored. A batch that straddles (a worker
    read the end of one run and the start of the next together) cannot be split: its
    count is left out, and so are the expected duplicates at offsets it covers.
    """
    dropped = 0
    straddling: dict[int, list[tuple[int, int]]] = {}
    for ranges, count in batches:
        kinds: set[str] = set()
        ours: list[tuple[int, int, int]] = []
        for name, bounds in ranges.items():
            range_topic, _, part = name.rpartition(":")
            partition, first, end = int(part), int(bounds[0]), int(bounds[1])
            span = exp.spans.get(partition) if range_topic == topic else None
            if span is None or end - 1 < span[0] or first > span[1]:
                kinds.add("outside")
            else:
                kinds.add("inside" if span[0] <= first and end - 1 <= span[1] else "overlap")
                ours.append((partition, first, end))
        if kinds == {"inside"}:
            dropped += count
        elif ours:
            for partition, first, end in ours:
                straddling.setdefault(partition, []).append((first, end))
    shared = sum(
        1
        for p, off in exp.duplicate_at
        if any(first <= off < end for first, end in straddling.get(p, ()))
    )
    return dropped, shared


async def drained(dsn: str, manifest_path: Path, group_id: str) -> bool:
    """True when ``group_id`` has committed past every committed record of the manifest."""
    manifest = read_manifest(Path(manifest_path))
    exp = expected_outcome(manifest.records)
    conn = await _connect(dsn)
    try:
        return is_drained(
            exp.max_offsets, await _next_offsets(conn, group_id, manifest.header.topic)
        )
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise LoadError(f"cannot read consumer offsets: {exc}") from exc
    finally:
        await conn.close()


async def wait_drained(
    dsn: str, manifest_path: Path, group_id: str, timeout: float = 120.0, interval: float = 0.5
) -> bool:
    """Poll until :func:`drained` (reading the manifest once); False on timeout."""
    manifest = read_manifest(Path(manifest_path))
    max_offsets = expected_outcome(manifest.records).max_offsets
    deadline = time.monotonic() + timeout
    conn = await _connect(dsn)
    try:
        while True:
            offsets = await _next_offsets(conn, group_id, manifest.header.topic)
            if is_drained(max_offsets, offsets):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(interval)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise LoadError(f"cannot read consumer offsets: {exc}") from exc
    finally:
        await conn.close()
