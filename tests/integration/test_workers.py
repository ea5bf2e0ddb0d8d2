"""Worker processes under kills, rebalances, zombies and shutdowns, proven by verify."""

from __future__ import annotations

import signal
from pathlib import Path

from load.produce import Knobs, produce
from load.verify import Verdict, drained, verify
from tests.integration.harness import Services, Worker, db, run_async, wait_until

MIX = Knobs(
    redeliver=0.03, retry=0.02, conflict_ledger=0.003, conflict_pk=0.003, poison=0.003, abort=0.03
)


def _produce(services: Services, topic: str, tmp_path: Path, events: int, seed: int) -> Path:
    manifest = tmp_path / "manifest.jsonl.gz"
    produce(
        services.bootstrap,
        topic,
        partitions=3,
        events=events,
        knobs=MIX,
        seed=seed,
        manifest_path=manifest,
        progress=False,
    )
    return manifest


def _wait_drained(
    dsn: str, manifest: Path, group: str, workers: list[Worker], timeout: float
) -> None:
    def done() -> bool:
        for w in workers:
            w.ensure_alive()
        return run_async(drained(dsn, manifest, group))

    wait_until(done, timeout, "every produced offset to be committed in PostgreSQL")


def _verify_ok(dsn: str, manifest: Path, group: str) -> Verdict:
    verdict = run_async(verify(dsn, manifest, group))
    assert verdict.ok, verdict.to_json()
    j = verdict.to_json()
    assert j["lost"] == 0 and j["duplicated"] == 0
    assert j["duplicates_dropped"] > 0 and j["conflicts_quarantined"] > 0 and j["rejected"] > 0
    return verdict


def _batches(dsn: str, worker: str | None = None) -> int:
    if worker is None:
        return int(db(dsn, "SELECT count(*) AS n FROM ingest_batches")[0]["n"])
    return int(
        db(dsn, "SELECT count(*) AS n FROM ingest_batches WHERE worker = $1", worker)[0]["n"]
    )


def test_sigkill_mid_stream_then_restart(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    manifest = _produce(services, topic, tmp_path, 20_000, seed=11)
    group = f"g-{topic}"
    first = Worker(services, dsn, topic, tmp_path, name="w1", batch_max_events=500)
    wait_until(lambda: _batches(dsn) >= 3, 60, "three committed batches")
    first.kill()  # SIGKILL, mid-stream
    assert not run_async(drained(dsn, manifest, group))
    second = Worker(services, dsn, topic, tmp_path, name="w2", batch_max_events=500)
    _wait_drained(dsn, manifest, group, [second], 120)
    assert second.stop() == 0
    _verify_ok(dsn, manifest, group)


def test_crash_after_db_commit_before_offset_store(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Window 4: the DB has the batch, Kafka does not know; the restart must not repeat it."""
    manifest = _produce(services, topic, tmp_path, 10_000, seed=12)
    group = f"g-{topic}"
    first = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="w1",
        batch_max_events=500,
        faults="after_commit=kill@2",
    )
    wait_until(lambda: first.proc.poll() is not None, 60, "the armed kill after the 2nd commit")
    assert first.reap() == -signal.SIGKILL
    assert _batches(dsn) == 2
    second = Worker(services, dsn, topic, tmp_path, name="w2", batch_max_events=500)
    _wait_drained(dsn, manifest, group, [second], 120)
    assert second.stop() == 0
    _verify_ok(dsn, manifest, group)


def test_two_workers_through_rebalances(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    manifest = _produce(services, topic, tmp_path, 30_000, seed=13)
    group = f"g-{topic}"
    a = Worker(services, dsn, topic, tmp_path, name="a", batch_max_events=200)
    wait_until(lambda: _batches(dsn, "a") >= 2, 60, "worker a to commit")
    b = Worker(services, dsn, topic, tmp_path, name="b", batch_max_events=200)
    wait_until(lambda: _batches(dsn, "b") >= 1, 60, "worker b to get partitions and commit")
    assert a.stop() == 0  # a leaves: b takes everything
    _wait_drained(dsn, manifest, group, [b], 120)
    assert b.stop() == 0
    _verify_ok(dsn, manifest, group)
    epochs = db(dsn, "SELECT max(epoch) AS e FROM consumer_offsets WHERE group_id = $1", group)
    assert epochs[0]["e"] >= 2  # partitions changed hands and were re-claimed


def test_stalled_worker_is_fenced_when_it_resumes(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """A worker stalls past max.poll.interval with a batch in hand; another takes its
    partitions; when the zombie resumes, its batch is fenced and rolled back."""
    manifest = _produce(services, topic, tmp_path, 20_000, seed=14)
    group = f"g-{topic}"
    zombie = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="zombie",
        batch_max_events=300,
        faults="after_fetch=stall@3",
        fault_stall_seconds=15,
        max_poll_interval_ms=7000,
    )
    wait_until(lambda: _batches(dsn, "zombie") >= 2, 60, "the zombie's first batches")
    heir = Worker(services, dsn, topic, tmp_path, name="heir", batch_max_events=300)
    wait_until(lambda: "fenced and rolled back" in zombie.log(), 90, "the zombie to be fenced")
    assert zombie.metric("ackline_fenced_batches_total") >= 1
    _wait_drained(dsn, manifest, group, [zombie, heir], 120)
    assert zombie.stop() == 0
    assert heir.stop() == 0
    _verify_ok(dsn, manifest, group)


def _in_transaction(dsn: str, worker: str) -> bool:
    rows = db(
        dsn,
        "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = $1 "
        "AND state = 'idle in transaction'",
        f"ackline:{worker}",
    )
    return int(rows[0]["n"]) > 0


def test_sigterm_lets_the_batch_in_flight_commit(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    manifest = _produce(services, topic, tmp_path, 10_000, seed=15)
    group = f"g-{topic}"
    w = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="w1",
        batch_max_events=500,
        faults="before_commit=stall@2",
        fault_stall_seconds=3,
    )
    wait_until(
        lambda: _batches(dsn) >= 1 and _in_transaction(dsn, "w1"),
        60,
        "the 2nd batch to stall before COMMIT",
    )
    w.signal(signal.SIGTERM)
    assert w.stop() == 0
    assert _batches(dsn) == 2  # the in-flight batch finished, nothing after it started
    again = Worker(services, dsn, topic, tmp_path, name="w2", batch_max_events=500)
    _wait_drained(dsn, manifest, group, [again], 120)
    assert again.stop() == 0
    _verify_ok(dsn, manifest, group)


def test_sigterm_rolls_back_a_batch_that_cannot_finish(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    manifest = _produce(services, topic, tmp_path, 10_000, seed=16)
    group = f"g-{topic}"
    w = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="w1",
        batch_max_events=500,
        faults="before_commit=stall@2",
        shutdown_wait_s=1,
    )
    wait_until(
        lambda: _batches(dsn) >= 1 and _in_transaction(dsn, "w1"),
        60,
        "the 2nd batch to stall before COMMIT",
    )
    w.signal(signal.SIGTERM)
    assert w.stop(timeout=30) == 0
    assert _batches(dsn) == 1  # the stalled batch was rolled back
    again = Worker(services, dsn, topic, tmp_path, name="w2", batch_max_events=500)
    _wait_drained(dsn, manifest, group, [again], 120)
    assert again.stop() == 0
    _verify_ok(dsn, manifest, group)
