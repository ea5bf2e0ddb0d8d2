"""Send a generated plan to Kafka in transactions and record the manifest.

:func:`produce` creates the topic if needed, starts a transactional
:class:`~ackline.streams.producer.ActivityProducer`, and sends the
:func:`ackline.load.generate.generate` plan transaction by transaction. Planned aborts
are real: the records are sent and flushed (so they occupy offsets), then the
transaction is aborted; the committed re-send follows. Every record's delivery report
(partition, offset) goes into the manifest, which :mod:`ackline.load.verify` later
compares with the database.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from confluent_kafka import KafkaError, KafkaException, Message

from ackline.load.errors import LoadError
from ackline.load.generate import Knobs, Send, generate
from ackline.load.manifest import ManifestHeader, ManifestRecord, ManifestWriter
from ackline.load.paths import check_target
from ackline.streams.admin import ensure_topic, topic_config_for
from ackline.streams.errors import StreamError
from ackline.streams.producer import LIBRDKAFKA_MESSAGE_MAX_BYTES, ActivityProducer

__all__ = ["Knobs", "ProduceSummary", "produce"]

_HEADROOM = 64 * 1024


class _PlannedAbort(Exception):
    """Raised inside ``producer.transaction()`` to abort it on purpose."""


@dataclass(frozen=True)
class ProduceSummary:
    run_id: str
    topic: str
    partitions: int
    manifest_path: Path
    transactional_id: str
    records: int
    """Every record sent, aborted ones included."""
    committed_records: int
    aborted_records: int
    transactions: int
    aborted_transactions: int
    by_kind: dict[str, int] = field(default_factory=dict)
    """Committed records per kind (original, redelivery, retry, conflict_*, poison)."""
    poison_by_reason: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def originals(self) -> int:
        return self.by_kind.get("original", 0)

    def render(self) -> str:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(self.by_kind.items()))
        lines = [
            f"produced {self.records:,} records to {self.topic} ({self.partitions} partitions) "
            f"in {self.seconds:.1f} s, {rate:,.0f} records/s",
            f"  committed   {self.committed_records:,} in "
            f"{self.transactions - self.aborted_transactions:,} transactions: {kinds}",
            f"  aborted     {self.aborted_records:,} in {self.aborted_transactions:,} "
            "transactions (re-sent, committed, right after)",
        ]
        if self.poison_by_reason:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.poison_by_reason.items()))
            lines.append(f"  poison      {reasons}")
        lines.append(f"  manifest    {self.manifest_path}  (run {self.run_id})")
        return "\n".join(lines)


class _Bar:
    """A one-line ``\\r`` progress bar on stderr; silent when disabled or not a TTY."""

    def __init__(self, total: int, enabled: bool, stream: TextIO) -> None:
        self.total = max(total, 1)
        self.stream = stream
        self.enabled = enabled and stream.isatty()
        self.start = time.monotonic()
        self.last = 0.0

    def update(self, done: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.last < 0.1:
            return
        self.last = now
        frac = min(done / self.total, 1.0)
        filled = int(frac * 30)
        rate = done / max(now - self.start, 1e-9)
        self.stream.write(
            f"\rproduce [{'#' * filled}{'.' * (30 - filled)}] {frac:6.1%} "
            f"{done:,}/{self.total:,} events {rate:,.0f} events/s\x1b[K"
        )
        self.stream.flush()

    def close(self, done: int) -> None:
        if self.enabled:
            self.update(done, force=True)
            self.stream.write("\n")
            self.stream.flush()


@dataclass
class _Report:
    partition: int = -1
    offset: int = -1
    error: str | None = None
    arrived: bool = False


def _hook(reports: list[_Report], i: int) -> Callable[[KafkaError | None, Message], None]:
    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        rep = reports[i]
        rep.arrived = True
        partition = msg.partition() if msg is not None else None
        offset = msg.offset() if msg is not None else None
        rep.partition = partition if partition is not None else -1
        if err is not None:
            rep.error = str(err)
        elif offset is None or offset < 0:
            rep.error = "the delivery report has no offset"
        else:
            rep.offset = offset

    return on_delivery


def produce(
    bootstrap: str,
    topic: str,
    partitions: int,
    events: int,
    knobs: Knobs | None = None,
    seed: int = 1,
    manifest_path: Path = Path(".ackline/manifest.jsonl.gz"),
    transactional_id: str | None = None,
    txn_size: int = 500,
    progress: bool = True,
    *,
    namespace: str | None = None,
    run_id: str | None = None,
    out: TextIO | None = sys.stderr,
    client_conf: dict[str, Any] | None = None,
    pace: Callable[[int], None] | None = None,
    overwrite: bool = True,
    extend: Callable[[Iterable[Send]], Iterable[Send]] | None = None,
) -> ProduceSummary:
    """Produce ``events`` originals plus their faults to ``topic``; write the manifest.

    ``namespace`` (default: the run id, random) is mixed into the generator's seed so
    runs against one database never share ids; pass it (with ``seed``) to reproduce a
    run's bytes exactly. The summary is printed to ``out`` (None: silent). ``pace`` is
    called after each transaction with the originals sent so far (it may sleep: the
    chaos harness spreads production over its run that way). ``extend`` makes the sends
    of the plan (the chaos harness holds it open past its end while its faults need work,
    :mod:`ackline.load.chaos.topup`); the manifest records them all. The manifest path is
    checked before anything is sent (TargetError): it must be writable, and an existing
    manifest is replaced only with ``overwrite``. The counts are checked before that
    (LoadError); the manifest's missing folders are made once Kafka has answered.
    """
    if partitions < 1:
        raise LoadError(f"partitions must be >= 1, not {partitions}")
    knobs = knobs or Knobs()
    run_id = run_id or uuid.uuid4().hex[:12]
    namespace = run_id if namespace is None else namespace
    # made now: it checks events and txn_size, which went to Kafka first
    plan: Iterable[Send] = generate(events, knobs, seed, txn_size=txn_size, namespace=namespace)
    if extend is not None:
        plan = extend(plan)
    check_target(Path(manifest_path), what="manifest", overwrite=overwrite)
    transactional_id = transactional_id or f"ackline-load-{run_id}"
    # oversize poison: the topic is made to take it, and never narrower than the broker's
    # own topics (it set librdkafka's 1,000,000 there, below Kafka's 1,048,588)
    need = knobs.oversize_bytes + _HEADROOM if knobs.poison > 0 else None
    message_max = max(LIBRDKAFKA_MESSAGE_MAX_BYTES, need or 0)
    try:
        topic_config = topic_config_for(bootstrap, need, conf=client_conf)
        actual = ensure_topic(bootstrap, topic, partitions, topic_config, conf=client_conf)
    except StreamError as exc:
        raise LoadError(f"cannot prepare topic {topic}: {exc}") from exc
    header = ManifestHeader(
        run_id=run_id,
        topic=topic,
        seed=seed,
        partitions=actual,
        events=events,
        txn_size=txn_size,
        knobs=knobs.as_dict(),
        created_at=datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        namespace=namespace,
        transactional_id=transactional_id,
    )
    producer = ActivityProducer(  # client_conf: security (ackline.clients.kafka_client_config)
        bootstrap,
        topic,
        transactional_id,
        extra={**(client_conf or {}), "message.max.bytes": message_max},
    )
    try:
        producer.start()
    except StreamError as exc:
        raise LoadError(f"cannot start the producer: {exc}") from exc
    started = time.monotonic()
    bar = _Bar(events, progress, sys.stderr)
    tally = _Tally()
    try:
        with ManifestWriter(Path(manifest_path), header) as writer:
            for _, group in itertools.groupby(plan, key=lambda s: s.transaction):
                sends = list(group)
                reports = _send_transaction(producer, sends)
                tally.add(sends, reports, writer)
                bar.update(tally.originals)
                if pace is not None:
                    pace(tally.originals)
    except (StreamError, KafkaException) as exc:
        raise LoadError(f"produce failed after {tally.records} records: {exc}") from exc
    finally:
        bar.close(tally.originals)
        with contextlib.suppress(KafkaException):
            producer.close()
    summary = ProduceSummary(
        run_id=run_id,
        topic=topic,
        partitions=actual,
        manifest_path=Path(manifest_path),
        transactional_id=transactional_id,
        records=tally.records,
        committed_records=tally.committed,
        aborted_records=tally.records - tally.committed,
        transactions=tally.transactions,
        aborted_transactions=tally.aborted_transactions,
        by_kind=dict(tally.by_kind),
        poison_by_reason=dict(tally.poison),
        seconds=time.monotonic() - started,
    )
    if out is not None:
        print(summary.render(), file=out, flush=True)
    return summary


def _send_transaction(producer: ActivityProducer, sends: list[Send]) -> list[_Report]:
    """Send one planned transaction; commit it, or flush then abort it when planned so."""
    reports = [_Report() for _ in sends]
    aborted = sends[0].aborted
    client = producer.client
    try:
        with producer.transaction():
            for i, item in enumerate(sends):
                producer.send_bytes(item.key, item.value, list(item.headers), _hook(reports, i))
                if i % 1000 == 999:
                    client.poll(0)
            if aborted:
                client.flush(60)  # the records land (and take offsets) before the abort
                raise _PlannedAbort
    except _PlannedAbort:
        pass
    if any(not r.arrived for r in reports):
        client.flush(60)
    missing = sum(not r.arrived for r in reports)
    if missing:
        raise LoadError(f"{missing} delivery reports did not arrive")
    if not aborted:
        failed = [r.error for r in reports if r.error is not None]
        if failed:
            raise LoadError(f"{len(failed)} records of a committed transaction failed: {failed[0]}")
    return reports


class _Tally:
    def __init__(self) -> None:
        self.records = 0
        self.committed = 0
        self.originals = 0
        self.transactions = 0
        self.aborted_transactions = 0
        self.by_kind: Counter[str] = Counter()
        self.poison: Counter[str] = Counter()

    def add(self, sends: list[Send], reports: list[_Report], writer: ManifestWriter) -> None:
        committed = not sends[0].aborted
        self.transactions += 1
        self.aborted_transactions += not committed
        for item, rep in zip(sends, reports, strict=True):
            offset = rep.offset if rep.error is None else -1
            writer.write(ManifestRecord.from_send(item, rep.partition, offset))
            self.records += 1
            if committed:
                self.committed += 1
                self.by_kind[item.kind] += 1
                self.originals += item.kind == "original"
                if item.poison_reason is not None:
                    self.poison[item.poison_reason] += 1
