"""The chaos producer's top-up (ackline.load.chaos.topup): production held open past its plan."""

from __future__ import annotations

import functools
import json
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ackline.load import produce
from ackline.load.chaos import harness
from ackline.load.chaos.pacing import Pacer
from ackline.load.generate import Knobs, generate
from ackline.load.manifest import read_manifest
from ackline.load.verify import expected_outcome

CLEAN = Knobs(redeliver=0, retry=0, conflict_ledger=0, conflict_pk=0, poison=0, abort=0)
"""Every record an original: the plan of N events is N records."""
PLANNED = 40


class _Message:
    def __init__(self, partition: int, offset: int) -> None:
        self._at = partition, offset

    def partition(self) -> int:
        return self._at[0]

    def offset(self) -> int:
        return self._at[1]


class _LaggingRun:
    """Kafka for the production child, and the harness of a run whose faults lag its
    ingest: its last COMMIT fault is left to fire once the plan's records are all
    committed, and fires at the first COMMIT after that; then the faults are done and the
    harness lets production end (removes the hold file)."""

    def __init__(self, hold: Path) -> None:
        self.hold = hold
        self.committed = 0
        self.fired = False
        self.ends: dict[int, int] = Counter()
        self.queued: list[tuple[Callable[[Any, Any], None], _Message]] = []

    def producer(self, *_args: Any, **_kwargs: Any) -> _LaggingRun:
        return self

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    @property
    def client(self) -> _LaggingRun:
        return self

    def poll(self, _timeout: float) -> None:
        pass

    def flush(self, _timeout: float) -> None:
        pass

    def send_bytes(
        self, key: bytes, _value: bytes, _headers: Any, on_delivery: Callable[[Any, Any], None]
    ) -> None:
        partition = zlib.crc32(key) % 12
        self.queued.append((on_delivery, _Message(partition, self.ends[partition])))
        self.ends[partition] += 1

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self.queued.clear()
        yield
        for report, message in self.queued:
            report(None, message)
        if self.committed >= PLANNED and self.hold.exists():
            self.fired = True  # a COMMIT in flight, cut
            self.hold.unlink()
        self.committed += len(self.queued)


def test_a_commit_fault_left_when_the_plan_is_done_finds_production_going_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh-clone run (faust, seed 1199904273) failed its coverage though exactly once
    held: its faults lagged the ingest, production ended before the last COMMIT fault,
    which found nothing left to commit ("2 of 3"). Production is now held open until the
    faults are done; what it sends past its plan is in the manifest, expected like the
    rest, and in the summary the harness measures progress by."""
    run = _LaggingRun(tmp_path / "produce.hold")
    run.hold.touch()  # the harness holds production while a fault is left
    monkeypatch.setattr(produce, "ensure_topic", lambda *_args, **_kwargs: 12)
    monkeypatch.setattr(produce, "topic_config_for", lambda *_args, **_kwargs: None)
    monkeypatch.setattr(produce, "ActivityProducer", run.producer)
    monkeypatch.setattr(harness, "Pacer", functools.partial(Pacer, sleep=lambda _s: None))
    args = {
        "bootstrap": "127.0.0.1:1",
        "topic": "t",
        "partitions": 12,
        "events": PLANNED,
        "knobs": CLEAN.as_dict(),
        "seed": 7,
        "manifest": str(tmp_path / "manifest.jsonl.gz"),
        "summary": str(tmp_path / "produced.json"),
        "rate": 0.0,
        "pause": str(tmp_path / "produce.pause"),
        "paused": str(tmp_path / "produce.paused"),
        "hold": str(run.hold),
    }
    harness._produce_child(args)
    assert run.fired, "the COMMIT fault left to fire found nothing to commit"
    records = read_manifest(Path(args["manifest"])).records
    summary = json.loads(Path(args["summary"]).read_text())
    assert len(records) == summary["committed"] == run.committed > PLANNED
    assert [r.seq for r in records] == list(range(len(records)))
    expected = expected_outcome(records)
    assert expected.unique_expected == len(records) and expected.inconsistent == 0


def test_further_plans_are_numbered_on_with_ids_of_their_own() -> None:
    """The manifest stays one sequence: seqs and transactions go on from the plan's, a
    variant still points at its own original, and no event id repeats."""
    from ackline.load.chaos.topup import TOP_UP_EVENTS, held_open  # new with the top-up

    holds = iter([True, True, False])
    sends = list(held_open(generate(300, seed=3), lambda: next(holds), Knobs(), 3, "ns"))
    committed = [s for s in sends if not s.aborted]
    assert [s.seq for s in committed] == list(range(len(committed)))
    assert len(committed) > 300 + 2 * TOP_UP_EVENTS
    numbers = [s.transaction for s in sends]
    assert numbers == sorted(numbers) and len(set(numbers)) == numbers[-1] + 1
    by_seq = {s.seq: s for s in committed}
    for s in committed:
        if s.original_index is not None:
            original = by_seq[s.original_index]
            assert original.kind == "original" and original.key == s.key
    ids = [s.event_id for s in committed if s.kind == "original"]
    assert len(ids) == len(set(ids))
