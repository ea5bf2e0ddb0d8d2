"""The ownership ledger and the batch assembler both runtimes share. Pure, no services."""

from __future__ import annotations

from ackline.schemas.canonical import canonical_json
from ackline.schemas.decode import DEFAULT_LIMITS
from ackline.schemas.envelope import new_envelope
from ackline.sinks.ingest.batch import PartitionRange
from ackline.sinks.ingest.offsets import Claim
from ackline.streams.assemble import Record, draft_batch, headers_of
from ackline.streams.faust_runtime.sink import chunks
from ackline.streams.ownership import (
    NO_GENERATION,
    RETAKE_MAX_S,
    Admit,
    Ledger,
    Rewind,
    marks_past_retention,
    past_log_end,
)

T = "topic"


def _ledger(generation: int = 7, **next_offsets: int | None) -> Ledger:
    ledger = Ledger()
    claims = [Claim(T, int(p[1:]), off, epoch=3) for p, off in next_offsets.items()]
    ledger.claimed(claims, generation, replace=True)
    return ledger


def _rows(epoch: int = 3, **next_offsets: int | None) -> dict[tuple[str, int], Claim]:
    return {(T, int(p[1:])): Claim(T, int(p[1:]), off, epoch) for p, off in next_offsets.items()}


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


def test_confluent_claims_add_to_what_is_owned() -> None:
    ledger = Ledger()
    ledger.claimed([Claim(T, 0, 5, 1)])
    ledger.claimed([Claim(T, 1, 7, 1)])
    assert ledger.owned() == {(T, 0): 1, (T, 1): 1}
    assert ledger.admit((T, 0), 5) is Admit.TAKE  # no generation on this runtime


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


def test_a_new_eager_claim_replaces_everything() -> None:
    ledger = _ledger(p0=10, p1=5)
    ledger.claimed([Claim(T, 1, 40, epoch=4)], 8, replace=True)
    assert ledger.owned() == {(T, 1): 4}
    assert ledger.resume_offsets() == {(T, 1): 40}
    assert ledger.admit((T, 0), 10, 8) is Admit.UNOWNED
    assert ledger.admit((T, 1), 39, 8) is Admit.COMMITTED


def test_records_refused_before_a_claim_cannot_let_its_first_batch_skip_them() -> None:
    """faust's recovery can resume the flow before an assignment's claim (the claim of
    the generation before landed after its revoke): records of the new generation,
    fetched from Kafka's committed offset, were refused while the ledger held the old
    claim, and aiokafka's position moved past them. The records fetched after them but
    before the new claim's seek were taken: the batch committed past the refused ones,
    and the re-read after the seek found them committed. 81 events lost (a review; the
    faust chaos run of CI lost 78)."""
    ledger = _ledger(generation=1, p3=1000)  # generation 1's claim, landed late
    assert {ledger.admit((T, 3), o, 2) for o in range(990, 1081)} == {Admit.STALE}
    ledger.claimed([Claim(T, 3, 1000, epoch=8)], 2, replace=True)
    # fetched before the seek to the DB offset, still queued: refused
    assert {ledger.admit((T, 3), o, 2) for o in range(1081, 1100)} == {Admit.STALE}
    # the seek took effect: the re-read from the DB offset is taken, all of it, in order
    assert {ledger.admit((T, 3), o, 2) for o in range(1000, 1100)} == {Admit.TAKE}
    assert ledger.marks() == {}


def test_only_records_of_the_claims_own_generation_make_its_mark() -> None:
    """Leftovers of an older generation refused after a claim (1000..1500) must not set
    the next claim's mark: it would be above the records that claim's generation had
    refused (1000..1080), and the first record queued after those (1081, fetched before
    the seek) would clear it and be taken (a review)."""
    ledger = _ledger(generation=5, p3=1000)
    assert {ledger.admit((T, 3), o, 4) for o in range(1000, 1501)} == {Admit.STALE}
    assert {ledger.admit((T, 3), o, 6) for o in range(1000, 1081)} == {Admit.STALE}
    ledger.claimed([Claim(T, 3, 1000, epoch=9)], 6, replace=True)
    assert ledger.marks() == {(T, 3): 1080}
    assert ledger.admit((T, 3), 1081, 6) is Admit.STALE
    # and leftovers older than what was refused in the claim's generation change nothing
    ledger = _ledger(generation=5, p3=1000)
    assert ledger.admit((T, 3), 1050, 6) is Admit.STALE
    assert ledger.admit((T, 3), 1400, 4) is Admit.STALE
    ledger.claimed([Claim(T, 3, 1000, epoch=9)], 6, replace=True)
    assert ledger.marks() == {(T, 3): 1050}


def test_records_refused_below_a_claims_db_offset_leave_no_mark() -> None:
    """What was refused lies below the DB offset: what is queued after it runs on, with no
    gap, into the claimed range, so it is taken at once (no re-read is waited for)."""
    ledger = _ledger(generation=1, p3=1000)
    assert {ledger.admit((T, 3), o, 2) for o in range(990, 1000)} == {Admit.STALE}
    ledger.claimed([Claim(T, 3, 1000, epoch=8)], 2, replace=True)
    assert ledger.marks() == {}
    assert ledger.admit((T, 3), 1000, 2) is Admit.TAKE


def test_records_of_a_partition_not_owned_yet_mark_its_next_claim() -> None:
    """The same for a partition the ledger does not hold at all under its generation,
    claimed in that generation."""
    ledger = _ledger(generation=2, p0=5)
    assert ledger.admit((T, 3), 1040, 2) is Admit.UNOWNED
    ledger.claimed([Claim(T, 3, 1000, epoch=8)], 2, replace=True)
    assert ledger.marks() == {(T, 3): 1040}
    assert ledger.admit((T, 3), 1041, 2) is Admit.STALE
    assert ledger.admit((T, 3), 1000, 2) is Admit.TAKE


def test_the_confluent_runtime_notes_nothing_before_a_claim() -> None:
    """librdkafka drops what was fetched before an assign or a seek: no mark is needed."""
    ledger = Ledger()
    assert ledger.admit((T, 0), 50) is Admit.UNOWNED
    ledger.claimed([Claim(T, 0, 10, 1)])
    assert ledger.marks() == {}


def test_item_1_a_batch_fenced_on_one_partition_rewinds_the_others() -> None:
    """Issue 11 item 1: a batch over P0 and P1 at 10..14 fenced on P0 only. P1's DB
    offset did not move, so the next P1 record taken must be 10 again (after the seek
    back), never 15: the fence would let a batch starting at 15 commit, losing 10..14."""
    ledger = _ledger(p0=10, p1=10)
    for offset in range(10, 15):
        assert ledger.admit((T, 0), offset, 7) is Admit.TAKE
        assert ledger.admit((T, 1), offset, 7) is Admit.TAKE
    ranges = [PartitionRange(T, 0, 10, 15, epoch=3), PartitionRange(T, 1, 10, 15, epoch=3)]
    fenced, rewinds = ledger.not_committed(ranges, _rows(p1=10) | _rows(4, p0=10), now=0.0)
    assert fenced == [(T, 0)] and rewinds == [Rewind((T, 1), 10)]
    assert ledger.admit((T, 1), 15, 7) is Admit.STALE  # fetched before the seek back
    assert ledger.admit((T, 1), 16, 7) is Admit.STALE
    assert ledger.admit((T, 1), 10, 7) is Admit.TAKE  # the re-read has begun
    assert ledger.admit((T, 1), 11, 7) is Admit.TAKE
    assert ledger.admit((T, 0), 15, 7) is Admit.UNOWNED  # suspended until taken back


def test_a_cancelled_batch_that_committed_rewinds_past_itself() -> None:
    ledger = _ledger(p0=10)
    for offset in range(10, 15):
        ledger.admit((T, 0), offset, 7)
    ranges = [PartitionRange(T, 0, 10, 15, epoch=3)]
    _, rewinds = ledger.not_committed(ranges, _rows(p0=15), now=0.0)
    assert rewinds == [Rewind((T, 0), 15)]
    assert ledger.admit((T, 0), 15, 7) is Admit.TAKE  # nothing to re-read: no mark
    assert ledger.admit((T, 0), 14, 7) is Admit.COMMITTED


def test_item_3_a_fenced_partition_is_taken_back_with_its_rewind_mark() -> None:
    """Issue 11 item 3: fenced on a partition Kafka still assigns here: suspended, then
    taken back under a new epoch, refusing what was fetched before the seek back."""
    ledger = _ledger(p0=10)
    for offset in range(10, 15):
        ledger.admit((T, 0), offset, 7)
    ranges = [PartitionRange(T, 0, 10, 15, epoch=3)]
    fenced, rewinds = ledger.not_committed(ranges, _rows(5, p0=10), now=100.0)
    assert fenced == [(T, 0)] and rewinds == []
    assert ledger.owned() == {} and ledger.tracked() == [(T, 0)]
    assert ledger.retakes_due(100.0) == [(T, 0)]  # the first retake is at once
    assert ledger.retake(Claim(T, 0, 10, epoch=6)) == Rewind((T, 0), 10)
    assert ledger.owned() == {(T, 0): 6}
    assert ledger.admit((T, 0), 15, 7) is Admit.STALE
    assert ledger.admit((T, 0), 10, 7) is Admit.TAKE


def test_a_retake_past_what_was_taken_refuses_what_was_fetched_while_suspended() -> None:
    """Fenced at 10..14 taken, the partition's records 15..40 were fetched and refused
    while suspended, and the late claimer committed up to 30. The retake's rewind to 30
    saw nothing taken past 30 and set no mark, so 41, fetched before the seek back, was
    taken, and 30..40 after the seek were refused as repeats: lost behind a batch the fence
    lets through. A review found it in the pure ledger; librdkafka's seek drops what was
    fetched before it in the default runtime, but nothing in the ledger relied on that."""
    ledger = _ledger(p0=10)
    for offset in range(10, 15):
        assert ledger.admit((T, 0), offset, 7) is Admit.TAKE
    ranges = [PartitionRange(T, 0, 10, 15, epoch=3)]
    ledger.not_committed(ranges, _rows(5, p0=10), now=100.0)
    for offset in range(15, 41):
        assert ledger.admit((T, 0), offset, 7) is Admit.UNOWNED
    assert ledger.retake(Claim(T, 0, 30, epoch=6)) == Rewind((T, 0), 30)
    assert ledger.admit((T, 0), 41, 7) is Admit.STALE  # fetched before the seek back
    assert [ledger.admit((T, 0), offset, 7) for offset in range(30, 42)] == [Admit.TAKE] * 12
    assert ledger.admit((T, 0), 29, 7) is Admit.COMMITTED


def test_a_retake_of_a_partition_released_or_claimed_meanwhile_changes_nothing() -> None:
    """The faust runtime's retake claims with an await; a revoke may release the
    partition meanwhile (the retake then met a KeyError, which crashed the worker's lag
    timer), or a new assignment claim it afresh (its claim is the one that stands)."""
    ledger = _ledger(p0=10, p1=10)
    ranges = [PartitionRange(T, 0, 10, 15, epoch=3), PartitionRange(T, 1, 10, 15, epoch=3)]
    ledger.not_committed(ranges, _rows(5, p0=10, p1=10), now=100.0)
    assert sorted(ledger.retakes_due(100.0)) == [(T, 0), (T, 1)]
    ledger.release([(T, 0)])  # revoked during the claim
    ledger.claimed([Claim(T, 1, 10, epoch=8)], 7)  # assigned again during the claim
    assert ledger.retake(Claim(T, 0, 10, epoch=6)) is None
    assert ledger.retake(Claim(T, 1, 10, epoch=6)) is None
    assert ledger.owned() == {(T, 1): 8}


def test_retakes_back_off_until_a_commit() -> None:
    ledger = _ledger(p0=10)
    ranges = [PartitionRange(T, 0, 10, 15, epoch=3)]
    waits = []
    now = 0.0
    for epoch in range(3, 12):
        ledger.admit((T, 0), 10, 7)
        ranges = [PartitionRange(T, 0, 10, 11, epoch=epoch)]
        ledger.not_committed(ranges, _rows(epoch + 100, p0=10), now)
        due = now
        while not ledger.retakes_due(due):
            due += 0.5
        waits.append(due - now)
        now = due
        ledger.retake(Claim(T, 0, 10, epoch=epoch + 1))
    assert waits[0] == 0 and waits == sorted(waits) and waits[-1] <= RETAKE_MAX_S
    ledger.admit((T, 0), 10, 7)
    ledger.committed([PartitionRange(T, 0, 10, 11, epoch=12)])
    ledger.not_committed([PartitionRange(T, 0, 11, 12, epoch=12)], _rows(99, p0=11), now)
    assert ledger.retakes_due(now) == [(T, 0)]  # a commit reset the back-off


def test_a_blocked_partition_is_not_consumed_until_unblocked() -> None:
    ledger = _ledger(p0=5000)
    reason = past_log_end((T, 0), 5000, 10)
    assert "past the log end" in reason
    assert ledger.block((T, 0), reason) is True and ledger.block((T, 0), reason) is False
    assert ledger.owned() == {} and ledger.blocked() == {(T, 0): reason}
    assert ledger.admit((T, 0), 3, 7) is Admit.UNOWNED
    assert ledger.unblock((T, 0)) == Rewind((T, 0), 5000)
    assert ledger.admit((T, 0), 5000, 7) is Admit.TAKE


def test_records_fetched_while_blocked_cannot_skip_the_re_read_after_unblock() -> None:
    """The faust runtime neither seeks nor pauses a blocked partition, so it goes on
    fetching: the log grows past the DB offset (1000) and 1000..1010 are refused while it
    is blocked; then the lag check unblocks it and seeks it to 1000. 1011, fetched before
    the seek took effect, must not be taken: a batch starting there would commit past
    1000..1010 (the fence asks only next_offset <= first_offset), which the re-read
    would then refuse as committed: lost (a review reproduced it on this ledger)."""
    ledger = _ledger(p0=1000)
    ledger.block((T, 0), past_log_end((T, 0), 1000, 990))
    for offset in range(990, 1011):
        assert ledger.admit((T, 0), offset, 7) is Admit.UNOWNED
    ledger.unblock((T, 0))  # and the caller seeks it to 1000
    assert ledger.admit((T, 0), 1011, 7) is Admit.STALE  # fetched before the seek
    for offset in range(1000, 1012):  # the re-read
        assert ledger.admit((T, 0), offset, 7) is Admit.TAKE


def test_a_re_read_whose_range_retention_deleted_resumes_at_the_log_start() -> None:
    """A batch over 10..14 is dropped: the re-read starts at 10, its mark at 14. Retention
    deletes up to 19 before the seek back takes effect, so Kafka resets the position to
    the log start, 20: every record from there is above the mark and was refused as
    fetched before the seek, for ever. Past the mark, the re-read moves to the log start
    with no mark (20 may be a transaction marker: the first record may be 21)."""
    ledger = _ledger(p0=10)
    for offset in range(10, 15):
        assert ledger.admit((T, 0), offset, 7) is Admit.TAKE
    ledger.not_committed([PartitionRange(T, 0, 10, 15, epoch=3)], _rows(3, p0=10), 1.0)
    assert ledger.marks() == {(T, 0): 14}
    assert ledger.past_retention((T, 0), 14) is None  # 14 may come again: the mark holds
    assert ledger.admit((T, 0), 21, 7) is Admit.STALE
    assert ledger.expected((T, 0)) == 10  # nothing taken while the mark holds
    assert ledger.past_retention((T, 0), 20) == Rewind((T, 0), 20)
    assert ledger.marks() == {} and ledger.past_retention((T, 0), 30) is None
    assert ledger.expected((T, 0)) == 10  # the first record's admission counts 10..20
    assert [ledger.admit((T, 0), o, 7) for o in range(21, 24)] == [Admit.TAKE] * 3


def test_the_first_record_of_a_re_read_is_measured_from_the_db_offset() -> None:
    """Rewound to 10 (mark 14); retention deletes up to 12 and Kafka resets the re-read
    there: 12 clears the mark and is taken. What it skipped (10, 11) is measured from the
    DB offset; it was not measured at all while a mark held (a review found it)."""
    ledger = _ledger(p0=10)
    for offset in range(10, 15):
        ledger.admit((T, 0), offset, 7)
    ledger.not_committed([PartitionRange(T, 0, 10, 15, epoch=3)], _rows(3, p0=10), 1.0)
    assert ledger.expected((T, 0)) == 10
    assert ledger.admit((T, 0), 12, 7) is Admit.TAKE
    assert ledger.expected((T, 0)) == 13


def test_a_re_read_past_an_earlier_mark_drops_it() -> None:
    """Rewound to 10 with 14 taken (mark 14); cut off from the group before the re-read's
    first record, while another worker committed up to 300; taken back there. The
    earlier mark held: every record from 300 on was refused as fetched before a seek,
    for ever (a review reproduced it in this ledger)."""
    ledger = _ledger(p0=10)
    for offset in range(10, 15):
        ledger.admit((T, 0), offset, 7)
    ledger.not_committed([PartitionRange(T, 0, 10, 15, epoch=3)], _rows(3, p0=10), 1.0)
    ledger.suspend_all(2.0)
    assert ledger.retake(Claim(T, 0, 300, epoch=9)) == Rewind((T, 0), 300)
    assert ledger.admit((T, 0), 300, 7) is Admit.TAKE


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


def test_headers_are_read_only_for_poison() -> None:
    calls: list[int] = []

    def headers() -> list[tuple[str, str | bytes | None]]:
        calls.append(1)
        return [("h", b"v")]

    ledger = _ledger(p0=0)
    good = Record(T, 0, 0, None, _event_bytes("t"), headers, 7)
    bad = Record(T, 0, 1, None, b"nope", headers, 7)
    draft = draft_batch([good, bad], ledger, DEFAULT_LIMITS)
    assert calls == [1] and draft.poison[0].headers == [("h", b"v")]


def test_draft_of_nothing_admitted_is_empty() -> None:
    ledger = _ledger(p0=10)
    draft = draft_batch([_rec(0, 3, b"{}"), _rec(2, 3, b"{}")], ledger, DEFAULT_LIMITS)
    assert draft.empty and draft.dropped == {"committed": 1, "unowned": 1}


def test_chunks_bound_the_bytes_of_a_transaction() -> None:
    records = [_rec(0, i, b"x" * 400) for i in range(10)]  # with the key and the header:
    size = records[0].size()  # 403 bytes and the header's overhead
    got = list(chunks(records, 2 * size + size // 2))
    assert [len(c) for c in got] == [2, 2, 2, 2, 2]
    assert [r.offset for c in got for r in c] == list(range(10))
    assert [len(c) for c in chunks([_rec(0, 0, b"y" * 5000)], 1000)] == [1]


def test_headers_of_accepts_the_shapes_faust_hands() -> None:
    assert headers_of(None) == []
    assert headers_of([("a", b"1")]) == [("a", b"1")]
    assert headers_of({"a": b"1"}) == [("a", b"1")]


def test_a_worker_cut_off_from_its_group_suspends_everything() -> None:
    ledger = _ledger(p0=10, p1=20)
    assert sorted(ledger.suspend_all(now=5.0)) == [(T, 0), (T, 1)]
    assert ledger.owned() == {} and ledger.admit((T, 0), 10, 7) is Admit.UNOWNED
    assert sorted(ledger.retakes_due(5.0)) == [(T, 0), (T, 1)]
    ledger.retake(Claim(T, 0, 10, epoch=4))
    assert ledger.owned() == {(T, 0): 4}


def test_a_partition_kept_through_a_rebalance_is_suspended_without_a_backoff() -> None:
    """A batch that did not commit inside a rebalance callback: its kept partitions wait
    for a claim after the callback, due at once, and a second time too (nobody else
    claimed them, unlike a fence); one no longer consumed is not suspended again."""
    ledger = _ledger(p0=10, p1=20)
    assert ledger.suspend([(T, 0)], now=5.0) == [(T, 0)]
    assert ledger.owned() == {(T, 1): ledger.epoch((T, 1))}
    assert ledger.retakes_due(5.0) == [(T, 0)]
    assert ledger.suspend([(T, 0), (T, 9)], now=6.0) == []  # suspended already; not owned
    ledger.retake(Claim(T, 0, 10, epoch=4))
    assert ledger.suspend([(T, 0)], now=7.0) == [(T, 0)]
    assert ledger.retakes_due(7.0) == [(T, 0)]
    ledger.retake(Claim(T, 0, 10, epoch=5))
    ledger.suspend([(T, 0)], now=8.0, fenced=True)  # a fence inside the callback: backoff
    ledger.retake(Claim(T, 0, 10, epoch=6))
    ledger.suspend([(T, 0)], now=9.0, fenced=True)
    assert ledger.retakes_due(9.5) == [] and ledger.retakes_due(10.0) == [(T, 0)]


def test_group_watch_suspects_a_group_handler_away_past_its_grace() -> None:
    import json

    from ackline.streams.groupwatch import GroupWatch

    watch = GroupWatch(grace_s=3.0)
    watch.on_stats(json.dumps({"cgrp": {"state": "up", "stateage": 100}}), now=10.0)
    assert not watch.suspect()
    watch.on_stats(json.dumps({"cgrp": {"state": "wait-coord", "stateage": 2000}}), now=11.0)
    assert watch.not_up_since == 9.0  # backdated to the change
    assert not watch.suspect()  # seen away for 2 s
    watch.on_stats(json.dumps({"cgrp": {"state": "wait-coord", "stateage": 3000}}), now=12.0)
    assert watch.suspect()  # seen away for 3 s
    watch.on_stats("{not json", now=12.5)  # ignored
    watch.on_stats(json.dumps({"cgrp": {"state": "up"}}), now=13.0)
    assert not watch.suspect()


def test_group_watch_takes_no_silence_for_an_absence() -> None:
    """Statistics are served only while the consumer thread polls. A worker that filled its
    buffers and waited on its writes for a second served none: the last ones, from before
    its group came up ("query-coord"), made it suspect itself and drop its partitions
    1.9 s after it started. Only statistics that show the group away past the grace do."""
    import json

    from ackline.streams.groupwatch import GroupWatch

    watch = GroupWatch(grace_s=1.5)
    watch.on_stats(json.dumps({"cgrp": {"state": "query-coord", "stateage": 900}}), now=1.0)
    assert not watch.suspect()  # nothing more heard: still only 0.9 s seen away
    watch.on_stats(json.dumps({"cgrp": {"state": "up", "stateage": 300}}), now=3.0)
    assert not watch.suspect()


def test_a_mark_is_past_retention_only_once_the_log_start_is_above_it() -> None:
    """The faust runtime rejoins for the partitions this names: a log start at the mark
    still lets the marked record come, one above it never does."""
    ledger = _ledger(p0=10)
    for offset in range(10, 15):
        assert ledger.admit((T, 0), offset, 7) is Admit.TAKE
    ledger.not_committed([PartitionRange(T, 0, 10, 15, epoch=3)], _rows(3, p0=10), 1.0)
    marks = ledger.marks()
    assert marks == {(T, 0): 14}
    assert marks_past_retention(marks, {(T, 0): 14}) == {}
    assert marks_past_retention(marks, {}) == {}  # the broker did not say: no rejoin
    assert marks_past_retention(marks, {(T, 0): 15, (T, 1): 99}) == {(T, 0): 15}
