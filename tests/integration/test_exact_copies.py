"""Exact copies: a replay skips decoding what the ledger vouches for, and judges the rest.

Real broker, worker and database. A worker ingests a run of events, then meets them again
(as an SDK retry sends them: the same bytes but a new event_id), and, once it is
replaying, records of the same canonical shape that the ledger does not vouch for: a
changed body, a new event, and poison whose txn_id is stored or not. The duplicates must
be written undecoded (``ackline_exact_copies_total``) and every other record judged
exactly as a decoding worker judges it (docs/design.md, "Exact copies").
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest

from ackline.core.faults import DISARMED, Faults
from ackline.schemas import hash_envelope
from ackline.schemas.decode import DEFAULT_LIMITS, Rejection, Row, decode
from ackline.schemas.exact import exact_form
from ackline.sinks.connection import Database
from ackline.sinks.errors import RepeatRejectedError
from ackline.sinks.ingest.batch import Batch, Coord, Incoming, PartitionRange, Repeat
from ackline.sinks.ingest.offsets import claim
from ackline.sinks.ingest.writer import BatchWriter
from ackline.streams.producer import ActivityProducer, serialize
from tests.integration.harness import Services, Worker, db, wait_until
from tests.integration.test_ingest_cases import step

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
RUN = 120
HEAD = 20  # the duplicates sent first (one batch: the worker's batch_max_events)


def mistyped(i: int, eid: uuid.UUID | None = None) -> bytes:
    """Step ``i``'s canonical bytes with the step a string: the exact shape, schema_invalid."""
    value = serialize(step(i, eid=eid))
    bad = value.replace(f'"step":{i},'.encode(), b'"step":"x",', 1)
    assert bad != value and exact_form(bad, DEFAULT_LIMITS) is not None
    assert isinstance(decode(bad), Rejection)
    return bad


def test_a_replay_writes_exact_copies_undecoded_and_judges_the_rest(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    first = [step(i) for i in range(RUN)]
    changed = step(5, thought="changed", eid=uuid.uuid4())  # stored txn_id, another body
    new = step(RUN + 1)  # never stored
    poison_stored = mistyped(7, eid=uuid.uuid4())  # stored txn_id, schema_invalid
    poison_new = mistyped(RUN + 2)  # no such txn_id, schema_invalid
    producer = ActivityProducer(services.bootstrap, topic, transactional_id=f"tx-{topic}")
    producer.start()
    with producer.transaction():
        for env in first:
            producer.send(env)
    worker = Worker(services, dsn, topic, tmp_path, batch_max_events=HEAD)
    try:
        wait_until(
            lambda: (
                worker.ensure_alive()
                or db(dsn, "SELECT count(*) AS n FROM activity")[0]["n"] == RUN
            ),
            90,
            "the first run",
        )
        again = [env.model_copy(update={"event_id": uuid.uuid4()}) for env in first]
        with producer.transaction():  # the events again, as a retry sends them: new ids
            for env in again[:HEAD]:
                producer.send(env)

        def replaying() -> bool:  # the slot saw a batch of duplicates: it now looks first
            worker.ensure_alive()
            rows = db(dsn, "SELECT coalesce(sum(duplicates_ledger), 0) AS n FROM ingest_batches")
            return int(rows[0]["n"]) == HEAD

        wait_until(replaying, 90, "the first duplicates")
        with producer.transaction():
            for env in again[HEAD:]:
                producer.send(env)
            producer.send(changed)
            producer.send(new)
            producer.send_bytes(b"agent-1", poison_stored, [])
            producer.send_bytes(b"agent-1", poison_new, [])
        producer.close()

        def judged() -> bool:
            worker.ensure_alive()
            done = db(dsn, "SELECT count(*) AS n FROM rejects")[0]["n"] == 2
            return done and db(dsn, "SELECT count(*) AS n FROM conflicts")[0]["n"] == 1

        wait_until(judged, 90, "the replay to be judged")
        exact = worker.metric("ackline_exact_copies_total")
    finally:
        assert worker.stop() == 0, worker.log()[-3000:]

    rows = db(dsn, "SELECT event_id, body_hash FROM activity")
    assert {r["event_id"]: bytes(r["body_hash"]) for r in rows} == {
        e.event_id: hash_envelope(e) for e in [*first, new]
    }
    conflict = db(dsn, "SELECT layer, event_id, incoming_hash FROM conflicts")[0]
    assert (conflict["layer"], conflict["event_id"]) == ("ledger", changed.event_id)
    assert bytes(conflict["incoming_hash"]) == hash_envelope(changed)
    rejects = db(dsn, "SELECT reason, raw_value FROM rejects ORDER BY src_offset")
    assert [(r["reason"], bytes(r["raw_value"])) for r in rejects] == [
        ("schema_invalid", poison_stored),
        ("schema_invalid", poison_new),
    ]
    totals = db(
        dsn,
        "SELECT sum(inserted) AS ins, sum(duplicates_ledger) AS dl, sum(duplicates_pk) AS dp "
        "FROM ingest_batches",
    )[0]
    assert (totals["ins"], totals["dl"], totals["dp"]) == (RUN + 1, RUN, 0)
    # the first duplicates were decoded (they told the slot a replay began); none after
    # (the head may have come in two batches, the second of them looked at first)
    assert RUN - HEAD <= exact < RUN, worker.log()[-3000:]
    # the poison went to the writer undecoded, was sent back and decoded when read again
    assert "reading it again" in worker.log()


# --- the writer alone: what it does with an exact copy the ledger no longer vouches for ---

GROUP = "g"
TOPIC = "t"


def _row(i: int, thought: str = "x") -> tuple[Row, bytes]:
    value = serialize(step(i, thought, eid=uuid.UUID(int=i)))
    row = decode(value)
    assert isinstance(row, Row)
    return row, value


def _repeat(offset: int, i: int, at: int, thought: str = "x") -> Repeat:
    row, value = _row(i, thought)
    return Repeat(Coord(TOPIC, 0, offset), row.txn_id, row.body_hash, value, at)


def _with_writer(
    dsn: str, body: Callable[[BatchWriter, int], Awaitable[None]], faults: Faults = DISARMED
) -> None:
    """Run ``body`` with a writer of partition 0, claimed (its epoch)."""

    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            epoch = (await claim(conn, GROUP, "w", [(TOPIC, 0)]))[0].epoch
        finally:
            await conn.close()
        database = Database(dsn)
        try:
            await body(BatchWriter(database, GROUP, "w", faults), epoch)
        finally:
            await database.close()

    asyncio.run(go())


def test_an_exact_copy_the_ledger_lost_is_decoded_in_its_place(dsn: str) -> None:
    """A repeat whose ledger row is gone (a failover lost it since the consumer looked) is
    decoded and inserted; one whose row stores another body is a conflict; the order of
    the batch holds (the first of two copies of one txn_id is the one inserted)."""

    async def go(writer: BatchWriter, epoch: int) -> None:
        stored, _ = _row(1)
        first = Batch(
            ranges=(PartitionRange(TOPIC, 0, 0, 1, epoch),),
            events=[Incoming(Coord(TOPIC, 0, 0), stored)],
        )
        await writer.write(first)
        lost_a, _ = _row(2)
        batch = Batch(
            ranges=(PartitionRange(TOPIC, 0, 1, 6, epoch),),
            events=[Incoming(Coord(TOPIC, 0, 2), lost_a)],
            repeats=[
                _repeat(1, 1, 0),  # vouched: a duplicate
                _repeat(3, 3, 1),  # lost: decoded, inserted
                _repeat(4, 1, 1, thought="changed"),  # another body: a conflict
                _repeat(5, 3, 1),  # the same as offset 3: a duplicate of it
            ],
        )
        result = await writer.write(batch)
        assert (result.inserted, result.duplicates, result.exact) == (
            2,
            {"ledger": 2, "primary_key": 0},
            1,
        )
        assert result.conflicts == {"ledger": 1, "primary_key": 0}

    _with_writer(dsn, go)
    rows = db(dsn, "SELECT src_offset FROM activity ORDER BY src_offset")
    assert [r["src_offset"] for r in rows] == [0, 2, 3]


def test_poison_written_undecoded_rolls_the_batch_back(dsn: str) -> None:
    """Poison in the canonical shape, not vouched for: nothing of the batch is written (its
    dead letter must go first), and the error names the record for the consumer."""

    async def go(writer: BatchWriter, epoch: int) -> None:
        row, value = _row(9)
        good = Repeat(Coord(TOPIC, 0, 0), row.txn_id, row.body_hash, value, 0)
        bad = Repeat(Coord(TOPIC, 0, 1), row.txn_id, row.body_hash, b"{}", 0)
        batch = Batch(ranges=(PartitionRange(TOPIC, 0, 0, 2, epoch),), repeats=[good, bad])
        with pytest.raises(RepeatRejectedError, match=r"t\[0\]@1") as raised:
            await writer.write(batch)
        assert raised.value.coords == [(TOPIC, 0, 1)]

    _with_writer(dsn, go)
    assert db(dsn, "SELECT count(*) AS n FROM ingest_batches")[0]["n"] == 0
    assert db(dsn, "SELECT count(*) AS n FROM activity")[0]["n"] == 0


@pytest.mark.parametrize("point", ["during_commit", "commit_reply_lost"])
def test_a_batch_of_repeats_whose_commit_is_uncertain_counts_once(dsn: str, point: str) -> None:
    """The batch is changed by its first attempt (a repeat decoded into its events); the
    retry (COMMIT lost) or the reconcile (its reply lost) must agree with what committed."""

    async def store(writer: BatchWriter, epoch: int) -> None:
        stored, _ = _row(1)
        events = [Incoming(Coord(TOPIC, 0, 0), stored)]
        await writer.write(Batch(ranges=(PartitionRange(TOPIC, 0, 0, 1, epoch),), events=events))

    async def go(writer: BatchWriter, epoch: int) -> None:
        batch = Batch(
            ranges=(PartitionRange(TOPIC, 0, 1, 3, epoch),),
            repeats=[_repeat(1, 1, 0), _repeat(2, 2, 0)],  # vouched; not stored
        )
        result = await writer.write(batch)
        assert writer.retries["commit_uncertain"] == 1
        assert (result.events, result.inserted, result.exact) == (2, 1, 1)
        assert result.duplicates == {"ledger": 1, "primary_key": 0}

    _with_writer(dsn, store)
    _with_writer(dsn, go, Faults(f"{point}=fail"))  # claimed again: a new epoch
    rows = db(dsn, "SELECT src_offset FROM activity ORDER BY src_offset")
    assert [r["src_offset"] for r in rows] == [0, 2]
    batches = db(
        dsn, "SELECT events, inserted, duplicates_ledger FROM ingest_batches ORDER BY batch_id"
    )
    assert [tuple(b.values()) for b in batches] == [(1, 1, 0), (2, 1, 1)]
