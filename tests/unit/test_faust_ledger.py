"""The faust runtime's pure parts: the ledger's admission and offsets, and batch drafting."""

from __future__ import annotations

from ackline.schemas.canonical import canonical_json
from ackline.schemas.decode import DEFAULT_LIMITS
from ackline.schemas.envelope import new_envelope
from ackline.sinks.ingest.batch import PartitionRange
from ackline.sinks.ingest.offsets import Claim
from ackline.streams.faust_runtime.batching import Record, draft_batch, headers_of
from ackline.streams.faust_runtime.ledger import NO_GENERATION, Admit, Ledger

T = "topic"


def _ledger(generation: int = 7, **next_offsets: int | None) -> Ledger:
    ledger = Ledger()
    claims = [Claim(T, int(p[1:]), off, epoch=3) for p, off in next_offsets.items()]
    ledger.claimed(generation, claims)
    return ledger


def test_nothing_is_admitted_before_a_claim() -> None:
    ledger = Ledger()
    assert ledger.generation == NO_GENERATION
    assert ledger.admit((T, 0), 0, 0) is Admit.STALE
    assert ledger.admit((T, 0), 0, NO_GENERATION) is Admit.UNOWNED


def test_admission_order_of_checks() -> None:
    ledger = _ledger(p0=10, p1=None)
    assert ledger.admit((T, 0), 12, generation=6) is Admit.STALE  # fetched before the claim
    assert ledger.admit((T, 2), 12, generation=7) is Admit.UNOWNED
    assert ledger.admit((T, 0), 9, generation=7) is Admit.COMMITTED  # PostgreSQL has it
    assert ledger.admit((T, 0), 10, generation=7) is Admit.TAKE
    assert ledger.admit((T, 0), 10, generation=7) is Admit.REPEAT  # delivered twice
    assert ledger.admit((T, 0), 13, generation=7) is Admit.TAKE  # a gap: markers
    assert ledger.admit((T, 0), 11, generation=7) is Admit.REPEAT  # never backwards
    assert ledger.admit((T, 1), 0, generation=7) is Admit.TAKE  # no DB offset yet


def test_kafka_commits_never_pass_the_db_offset() -> None:
    ledger = _ledger(p0=10, p1=None)
    assert ledger.commit_targets() == {(T, 0): 10}  # where PostgreSQL says it resumes
    ledger.kafka_committed({(T, 0): 10})
    assert ledger.commit_targets() == {}
    for offset in range(10, 20):
        assert ledger.admit((T, 0), offset, 7) is Admit.TAKE
    assert ledger.commit_targets() == {}  # taken (even acked) is not committed
    ledger.committed([PartitionRange(T, 0, 10, 20, epoch=3)])
    assert ledger.commit_targets() == {(T, 0): 20}
    assert ledger.commit_targets([(T, 1)]) == {}  # only the partitions asked for


def test_a_commit_under_an_old_epoch_moves_nothing() -> None:
    ledger = _ledger(p0=10)
    ledger.committed([PartitionRange(T, 0, 10, 50, epoch=2)])
    assert ledger.resume_offsets() == {(T, 0): 10}


def test_a_new_claim_replaces_everything() -> None:
    ledger = _ledger(p0=10, p1=5)
    ledger.claimed(8, [Claim(T, 1, 40, epoch=4)])
    assert ledger.owned() == {(T, 1): 4}
    assert ledger.resume_offsets() == {(T, 1): 40}
    assert ledger.admit((T, 0), 10, 8) is Admit.UNOWNED
    assert ledger.admit((T, 1), 39, 8) is Admit.COMMITTED


def test_fencing_forgets_only_partitions_held_under_the_batch_epoch() -> None:
    ledger = _ledger(p0=10, p1=10)
    ranges = [PartitionRange(T, 0, 10, 20, epoch=3), PartitionRange(T, 1, 10, 20, epoch=2)]
    gone = ledger.forget_fenced(ranges, [(T, 0), (T, 1)])
    assert gone == [(T, 0)]  # p1 was claimed again (epoch 3) after the batch was read
    assert ledger.owned() == {(T, 1): 3}


def test_release_drops_ownership() -> None:
    ledger = _ledger(p0=10, p1=10)
    ledger.release([(T, 0)])
    assert ledger.admit((T, 0), 10, 7) is Admit.UNOWNED
    assert ledger.admit((T, 1), 10, 7) is Admit.TAKE


def _event_bytes(txn: str) -> bytes:
    env = new_envelope(
        "tool.called",
        txn,
        "agent-1",
        "req-1",
        {"run_id": "run-1", "call_id": "call-1", "tool": "web.search", "arguments": {}},
    )
    return canonical_json(env.model_dump(mode="json"))


def _rec(partition: int, offset: int, value: bytes | None, generation: int = 7) -> Record:
    return Record(T, partition, offset, b"k", value, [("h", b"v")], generation)


def test_draft_takes_admitted_records_and_keeps_poison() -> None:
    ledger = _ledger(p0=10, p1=None)
    records = [
        _rec(0, 9, b"{}"),  # committed: dropped
        _rec(0, 10, b"not json"),  # poison
        _rec(1, 0, b"{}", generation=6),  # stale: dropped
        _rec(1, 1, b"\xff"),
        _rec(0, 11, _event_bytes("txn-1")),
        _rec(0, 12, b"{}"),
    ]
    draft = draft_batch(records, ledger, DEFAULT_LIMITS)
    assert draft.dropped == {"committed": 1, "stale": 1}
    assert [p.coord.offset for p in draft.poison] == [10, 1, 12]
    assert draft.poison[0].headers == [("h", b"v")] and draft.poison[0].key == b"k"
    assert draft.batch.ranges == (
        PartitionRange(T, 0, 10, 13, epoch=3),
        PartitionRange(T, 1, 1, 2, epoch=3),
    )
    assert [(i.coord.partition, i.coord.offset) for i in draft.batch.events] == [(0, 11)]
    assert draft.batch.events[0].row.txn_id == "txn-1"


def test_draft_of_nothing_admitted_is_empty() -> None:
    ledger = _ledger(p0=10)
    draft = draft_batch([_rec(0, 3, b"{}"), _rec(2, 3, b"{}")], ledger, DEFAULT_LIMITS)
    assert draft.empty and draft.dropped == {"committed": 1, "unowned": 1}


def test_headers_of_accepts_the_shapes_faust_hands() -> None:
    assert headers_of(None) == []
    assert headers_of([("a", b"1")]) == [("a", b"1")]
    assert headers_of({"a": b"1"}) == [("a", b"1")]
