"""Helpers of the crash-window tests: scenarios with manifests, conditions, verdicts.

Every window test ends with :func:`verify_ok`: ``ackline.load.verify`` compares a manifest (the
record of everything produced) with PostgreSQL and must find zero lost, zero duplicated,
and exactly the expected duplicates, conflicts and rejects. :class:`Scenario` writes such
a manifest for hand-made records (exact partitions, copies, poison, aborted transactions)
when the generated mix of :func:`produce_mix` is not precise enough.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from ackline.load.manifest import ManifestHeader, ManifestRecord, ManifestWriter, read_manifest
from ackline.load.produce import Knobs, produce
from ackline.load.verify import Verdict, expected_outcome, is_drained, verify
from ackline.schemas import Envelope, hash_envelope, new_envelope
from ackline.streams.admin import end_not_ready
from ackline.streams.producer import CONTENT_TYPE, ActivityProducer, serialize
from tests.integration.harness import Services, Worker, db, run_async, wait_until

MIX = Knobs(
    redeliver=0.04, retry=0.03, conflict_ledger=0.006, conflict_pk=0.006, poison=0.006, abort=0.05
)
"""Every fault kind of the load generator, dense enough for a few thousand events."""

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def produce_mix(
    services: Services,
    topic: str,
    tmp_path: Path,
    events: int,
    seed: int,
    knobs: Knobs = MIX,
    partitions: int = 3,
    txn_size: int = 200,
) -> Path:
    manifest = tmp_path / f"manifest-{seed}.jsonl.gz"
    produce(
        services.bootstrap,
        topic,
        partitions=partitions,
        events=events,
        knobs=knobs,
        seed=seed,
        manifest_path=manifest,
        txn_size=txn_size,
        progress=False,
        out=None,
    )
    return manifest


WORKER_MIX = Knobs(
    redeliver=0.03, retry=0.02, conflict_ledger=0.003, conflict_pk=0.003, poison=0.003, abort=0.03
)
"""The lighter mix of the worker tests (both runtimes): thousands of events per test."""


def produce_worker_mix(
    services: Services, topic: str, tmp_path: Path, events: int, seed: int
) -> Path:
    """:data:`WORKER_MIX` in 500-record upstream transactions on 3 partitions."""
    return produce_mix(services, topic, tmp_path, events, seed, knobs=WORKER_MIX, txn_size=500)


def verify_mixed_ok(dsn: str, manifest: Path, group: str) -> Verdict:
    """:func:`verify_ok`, and the mix really had duplicates, conflicts and rejects to prove."""
    verdict = verify_ok(dsn, manifest, group)
    j = verdict.to_json()
    assert j["duplicates_dropped"] > 0 and j["conflicts_quarantined"] > 0 and j["rejected"] > 0
    return verdict


def verify_ok(dsn: str, manifest: Path, group: str) -> Verdict:
    """The verdict, asserted: exactly once, with the exact conflicts and rejects."""
    verdict = run_async(verify(dsn, manifest, group))
    report = json.dumps(verdict.to_json(), indent=1)
    assert verdict.ok, report
    assert verdict.lost == 0 and verdict.duplicated == 0, report
    assert verdict.drained, report
    return verdict


def wait_drained(
    dsn: str, manifest: Path, group: str, workers: Iterable[Worker], timeout: float = 120
) -> None:
    """Wait until the group's DB offsets are past every committed record of the manifest,
    failing at once if a worker died."""
    alive = list(workers)
    loaded = read_manifest(manifest)
    last = expected_outcome(loaded.records).max_offsets
    topic = loaded.header.topic

    def done() -> bool:
        for w in alive:
            w.ensure_alive()
        rows = db(
            dsn,
            "SELECT partition, next_offset FROM consumer_offsets "
            "WHERE group_id = $1 AND topic = $2",
            group,
            topic,
        )
        return is_drained(last, {int(r["partition"]): r["next_offset"] for r in rows})

    wait_until(done, timeout, "every produced offset to be committed in PostgreSQL")


def batches(dsn: str, worker: str | None = None) -> int:
    if worker is None:
        return int(db(dsn, "SELECT count(*) AS n FROM ingest_batches")[0]["n"])
    rows = db(dsn, "SELECT count(*) AS n FROM ingest_batches WHERE worker = $1", worker)
    return int(rows[0]["n"])


@dataclass(frozen=True)
class OffsetRow:
    next_offset: int | None
    epoch: int
    owner: str


def offset_rows(dsn: str, group: str) -> dict[int, OffsetRow]:
    rows = db(
        dsn,
        "SELECT partition, next_offset, epoch, owner FROM consumer_offsets WHERE group_id = $1",
        group,
    )
    return {
        int(r["partition"]): OffsetRow(r["next_offset"], int(r["epoch"]), str(r["owner"]))
        for r in rows
    }


def backends(dsn: str, worker: str, where: str = "true") -> list[dict[str, Any]]:
    """pg_stat_activity rows of the worker's writer connection (application_name)."""
    rows = db(
        dsn,
        "SELECT pid, state, query, wait_event FROM pg_stat_activity "
        f"WHERE application_name = $1 AND {where}",
        f"ackline:{worker}",
    )
    return [dict(r) for r in rows]


def terminate(dsn: str, pids: Iterable[int]) -> int:
    """pg_terminate_backend each pid; the number that were really terminated."""
    rows = db(
        dsn,
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(p)) AS n FROM unnest($1::int[]) p",
        list(pids),
    )
    return int(rows[0]["n"])


def fired(worker: Worker, point: str) -> bool:
    """The worker logged that its armed fault ``point`` fired (ackline.core.faults)."""
    return f"fault point {point} fired" in worker.log()


def killed_by_point(worker: Worker, point: str, timeout: float = 60) -> None:
    """Wait for a worker armed with ``point=kill`` to die there."""
    wait_until(lambda: worker.proc.poll() is not None, timeout, f"the armed kill at {point}")
    assert worker.reap() == -signal.SIGKILL, worker.log()[-3000:]
    assert fired(worker, point), worker.log()[-3000:]


# --- Kafka side -------------------------------------------------------------------------


def _plain_consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
        }
    )


def commit_kafka_offsets(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit ``offsets`` for ``group`` from outside the group (assign + commit).

    The coordinator accepts such a commit only while the group has no live member, so
    this retries until the members of a killed worker have expired.
    """
    consumer = _plain_consumer(bootstrap, group)
    tps = [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())]
    consumer.assign(tps)

    def commit() -> bool:
        try:
            consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException:
            return False
        return True

    try:
        wait_until(commit, 60, f"Kafka to accept a commit for group {group}", interval=0.5)
    finally:
        consumer.close()


def kafka_committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = _plain_consumer(bootstrap, group)
    try:
        got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 10)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in got if tp.offset >= 0}


def watermarks(
    bootstrap: str, topic: str, partitions: int, timeout: float = 10.0
) -> dict[int, tuple[int, int]]:
    """(low, high) of each partition. A leader not answering yet (a topic just made:
    NOT_LEADER_FOR_PARTITION; a flake of `make test` on 2026-12-06) is asked again until
    ``timeout``, as the worker's own reads of a partition's end are."""
    consumer = _plain_consumer(bootstrap, f"watermarks-{uuid.uuid4().hex[:8]}")
    deadline = time.monotonic() + timeout
    found: dict[int, tuple[int, int]] = {}
    try:
        for p in range(partitions):
            while True:
                try:
                    found[p] = consumer.get_watermark_offsets(
                        TopicPartition(topic, p), timeout=timeout
                    )
                    break
                except KafkaException as exc:
                    if not end_not_ready(exc) or time.monotonic() >= deadline:
                        raise
                    time.sleep(0.2)
        return found
    finally:
        consumer.close()


def read_topic(bootstrap: str, topic: str, expected: int, timeout: float = 60) -> list[Message]:
    """At least ``expected`` records of ``topic`` from the beginning (a throwaway group)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[Message] = []

    def more() -> bool:
        got.extend(m for m in consumer.consume(500, timeout=0.5) if m.error() is None)
        return len(got) >= expected

    try:
        wait_until(more, timeout, f"{expected} records on {topic}", interval=0)
    finally:
        consumer.close()
    return got


def write_manifest(path: Path, header: ManifestHeader, records: Iterable[ManifestRecord]) -> Path:
    with ManifestWriter(path, header) as writer:
        for rec in records:
            writer.write(rec)
    return path


def split_by_retention(
    records: Iterable[ManifestRecord], stored: dict[int, int], cut: dict[int, int]
) -> tuple[list[ManifestRecord], int]:
    """The records retention left readable (those outside ``[stored, cut)`` of their
    partition), and how many committed records it deleted.

    By (partition, offset), never by ``seq``: an aborted copy has the seq of its committed
    twin (ackline.load.generate), which may sit past the cut and be read and ingested.
    Removing the twin by seq made its row "beyond" the manifest and a surviving copy of
    it the expected winner: test_window_17 failed now and then (lost 1, duplicated 3)."""
    kept: list[ManifestRecord] = []
    deleted = 0
    for r in records:
        if stored.get(r.partition, -1) <= r.offset < cut.get(r.partition, -1):
            deleted += r.committed
        else:
            kept.append(r)
    return kept, deleted


# --- hand-made scenarios ----------------------------------------------------------------


def step(
    i: int,
    *,
    thought: str = "plan",
    txn: str | None = None,
    eid: uuid.UUID | None = None,
    agent: str = "agent-1",
    at: datetime = T0,
) -> Envelope:
    """A small valid ``agent.step`` event (txn_id ``run-1:<i>`` unless given)."""
    return new_envelope(
        "agent.step",
        txn_id=txn or f"run-1:{i}",
        agent_id=agent,
        request_id="req-1",
        payload={"run_id": "run-1", "step": i, "thought": thought},
        occurred_at=at,
        event_id=eid,
    )


def changed(env: Envelope, *, txn: str | None = None, eid: uuid.UUID | None = None) -> Envelope:
    """``env`` with another body (occurred_at moved), and the given txn_id / event_id."""
    return env.model_copy(
        update={
            "occurred_at": env.occurred_at + timedelta(milliseconds=7),
            "txn_id": txn or env.txn_id,
            "event_id": eid or env.event_id,
        }
    )


@dataclass(frozen=True)
class Item:
    """One record to send and what the sink must make of it (a manifest line)."""

    kind: str
    value: bytes
    key: bytes | None
    event_id: str | None = None
    txn_id: str | None = None
    body_hash: str | None = None
    poison: str | None = None
    partition: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()  # sent after content-type

    @classmethod
    def event(cls, env: Envelope, kind: str = "original", partition: int | None = None) -> Item:
        return cls(
            kind,
            serialize(env),
            env.agent_id.encode(),
            str(env.event_id),
            env.txn_id,
            hash_envelope(env).hex(),
            partition=partition,
        )

    @classmethod
    def bad(
        cls,
        value: bytes,
        reason: str,
        partition: int | None = None,
        headers: tuple[tuple[str, bytes], ...] = (),
    ) -> Item:
        return cls("poison", value, b"agent-1", poison=reason, partition=partition, headers=headers)


class Scenario:
    """Sends hand-made transactions and writes a manifest ``ackline.load.verify`` understands.

    ``base`` (a manifest of the same topic) is copied first, so a scenario can extend a
    generated run with replays.
    """

    def __init__(self, bootstrap: str, topic: str, path: Path, base: Path | None = None) -> None:
        self.topic = topic
        self.path = path
        self._producer = ActivityProducer(bootstrap, topic, f"scenario-{uuid.uuid4().hex[:8]}")
        self._producer.start()
        self.records: list[ManifestRecord] = []
        self.header = ManifestHeader(
            run_id=uuid.uuid4().hex[:12],
            topic=topic,
            seed=0,
            partitions=0,
            events=0,
            txn_size=0,
            knobs={},
            created_at=datetime.now(UTC).isoformat(),
        )
        if base is not None:
            old = read_manifest(base)
            self.header = old.header
            self.records = list(old.records)
        self._transaction = max((r.transaction for r in self.records), default=-1) + 1

    def send(self, items: list[Item], abort: bool = False) -> list[ManifestRecord]:
        """One transaction of ``items`` (flushed, then aborted when ``abort``)."""
        client = self._producer.client
        reports: list[tuple[int, int]] = [(-1, -1)] * len(items)
        errors: list[KafkaError] = []

        def hook(i: int) -> Any:
            def on_delivery(err: KafkaError | None, msg: Message) -> None:
                if err is not None:
                    errors.append(err)
                else:
                    reports[i] = (msg.partition() or 0, msg.offset() or 0)

            return on_delivery

        client.begin_transaction()
        for i, item in enumerate(items):
            headers: list[tuple[str, str | bytes | None]] = [
                ("content-type", CONTENT_TYPE),
                *item.headers,
            ]
            extra: dict[str, Any] = {} if item.partition is None else {"partition": item.partition}
            client.produce(
                self.topic,
                value=item.value,
                key=item.key,
                headers=headers,
                on_delivery=hook(i),
                **extra,
            )
        client.flush(30)
        if abort:
            self._producer.abort()
        else:
            client.commit_transaction(30)
        assert not errors, errors
        added = []
        for item, (partition, offset) in zip(items, reports, strict=True):
            added.append(
                ManifestRecord(
                    seq=len(self.records),
                    kind=item.kind,
                    partition=partition,
                    offset=offset,
                    committed=not abort,
                    event_id=item.event_id,
                    txn_id=item.txn_id,
                    body_hash=item.body_hash,
                    poison=item.poison,
                    transaction=self._transaction,
                    size=len(item.value),
                )
            )
            self.records.append(added[-1])
        self._transaction += 1
        return added

    def write(self) -> Path:
        """Write the manifest of every record sent so far; return its path."""
        return write_manifest(self.path, self.header, self.records)

    def close(self) -> None:
        self._producer.close()
