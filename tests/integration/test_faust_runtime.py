"""The faust runtime (`ackline run --runtime faust`) held to the default runtime's proof:
the mixed workload, a SIGKILL mid-stream, a crash between the DB commit and the ack, and
a zombie that is fenced — each ends with `verify` ok (nothing lost, nothing twice)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from ackline.load.verify import drained
from tests.integration.harness import Services, Worker, db, run_async, wait_until
from tests.integration.windows import (
    backends,
    batches,
    fired,
    offset_rows,
    produce_worker_mix,
    verify_mixed_ok,
    verify_ok,
    wait_drained,
)


def _faust(
    services: Services, dsn: str, topic: str, tmp_path: Path, name: str, **kw: Any
) -> Worker:
    return Worker(services, dsn, topic, tmp_path, name=name, runtime="faust", **kw)


def test_mixed_workload_then_graceful_stop(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    manifest = produce_worker_mix(services, topic, tmp_path, 6_000, seed=31)
    group = f"g-{topic}"
    w = _faust(services, dsn, topic, tmp_path, "f1", batch_max_events=500)
    wait_drained(dsn, manifest, group, [w], 120)
    assert w.metric("ackline_batches_total") >= 1
    assert w.stop() == 0
    verify_mixed_ok(dsn, manifest, group)
    assert "faust" in w.log().lower()  # it really was the faust runtime
    rejects = db(dsn, "SELECT count(*) AS n FROM rejects WHERE dlq_offset IS NOT NULL")
    assert rejects[0]["n"] > 0  # poison went to the dead-letter topic first


def test_sigkill_mid_stream_then_restart(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    manifest = produce_worker_mix(services, topic, tmp_path, 12_000, seed=32)
    group = f"g-{topic}"
    first = _faust(services, dsn, topic, tmp_path, "f1", batch_max_events=400)
    wait_until(lambda: batches(dsn) >= 3, 90, "three committed batches")
    first.kill()  # SIGKILL, mid-stream
    assert not run_async(drained(dsn, manifest, group))
    second = _faust(services, dsn, topic, tmp_path, "f2", batch_max_events=400)
    wait_drained(dsn, manifest, group, [second], 120)
    assert second.stop() == 0
    verify_mixed_ok(dsn, manifest, group)


def test_crash_after_db_commit_before_ack(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """The DB has the batch, faust never saw its ack nor committed it to Kafka: the
    restart resumes from the DB offset and must not write it again."""
    manifest = produce_worker_mix(services, topic, tmp_path, 6_000, seed=33)
    group = f"g-{topic}"
    first = _faust(
        services, dsn, topic, tmp_path, "f1", batch_max_events=500, faults="after_commit=kill@2"
    )
    wait_until(lambda: first.proc.poll() is not None, 90, "the armed kill after the 2nd commit")
    assert first.reap() == -signal.SIGKILL
    assert batches(dsn) == 2
    second = _faust(services, dsn, topic, tmp_path, "f2", batch_max_events=500)
    wait_drained(dsn, manifest, group, [second], 120)
    assert second.stop() == 0
    verify_mixed_ok(dsn, manifest, group)


def test_failed_batch_exits_without_ack(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """A batch that fails is never acked: the worker exits at once (crash-only) and the
    next one resumes from the DB offset."""
    manifest = produce_worker_mix(services, topic, tmp_path, 4_000, seed=34)
    group = f"g-{topic}"
    first = _faust(
        services, dsn, topic, tmp_path, "f1", batch_max_events=300, faults="mid_copy=fail@3"
    )
    wait_until(lambda: first.proc.poll() is not None, 90, "the third COPY's failure to end it")
    assert first.reap() == 70, first.log()[-3000:]
    assert "exiting without acking" in first.log()
    # What committed is what said so before the failure: the failed batch did not. Two
    # batches, or one when the second met keys the first stored and was written again
    # (its first COPY cut short: a second mid_copy before the third)
    said = first.log().count('"event": "batch_committed"')
    assert batches(dsn) == said and said in (1, 2), (said, first.log()[-3000:])
    second = _faust(services, dsn, topic, tmp_path, "f2", batch_max_events=300)
    wait_drained(dsn, manifest, group, [second], 120)
    assert second.stop() == 0
    verify_mixed_ok(dsn, manifest, group)


def test_stalled_worker_is_fenced_when_it_resumes(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """A faust worker stalls with a batch in hand past max.poll.interval; another takes
    its partitions; when the zombie resumes, its batch is fenced and rolled back."""
    manifest = produce_worker_mix(services, topic, tmp_path, 12_000, seed=35)
    group = f"g-{topic}"
    zombie = _faust(
        services,
        dsn,
        topic,
        tmp_path,
        "zombie",
        batch_max_events=300,
        faults="after_fetch=stall@3",
        fault_stall_seconds=20,
        max_poll_interval_ms=6000,
    )
    wait_until(lambda: batches(dsn, "zombie") >= 2, 90, "the zombie's first batches")
    heir = _faust(services, dsn, topic, tmp_path, "heir", batch_max_events=300)
    wait_until(
        lambda: {r.owner for r in offset_rows(dsn, group).values()} == {"heir"},
        90,
        "the heir to claim every partition",
    )
    zombie.release_stall()  # its batch has an heir now (the 20 s stall only bounded the wait)
    wait_until(lambda: "fenced and rolled back" in zombie.log(), 120, "the zombie to be fenced")
    assert zombie.metric("ackline_fenced_batches_total") >= 1
    wait_drained(dsn, manifest, group, [zombie, heir], 120)
    assert zombie.stop() == 0
    assert heir.stop() == 0
    verify_mixed_ok(dsn, manifest, group)


def test_two_workers_through_rebalances(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """faust rebalances eagerly: every join and leave revokes and re-assigns everything;
    each assignment is claimed (epochs bumped) and read from the DB offsets."""
    manifest = produce_worker_mix(services, topic, tmp_path, 12_000, seed=36)
    group = f"g-{topic}"
    # a stalls 4 s after its third commit, so that records are left for b however fast a
    # drains (without it, a once read a partition to its end before b was given it).
    a = _faust(
        services,
        dsn,
        topic,
        tmp_path,
        "a",
        batch_max_events=300,
        faults="after_commit=stall@3",
        fault_stall_seconds=4,
    )
    wait_until(lambda: batches(dsn, "a") >= 2, 90, "worker a to commit")
    b = _faust(services, dsn, topic, tmp_path, "b", batch_max_events=300)
    # b's join revokes a's partitions (faust rebalances eagerly) and waits for a's stalled
    # batch: from there on, the rest of a's 4 s stall is padding
    wait_until(
        lambda: "Revoking previously assigned partitions frozenset(" in a.log(),
        60,
        "b's join to revoke a's partitions",
    )
    a.release_stall()
    wait_until(lambda: batches(dsn, "b") >= 1, 90, "worker b to get partitions and commit")
    assert a.stop() == 0  # a leaves: b takes everything
    wait_drained(dsn, manifest, group, [b], 120)
    assert b.stop() == 0
    verify_mixed_ok(dsn, manifest, group)
    epochs = db(dsn, "SELECT min(epoch) AS e FROM consumer_offsets WHERE group_id = $1", group)
    assert epochs[0]["e"] >= 2  # every partition changed hands and was claimed again


def test_a_revoke_takes_what_the_batch_has_gathered(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Worker a gathers a batch for up to ``ACKLINE_BATCH_MAX_MS`` (here 60 s); b joins. faust's
    revoke waits for every event it handed out to be acked, those still being gathered
    included: the revoke, and b, waited for the batch's timer (the cut-off at
    ``revoke_wait_s`` did not wake the take either). The revoke now makes the take hand
    over what it has, which a writes at once: the rebalance goes on in seconds."""
    manifest = produce_worker_mix(services, topic, tmp_path, 300, seed=39)
    group = f"g-{topic}"
    a = _faust(services, dsn, topic, tmp_path, "a", batch_max_events=2000, batch_max_ms=60_000)
    wait_until(lambda: "assigned (generation" in a.log(), 60, "a's claim")
    time.sleep(3)  # a takes the records into its batch, and waits for the batch's timer
    assert batches(dsn, "a") == 0, a.log()[-3000:]
    b = _faust(services, dsn, topic, tmp_path, "b", batch_max_events=2000)
    wait_drained(dsn, manifest, group, [a, b], 30)
    assert a.stop() == 0, a.log()[-3000:]
    assert b.stop() == 0, b.log()[-3000:]
    verify_ok(dsn, manifest, group)


def test_a_revoke_cancels_a_write_that_outlasts_revoke_wait(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Worker a's third batch hangs inside its transaction (fence CAS done, offset rows
    locked, COMMIT not sent), as a write to a database that does not answer would; b
    joins. a's revoke waits ``revoke_wait_s`` (2 s), cancels the write (the writer drops
    its connection: the server rolls back) and hands the partitions over, so b claims and
    commits its share while a's stall (120 s) still runs; then every event exactly once.
    Before, faust's revoke waited for the batch with no bound: the rebalance (and b) waited
    for the stall, and b's claim then for a's row locks."""
    manifest = produce_worker_mix(services, topic, tmp_path, 6_000, seed=37)
    group = f"g-{topic}"
    a = _faust(
        services,
        dsn,
        topic,
        tmp_path,
        "a",
        batch_max_events=300,
        faults="before_commit=stall@3",
        fault_stall_seconds=120,
        revoke_wait_s=2,
        db_idle_in_transaction_timeout_ms=180_000,
    )
    wait_until(lambda: fired(a, "before_commit"), 90, "a's 3rd batch to hang before COMMIT")
    assert backends(dsn, "a", "state = 'idle in transaction'")
    b = _faust(services, dsn, topic, tmp_path, "b", batch_max_events=300)
    wait_until(lambda: batches(dsn, "b") >= 1, 45, "b to commit while a's write still hangs")
    assert "cancelling it" in a.log(), a.log()[-3000:]
    wait_drained(dsn, manifest, group, [a, b], 120)
    assert a.stop() == 0, a.log()[-3000:]
    assert b.stop() == 0, b.log()[-3000:]
    verify_mixed_ok(dsn, manifest, group)
