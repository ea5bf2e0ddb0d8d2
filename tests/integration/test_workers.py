"""Worker processes under kills and rebalances, proven by verify.

The crash windows of DESIGN.md (after commit, zombies, shutdown with a write in flight,
...) each have their own test in test_crash_windows.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

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


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_two_workers_through_rebalances(
    services: Services, dsn: str, topic: str, tmp_path: Path, protocol: str
) -> None:
    manifest = _produce(services, topic, tmp_path, 10_000, seed=13)
    group = f"g-{topic}"
    # a pauses 4 s after its third commit, so that records are left for b however fast
    # a drains (10k events take a worker about a second).
    a = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="a",
        batch_max_events=300,
        group_protocol=protocol,
        faults="after_commit=stall@3",
        fault_stall_seconds=4,
    )
    wait_until(lambda: _batches(dsn, "a") >= 2, 60, "worker a to commit")
    b = Worker(
        services, dsn, topic, tmp_path, name="b", batch_max_events=300, group_protocol=protocol
    )
    wait_until(lambda: _batches(dsn, "b") >= 1, 60, "worker b to get partitions and commit")
    assert a.stop() == 0  # a leaves: b takes everything
    _wait_drained(dsn, manifest, group, [b], 120)
    assert b.stop() == 0
    _verify_ok(dsn, manifest, group)
    epochs = db(dsn, "SELECT max(epoch) AS e FROM consumer_offsets WHERE group_id = $1", group)
    assert epochs[0]["e"] >= 2  # partitions changed hands and were re-claimed
