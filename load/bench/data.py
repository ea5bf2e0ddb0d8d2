"""The bench's data: generated once, kept as capture files, replayed into fresh topics.

* ``events-<N>.ackcap``: N original events (no faults) made by :func:`ackline.load.produce.produce`
  into a scratch topic on the first run, then captured; later runs reuse the file (the
  seed is fixed, so it is the same events).
* ``events-<N>.connect.ackcap``: the same records with each value wrapped as schema'd
  JSON (``{"schema": ..., "payload": ...}``), which the Debezium JDBC sink needs (it
  cannot write schemaless JSON). Made before any timing; Kafka Connect reads its own
  topic filled from this file, so the conversion is not part of its time.
* ``replay-<N>.ackcap`` (and ``.connect``): the whole topic again, every 100th record's
  body changed (``occurred_at`` one millisecond later, same ``event_id`` and ``txn_id``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from ackline.load.capture.file import CapturedRecord, CaptureReader, CaptureWriter
from ackline.load.capture.topics import RangeSpec, capture
from ackline.load.produce import Knobs, produce
from ackline.streams.admin import delete_topic, ensure_topic
from ackline.streams.errors import StreamError

SEED: Final = 20_240_501
CHANGE_EVERY: Final = 100
CLEAN: Final = Knobs(
    redeliver=0.0, retry=0.0, conflict_ledger=0.0, conflict_pk=0.0, poison=0.0, abort=0.0
)
_TS = "%Y-%m-%dT%H:%M:%S.%fZ"


def _field(name: str, type_: str, semantic: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"field": name, "type": type_, "optional": False}
    if semantic:
        out["name"] = semantic
    return out


CONNECT_SCHEMA: Final = {
    "type": "struct",
    "name": "ackline.activity",
    "optional": False,
    "fields": [
        _field("event_id", "string", "io.debezium.data.Uuid"),
        _field("txn_id", "string"),
        _field("type", "string"),
        _field("agent_id", "string"),
        _field("request_id", "string"),
        _field("occurred_at", "string", "io.debezium.time.ZonedTimestamp"),
        _field("schema_version", "int32"),
        _field("payload", "string", "io.debezium.data.Json"),
    ],
}


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def to_connect(value: bytes) -> bytes:
    """An event's JSON as Connect's schema'd JSON (the payload as JSON text)."""
    event = json.loads(value)
    row = {k: event[k] for k in ("event_id", "txn_id", "type", "agent_id", "request_id")}
    row["occurred_at"] = event["occurred_at"]
    row["schema_version"] = event["schema_version"]
    row["payload"] = _dumps(event["payload"]).decode()
    return _dumps({"schema": CONNECT_SCHEMA, "payload": row})


def changed(value: bytes) -> bytes:
    """The same event (same event_id and txn_id) with ``occurred_at`` 1 ms later."""
    event = json.loads(value)
    moment = datetime.strptime(event["occurred_at"], _TS) + timedelta(milliseconds=1)
    event["occurred_at"] = moment.strftime(_TS)
    return _dumps(event)


def event_id_of(value: bytes) -> str:
    """The event_id of an event, plain or schema'd."""
    event = json.loads(value)
    return str(event["payload"]["event_id"] if "schema" in event else event["event_id"])


@dataclass(frozen=True)
class Dataset:
    events: int
    capture: Path
    connect_capture: Path
    replay_capture: Path
    connect_replay_capture: Path

    def changed_ids(self) -> dict[str, str]:
        """event_id -> the changed occurred_at, for the records the replay changes."""
        out: dict[str, str] = {}
        with CaptureReader(self.replay_capture) as reader:
            for i, rec in enumerate(reader):
                if i % CHANGE_EVERY == 0 and rec.value is not None:
                    event = json.loads(rec.value)
                    out[event["event_id"]] = event["occurred_at"]
        return out


def _transform(
    source: Path, target: Path, fn: Callable[[int, CapturedRecord], CapturedRecord]
) -> None:
    if target.is_file():
        return
    with CaptureReader(source) as reader:
        header = reader.header
        with CaptureWriter(target, header) as writer:
            for i, rec in enumerate(reader):
                writer.write(fn(i, rec))


def _wrap(i: int, rec: CapturedRecord) -> CapturedRecord:
    return replace(rec, value=to_connect(rec.value or b"{}"))


def _change(i: int, rec: CapturedRecord) -> CapturedRecord:
    if i % CHANGE_EVERY or rec.value is None:
        return rec
    return replace(rec, value=changed(rec.value))


def prepare(bootstrap: str, events: int, data_dir: Path, log: Callable[[str], None]) -> Dataset:
    """Make (or reuse) the four capture files of ``events`` events."""
    data_dir.mkdir(parents=True, exist_ok=True)
    base = data_dir / f"events-{events}.ackcap"
    if not base.is_file():
        scratch = f"bench-generate-{events}"
        log(f"generating {events:,} events with ackline.load.produce (first run only)")
        ensure_topic_patiently(bootstrap, scratch, 12)
        produce(
            bootstrap,
            scratch,
            partitions=12,
            events=events,
            knobs=CLEAN,
            seed=SEED,
            manifest_path=data_dir / f"manifest-{events}.jsonl.gz",
            progress=True,
            namespace="bench",
        )
        capture(bootstrap, scratch, base, RangeSpec())
        delete_topic(bootstrap, scratch)
    log("preparing the schema'd-JSON copy (for Kafka Connect) and the changed replay")
    connect = data_dir / f"events-{events}.connect.ackcap"
    again = data_dir / f"replay-{events}.ackcap"
    connect_again = data_dir / f"replay-{events}.connect.ackcap"
    _transform(base, connect, _wrap)
    _transform(base, again, _change)
    _transform(again, connect_again, _wrap)
    return Dataset(events, base, connect, again, connect_again)


def ensure_topic_patiently(
    bootstrap: str,
    topic: str,
    partitions: int,
    config: dict[str, str] | None = None,
    tries: int = 10,
) -> None:
    """ensure_topic, retried: a broker that has just started may not show a new topic in
    its metadata at once ("created but is not visible")."""
    for attempt in range(tries):
        try:
            ensure_topic(bootstrap, topic, partitions, config)
            return
        except StreamError:
            if attempt == tries - 1:
                raise
            time.sleep(2.0)


def head(path: Path, count: int, skip: int = 0) -> Iterator[CapturedRecord]:
    """Records ``skip .. skip+count`` of a capture file."""
    with CaptureReader(path) as reader:
        for i, rec in enumerate(reader):
            if i >= skip + count:
                return
            if i >= skip:
                yield rec


__all__ = ["CHANGE_EVERY", "Dataset", "changed", "event_id_of", "head", "prepare", "to_connect"]
