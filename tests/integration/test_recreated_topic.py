"""A topic deleted and made again under its name: the group's DB offsets belong to the old
incarnation (docs/guarantees.md, "A recreated topic").

An operator reproduced the loss by hand: once the new log grew past the old DB offsets, a
worker resumed there and exited 0 with no WARNING, and every record of the new topic below
them was never ingested (251 of 600). The worker now records the topic's ID (a new one
for each incarnation) and refuses to start on another; `ackline offsets adopt-topic`
moves the group to the new incarnation, which a worker then ingests exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import subprocess
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from ackline.load.manifest import read_manifest
from ackline.load.produce import Knobs
from ackline.load.verify import Verdict, expected_outcome, verify
from ackline.runtime.incarnation_watch import IncarnationWatch
from ackline.sinks.ingest.incarnation import Recorded, record
from ackline.streams.admin import delete_topic, ensure_topic
from ackline.streams.kafkainfo import topic_id
from tests.integration.harness import (
    Services,
    Worker,
    database_upto,
    db,
    run_async,
    wait_until,
)
from tests.integration.processing import ackline
from tests.integration.windows import (
    offset_rows,
    produce_mix,
    produce_worker_mix,
    verify_ok,
    watermarks,
)

# the first incarnation without rejects or conflicts: verify counts theirs by source
# coordinates, which the new incarnation reuses (the rows themselves carry their
# incarnation since migration 0016: test_writer.py)
NO_OFFSET_KEYED = Knobs(
    redeliver=0.03, retry=0.02, conflict_ledger=0.0, conflict_pk=0.0, poison=0.0, abort=0.03
)


def _ended(worker: Worker, timeout: float = 240) -> int:
    """The exit status of a worker that ends by itself (``--until-drained``, a refusal)."""
    try:
        return worker.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        worker.stop()
        raise AssertionError(f"{worker.name} did not end:\n{worker.log()[-3000:]}") from None


def _verify_beside(dsn: str, manifest: Path, group: str, old: Verdict, old_batches: int) -> None:
    """:func:`verify_ok` of the new incarnation's manifest, its rows beside the old one's.

    The verifier knows a topic by its name: the old incarnation's rows that sit at the new
    manifest's coordinates are counted as ``duplicated``, and its batches' dropped
    duplicates are the group's on the topic too. So every count is asserted exact, and
    those two are the new run's plus exactly the old run's (its rows are those of the
    batches up to ``old_batches``): a row or drop more is a failure."""
    verdict = run_async(verify(dsn, manifest, group))
    j = verdict.to_json()
    report = json.dumps(j, indent=1)
    coords = sorted(expected_outcome(read_manifest(manifest).records).coords)
    [old_here] = db(
        dsn,
        "SELECT count(*) AS n FROM activity a "
        "JOIN unnest($3::int[], $4::bigint[]) AS c(p, o) "
        "  ON a.src_partition = c.p AND a.src_offset = c.o "
        "WHERE a.src_topic = $1 AND a.batch_id <= $2",
        read_manifest(manifest).header.topic,
        old_batches,
        [p for p, _ in coords],
        [o for _, o in coords],
    )
    assert verdict.lost == 0 and verdict.ingested == verdict.unique_expected, report
    assert 0 < old_here["n"] <= old.ingested, report
    assert verdict.duplicated == old_here["n"], report
    dropped = verdict.duplicates_expected + old.duplicates_dropped
    assert verdict.duplicates_dropped == dropped, report
    # exact, not asserted > 0: 900 events of the mix hold no poison record about one run
    # in 15 (0.3 % each), and the point here is what a recreated topic loses
    assert verdict.conflicts_quarantined == verdict.conflicts_expected, report
    assert verdict.rejected == verdict.rejects_expected, report
    assert j["conflicts_unexpected"] == j["rejects_unexpected"] == 0, report
    assert j["conflict_layer_mismatch"] == j["reject_reason_mismatch"] == 0, report
    assert verdict.drained and verdict.duplicates_expected > 0, report


def _recreate(services: Services, topic: str, before: str, partitions: int = 3) -> str:
    """Delete ``topic`` and make it again with ``partitions``; its new ID once visible."""
    delete_topic(services.bootstrap, topic)
    wait_until(lambda: topic_id(services.bootstrap, {}, topic) is None, 60, "the deletion")
    ensure_topic(services.bootstrap, topic, partitions=partitions)
    wait_until(
        lambda: topic_id(services.bootstrap, {}, topic) not in (None, before),
        60,
        "the new incarnation to be visible",
    )
    made = topic_id(services.bootstrap, {}, topic)
    assert made is not None
    return made


async def _allow_connections(services: Services, dsn: str, yes: bool) -> None:
    """Let ``dsn``'s database take new connections or refuse them (those open stay)."""
    name = dsn.rsplit("/", 1)[-1].split("?", 1)[0]
    conn = await asyncpg.connect(services.database_url)
    try:
        await conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(yes).lower()}')
    finally:
        await conn.close()


def _adopt(services: Services, dsn: str, topic: str, group: str) -> dict[str, Any]:
    """`ackline offsets adopt-topic --json` for ``group``, which must succeed; what it says."""
    where = {
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_TOPIC": topic,
        "ACKLINE_GROUP_ID": group,
    }
    adopted = ackline(dsn, "offsets", "adopt-topic", "--json", **where)
    assert adopted.code == 0, adopted.err
    said: dict[str, Any] = json.loads(adopted.out)
    return said


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_a_recreated_topic_is_refused_at_start_until_adopted_then_ingested_exactly_once(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str
) -> None:
    """The operator's loss: ingest, delete and recreate the topic, produce past the old DB
    offsets, start a worker. The old code resumed at the old offsets and exited 0, losing
    what the new log held below them; the worker refuses now, naming the topic, both IDs
    and the group, and has claimed nothing. After `offsets adopt-topic` a worker drains
    the new incarnation, every event exactly once."""
    group = f"g-{topic}"
    first_id = topic_id(services.bootstrap, {}, topic)
    assert first_id is not None
    old = produce_mix(services, topic, tmp_path, 300, seed=61, knobs=NO_OFFSET_KEYED)
    w = Worker(services, dsn, topic, tmp_path, name="w1", runtime=runtime, args=["--until-drained"])
    assert _ended(w) == 0, w.log()[-3000:]
    old_verdict = verify_ok(dsn, old, group)
    [last] = db(dsn, "SELECT max(batch_id) AS b FROM ingest_batches WHERE group_id = $1", group)
    old_batches = int(last["b"])
    rows = offset_rows(dsn, group)
    before = {p: r.next_offset for p, r in rows.items()}
    assert len(before) == 3 and all(before.values()), before

    new_id = _recreate(services, topic, first_id)
    new = produce_worker_mix(services, topic, tmp_path, 900, seed=62)
    ends = watermarks(services.bootstrap, topic, 3)
    assert all(ends[p][1] > (before[p] or 0) for p in before), (ends, before)

    refused = Worker(
        services, dsn, topic, tmp_path, name="w2", runtime=runtime, args=["--until-drained"]
    )
    code = _ended(refused)
    log = refused.log()
    assert code == 2, f"the worker ran on the old DB offsets (exit {code}):\n{log[-3000:]}"
    line = next((x for x in log.splitlines() if "another incarnation" in x), None)
    assert line is not None, log[-3000:]
    assert topic in line and group in line and first_id in line and new_id in line, line
    assert "ackline offsets adopt-topic" in line, line
    recorded = db(dsn, "SELECT topic_id FROM topic_incarnations WHERE group_id = $1", group)
    assert [r["topic_id"] for r in recorded] == [first_id]  # the first worker's, kept
    assert offset_rows(dsn, group) == rows  # nothing was claimed (no epoch) or moved
    # doctor says so too (an operator's hunt: its offsets check passed, the new log past
    # the old offsets, while the worker refused)
    where = {
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_TOPIC": topic,
        "ACKLINE_GROUP_ID": group,
    }
    doc = ackline(dsn, "doctor", "--json", **where)
    check = {c["name"]: c for c in json.loads(doc.out)["checks"]}["topic incarnation"]
    assert doc.code == 1 and check["status"] == "fail", (doc.code, check)
    assert "adopt-topic" in check["detail"] and new_id in check["detail"], check
    # and status, whose lag against the old DB offsets meant nothing (a review)
    shown = ackline(dsn, "status", **where)
    assert shown.code == 0 and "another incarnation" in shown.out, shown.out
    assert new_id in shown.out and "adopt-topic" in shown.out, shown.out
    shown = ackline(dsn, "status", "--json", **where)
    as_json = json.loads(shown.out)
    assert (as_json["topic_id"], as_json["recorded_topic_id"]) == (new_id, first_id), as_json
    assert "another incarnation" in shown.err, shown.err

    said = _adopt(services, dsn, topic, group)
    assert said["adopted"] and said["topic_id"] == new_id, said
    assert said["previous_topic_id"] == first_id, said
    assert said["rewound_offsets"] == {str(p): o for p, o in before.items()}, said
    # rewound to the log start, not deleted: a claim after a delete began the epochs at 1
    # again, and a late batch of a worker cut off at epoch 1 passed the fence (a review);
    # and at 0 whatever ACKLINE_START_FROM says (`latest` skipped the new topic's backlog)
    rewound = offset_rows(dsn, group)
    assert {p: r.next_offset for p, r in rewound.items()} == dict.fromkeys(rows, 0), rewound
    assert all(rewound[p].epoch > rows[p].epoch for p in rows), (rows, rewound)
    assert not _adopt(services, dsn, topic, group)["adopted"]
    doc = ackline(dsn, "doctor", "--json", **where)
    check = {c["name"]: c for c in json.loads(doc.out)["checks"]}["topic incarnation"]
    assert check["status"] == "pass", check
    shown = ackline(dsn, "status", **where)
    assert shown.code == 0 and "another incarnation" not in shown.out, shown.out

    w3 = Worker(
        services, dsn, topic, tmp_path, name="w3", runtime=runtime, args=["--until-drained"]
    )
    assert _ended(w3) == 0, w3.log()[-3000:]
    assert "another incarnation" not in w3.log()
    _verify_beside(dsn, new, group, old_verdict, old_batches)


def test_a_partition_the_old_topic_did_not_have_is_read_from_its_log_start_after_adopt(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """An operator's loss: the topic made again with more partitions, produced to, adopted
    ("the next worker reads the new topic from its log start"), then ingested with
    ACKLINE_START_FROM=latest. The rewound partitions started at 0, but the ones the old
    topic did not have got no DB offset and started at their end: 1,136 of 2,000 events
    never ingested. Adopting now stores 0 for them too."""
    group = f"g-{topic}"
    first_id = topic_id(services.bootstrap, {}, topic)
    assert first_id is not None
    produce_mix(services, topic, tmp_path, 200, seed=71, knobs=NO_OFFSET_KEYED)
    w = Worker(services, dsn, topic, tmp_path, name="w1", args=["--until-drained"])
    assert _ended(w) == 0, w.log()[-3000:]

    _recreate(services, topic, first_id, partitions=5)
    new = produce_mix(services, topic, tmp_path, 600, seed=72, knobs=NO_OFFSET_KEYED)
    ends = watermarks(services.bootstrap, topic, 5)
    assert ends[3][1] > 0 and ends[4][1] > 0, ends  # the new partitions hold records

    # a mistyped group (an operator's hunt: it was adopted, an ID recorded for it, and
    # nothing said) is refused, the groups that have DB offsets for the topic named
    typo = ackline(
        dsn,
        "offsets",
        "adopt-topic",
        ACKLINE_KAFKA_BOOTSTRAP=services.bootstrap,
        ACKLINE_TOPIC=topic,
        ACKLINE_GROUP_ID="typo-group",
    )
    assert typo.code == 2 and "nothing to adopt" in typo.err, (typo.code, typo.err)
    assert group in typo.err and "Traceback" not in typo.err, typo.err
    kept = db(dsn, "SELECT group_id FROM topic_incarnations WHERE topic = $1", topic)
    assert [r["group_id"] for r in kept] == [group], kept
    said = _adopt(services, dsn, topic, group)
    assert said["adopted"], said

    w2 = Worker(
        services, dsn, topic, tmp_path, name="w2", args=["--until-drained"], start_from="latest"
    )
    assert _ended(w2) == 0, w2.log()[-3000:]
    verdict = run_async(verify(dsn, new, group))
    assert verdict.lost == 0, verdict.to_json()
    assert verdict.ingested == verdict.unique_expected, verdict.to_json()


def test_offsets_from_before_the_migration_take_the_topic_id_there_is(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Upgrades: DB offsets with no recorded ID (rows from before migration 0015) are taken
    for the incarnation there is at the first start, said at INFO, and recorded."""
    group = f"g-{topic}"
    manifest = produce_mix(services, topic, tmp_path, 60, seed=63, knobs=NO_OFFSET_KEYED)
    for p in range(3):
        db(
            dsn,
            "INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, epoch, "
            "owner) VALUES ($1, $2, $3, 0, 1, 'before')",
            group,
            topic,
            p,
        )
    w = Worker(services, dsn, topic, tmp_path, name="w", args=["--until-drained"])
    assert _ended(w) == 0, w.log()[-3000:]
    assert "from before topic IDs were recorded" in w.log()
    recorded = db(dsn, "SELECT topic_id FROM topic_incarnations WHERE group_id = $1", group)
    assert [r["topic_id"] for r in recorded] == [topic_id(services.bootstrap, {}, topic)]
    verify_ok(dsn, manifest, group)


def test_a_database_before_the_migration_is_warned_about_and_ingested_unchecked(
    services: Services, topic: str, tmp_path: Path
) -> None:
    """A worker on a schema without migration 0015 (upgraded code, `migrate` not run yet)
    says so and starts as it did before the check."""
    with database_upto(services, 14) as old_dsn:
        manifest = produce_mix(services, topic, tmp_path, 60, seed=64, knobs=NO_OFFSET_KEYED)
        w = Worker(services, old_dsn, topic, tmp_path, name="w", args=["--until-drained"])
        assert _ended(w) == 0, w.log()[-3000:]
        assert "migration 0015" in w.log()
        verify_ok(old_dsn, manifest, f"g-{topic}")


def test_two_workers_recording_at_once_record_one_id(dsn: str) -> None:
    """Two starts recording together (each sees no row): one ID is recorded, and both
    read that one."""

    async def both() -> list[Recorded]:
        conns = [await asyncpg.connect(dsn) for _ in range(2)]
        try:
            return list(
                await asyncio.gather(
                    record(conns[0], "g", "t", "A-id"), record(conns[1], "g", "t", "B-id")
                )
            )
        finally:
            for c in conns:
                await c.close()

    found = run_async(both())
    assert found[0].stored == found[1].stored in ("A-id", "B-id"), found
    assert sorted(f.recorded for f in found) == [False, True], found


def _running_on_the_first(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str, seed: int
) -> tuple[str, Worker]:
    """The topic's first ID, and a worker that ingested its 300 events and runs on."""
    group = f"g-{topic}"
    first_id = topic_id(services.bootstrap, {}, topic)
    assert first_id is not None
    produce_mix(services, topic, tmp_path, 300, seed=seed, knobs=NO_OFFSET_KEYED)
    w = Worker(services, dsn, topic, tmp_path, name="w1", runtime=runtime)
    ends = watermarks(services.bootstrap, topic, 3)

    def drained() -> bool:
        w.ensure_alive()
        at = {p: r.next_offset or 0 for p, r in offset_rows(dsn, group).items()}
        # the last offset of each is the upstream transaction's commit marker
        return len(at) == 3 and all(at[p] >= hi - 1 for p, (_, hi) in ends.items())

    wait_until(drained, 120, "the first incarnation ingested")
    return first_id, w


def _stopped_on_the_recreation(w: Worker) -> str:
    """The worker's log, once it exited 2 on the topic made again (within 90 s)."""
    try:
        code = w.proc.wait(90)
    except subprocess.TimeoutExpired:
        code = None
    log = w.log()
    w.stop()
    assert code == 2, f"the worker ran on through the recreation ({code}):\n{log[-3000:]}"
    return log


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_a_topic_recreated_under_a_running_worker_stops_it_before_its_old_offsets_are_used(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str
) -> None:
    """The review's worst finding: the check at start did not cover a worker that runs
    while the topic is deleted and made again. Once the new log grew past the old DB
    offsets, the worker's held partitions were released there (or its fetch went on
    there) and the new topic's records below them were never ingested, the worker still
    running. It now stops with the refusal line (exit 2) as a start would; after `offsets
    adopt-topic` a worker drains the new incarnation and nothing of it is lost."""
    group = f"g-{topic}"
    first_id, w = _running_on_the_first(services, dsn, topic, tmp_path, runtime, seed=65)
    new_id = _recreate(services, topic, first_id)
    # each event sent once (aborted transactions aside): what the worker takes before it
    # stops it takes out of order, records past the old offsets first, so an event sent
    # again there was stored from that copy, and a conflict's later version won
    # (guarantees.md); nothing lost or doubled, which is what is asserted
    once = Knobs(redeliver=0, retry=0, conflict_ledger=0, conflict_pk=0, poison=0, abort=0.03)
    new = produce_mix(services, topic, tmp_path, 900, seed=66, knobs=once)
    log = _stopped_on_the_recreation(w)
    line = next((x for x in log.splitlines() if "another incarnation" in x), None)
    assert line is not None and first_id in line and new_id in line, log[-3000:]

    assert _adopt(services, dsn, topic, group)["adopted"]
    w2 = Worker(
        services, dsn, topic, tmp_path, name="w2", runtime=runtime, args=["--until-drained"]
    )
    assert _ended(w2) == 0, w2.log()[-3000:]
    j = run_async(verify(dsn, new, group)).to_json()
    report = json.dumps(j, indent=1)
    assert j["lost"] == 0 and j["ingested"] == j["unique_expected"], report
    assert j["conflicts_unexpected"] == j["rejects_unexpected"] == 0, report
    assert j["drained"] and j["plan_inconsistent"] == 0, report


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_a_worker_that_saw_its_topic_gone_writes_nothing_of_the_next_one(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str
) -> None:
    """An operator's probe: the topic deleted under a running worker and made again a
    second later with new records; the worker committed batches of the new topic at the
    old offsets before its watch read the new ID (2 of 3 tries), so after `offsets
    adopt-topic` a conflict was quarantined twice and an event was stored from its later
    copy. A worker whose watch saw the topic gone holds its batches until a read finds
    it again: the new ID stops it, and nothing of the new topic is written before the
    adopt."""
    _, w = _running_on_the_first(services, dsn, topic, tmp_path, runtime, seed=68)
    before = db(dsn, "SELECT count(*) AS n FROM ingest_batches")[0]["n"]
    delete_topic(services.bootstrap, topic)
    wait_until(lambda: w.metric("ackline_topic_missing") == 1, 60, "the watch to see it gone")
    ensure_topic(services.bootstrap, topic, partitions=3)
    once = Knobs(redeliver=0, retry=0, conflict_ledger=0, conflict_pk=0, poison=0, abort=0.0)
    produce_mix(services, topic, tmp_path, 900, seed=69, knobs=once)
    log = _stopped_on_the_recreation(w)
    after = db(dsn, "SELECT count(*) AS n FROM ingest_batches")[0]["n"]
    assert after == before, f"{after - before} batch(es) of the new topic written:\n{log[-3000:]}"


def test_batches_held_while_the_topic_was_gone_wait_for_postgresql_to_say_whose_it_is(
    services: Services, dsn: str, topic: str
) -> None:
    """A review: where the start could not confirm an ID, the watch's first read after
    the topic came back let the held batches go before it asked PostgreSQL whether that
    ID is the recorded one, and the refusal came after them (written: the new topic's
    records at the old offsets). They stay held until PostgreSQL answers, and are not
    written when the answer is another incarnation."""
    group = f"g-{topic}"

    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        await record(conn, group, topic, "another-id")  # the DB offsets' incarnation
        watch = IncarnationWatch(services.bootstrap, {}, topic, group, dsn, 2.0, "w")
        watch.missing = True  # a read found the topic gone: batches held
        blocker = await asyncpg.connect(dsn)
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute("LOCK TABLE topic_incarnations IN ACCESS EXCLUSIVE MODE")
        others: list[bool] = []
        task = asyncio.create_task(watch.run(on_other=lambda: others.append(True)))
        held = asyncio.create_task(watch.settled())
        try:
            await asyncio.sleep(1.5)  # the topic read, PostgreSQL asked (and kept waiting)
            assert not held.done(), "a held batch went before PostgreSQL said whose the ID is"
        finally:
            await lock.rollback()
            await blocker.close()
        assert await asyncio.wait_for(held, 20) is False
        await asyncio.wait_for(task, 20)
        assert others == [True] and watch.refusal is not None
        await conn.close()

    asyncio.run(go())


def test_a_worker_on_a_deleted_topic_is_not_ready(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """An operator's hunt: a worker whose topic was deleted (and not made again) stayed
    ready, librdkafka keeping its assignment, though it had nothing left to ingest."""
    import urllib.error
    import urllib.request

    produce_mix(services, topic, tmp_path, 60, seed=67, knobs=NO_OFFSET_KEYED)
    w = Worker(services, dsn, topic, tmp_path, name="w1")

    def readyz() -> tuple[int, str]:
        w.ensure_alive()
        url = f"http://127.0.0.1:{w.metrics_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError as exc:
            return 0, str(exc)

    try:
        wait_until(lambda: readyz()[0] == 200, 120, "the worker ready")
        delete_topic(services.bootstrap, topic)
        wait_until(lambda: "no such topic now (deleted?)" in readyz()[1], 60, "/readyz to say so")
        assert readyz()[0] == 503, readyz()
    finally:
        w.stop()


def test_the_watch_outlives_postgresql_refusing_its_checks_and_stops_on_a_recreation_without_it(
    services: Services, dsn: str, topic: str
) -> None:
    """The watch's first PostgreSQL failure raised AttributeError (the once-per-outage
    flag was set only after a success): a watch whose first check met PostgreSQL away
    died, and the worker then ran unchecked (its gates open, a recreation never seen).
    It must go on checking and record the topic once PostgreSQL answers. And a review:
    the refusal waited for a new connection, which PostgreSQL may refuse while the
    writers' connections still commit; an ID changing under the worker needs none."""
    group = f"g-{topic}"
    first = topic_id(services.bootstrap, {}, topic)
    allow = functools.partial(_allow_connections, services, dsn)

    def recorded() -> list[str]:
        rows = db(dsn, "SELECT topic_id FROM topic_incarnations WHERE group_id = $1", group)
        return [r["topic_id"] for r in rows]

    async def go() -> None:
        watch = IncarnationWatch(services.bootstrap, {}, topic, group, dsn, 2.0, "w")
        others: list[bool] = []
        await allow(False)
        try:
            task = asyncio.create_task(watch.run(on_other=lambda: others.append(True)))
            await asyncio.sleep(1.0)  # the first check met the refusal
            assert not task.done(), task.exception()
        finally:
            await allow(True)
        try:
            for _ in range(100):
                if await asyncio.to_thread(recorded):
                    break
                await asyncio.sleep(0.1)
            assert not task.done(), task.exception()
            assert await asyncio.to_thread(recorded) == [first] and not others
            assert watch.confirmed == first, watch.confirmed
            await allow(False)  # new connections refused from here on
            try:
                assert first is not None
                made = await asyncio.to_thread(_recreate, services, topic, first)
                for _ in range(150):
                    if task.done():
                        break
                    await asyncio.sleep(0.1)
                assert task.done() and others == [True], "no refusal without PostgreSQL"
                line = watch.refusal or ""
                assert first in line and made in line and "adopt-topic" in line, line
            finally:
                await allow(True)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    run_async(go())


def test_a_recreation_between_the_starts_check_and_the_watchs_first_read_needs_no_postgresql(
    services: Services, dsn: str, topic: str
) -> None:
    """The start's check (`_same_incarnation`) confirmed the topic ID, and the running
    watch then read it again and asked PostgreSQL again whether it was the recorded one:
    a connection per start for nothing, and a topic recreated in between was taken for
    the worker's own until PostgreSQL answered a new connection (which it may refuse
    while the writers' connections still commit). The start now hands the ID it
    confirmed to the watch, whose first read is compared with it."""
    from ackline.commands.core import _same_incarnation
    from ackline.settings import Settings
    from ackline.sinks.connection import Database

    group = f"g-{topic}"
    first = topic_id(services.bootstrap, {}, topic)
    assert first is not None
    settings = Settings(topic=topic, group_id=group)
    allow = functools.partial(_allow_connections, services, dsn)

    async def go() -> None:
        database = Database(dsn)
        try:
            confirmed = await _same_incarnation(
                settings, services.bootstrap, database, lambda: False
            )
        finally:
            await database.discard()
        assert confirmed is not None and confirmed.topic_id == first, confirmed
        made = await asyncio.to_thread(_recreate, services, topic, first)
        watch = IncarnationWatch(services.bootstrap, {}, topic, group, dsn, 2.0, "w")
        watch.start_from(confirmed)
        others: list[bool] = []
        await allow(False)  # new connections refused from here on
        try:
            task = asyncio.create_task(watch.run(on_other=lambda: others.append(True)))
            try:
                for _ in range(150):
                    if task.done():
                        break
                    await asyncio.sleep(0.1)
                assert task.done() and others == [True], "the first read took the new topic"
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        finally:
            await allow(True)
        line = watch.refusal or ""
        assert first in line and made in line and "adopt-topic" in line, line

    run_async(go())


def test_a_new_partition_claimed_while_adopt_runs_is_rewound_too(dsn: str) -> None:
    """A worker's claim of a partition the old topic did not have, committed while adopt
    ran (between its rewind and its insert of the missing rows), was kept: the insert's
    ON CONFLICT DO NOTHING left the row at the claim's start (the log end for
    start_from=latest) and epoch 1, neither rewound nor fenced, and what the partition
    held below it was never ingested. Adopt now inserts the missing rows first, then
    rewinds every row, so the claim is rewound to 0 and its epoch moved on."""
    from ackline.sinks.ingest.incarnation import adopt
    from ackline.sinks.ingest.offsets import claim

    group, topic = "g-race", "t-race"

    async def scenario() -> tuple[asyncpg.Record, Any]:
        setup = await asyncpg.connect(dsn)
        worker = await asyncpg.connect(dsn)
        operator = await asyncpg.connect(dsn)
        try:
            await setup.execute(
                "INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, epoch, "
                "owner, claimed_at) VALUES ($1, $2, 0, 500, 1, NULL, now())",
                group,
                topic,
            )
            await setup.execute(
                "INSERT INTO topic_incarnations (group_id, topic, topic_id) VALUES ($1, $2, 'OLD')",
                group,
                topic,
            )
            # the worker's claim of partition 1 (new in the new topic), at its log end
            tx = worker.transaction()
            await tx.start()
            claimed = await claim(worker, group, "w1", [(topic, 1)], {(topic, 1): 777})
            assert [c.epoch for c in claimed] == [1], claimed
            adopting = asyncio.ensure_future(adopt(operator, group, topic, "NEW", 2))
            pid = operator.get_server_pid()
            for _ in range(100):  # until adopt waits on the claim's row
                waiting = await setup.fetchval(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
                )
                if waiting:
                    break
                await asyncio.sleep(0.05)
            await tx.commit()
            adopted = await adopting
            row = await setup.fetchrow(
                "SELECT next_offset, epoch, owner FROM consumer_offsets "
                "WHERE group_id = $1 AND topic = $2 AND partition = 1",
                group,
                topic,
            )
            assert row is not None
            return row, adopted
        finally:
            for conn in (setup, worker, operator):
                await conn.close()

    row, adopted = asyncio.run(scenario())
    assert row["next_offset"] == 0 and row["epoch"] > 1 and row["owner"] is None, dict(row)
    assert adopted is not None and adopted.offsets == {0: 500, 1: 777}, adopted
    assert adopted.started == (), adopted
