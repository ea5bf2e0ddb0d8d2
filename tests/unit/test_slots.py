"""Writer slots (streams/slots.py): which slot writes a partition, and a slot's buffer."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ackline.schemas.decode import Rejection, decode
from ackline.sinks.connection import Database
from ackline.sinks.ingest.writer import BatchWriter
from ackline.streams.assemble import Record, record_size
from ackline.streams.faust_runtime.sink import chunks
from ackline.streams.headers import HEADER_OVERHEAD
from ackline.streams.slots import Slot, SlotMap


def _slot() -> Slot:  # nothing connects: the writer is never used here
    return Slot(BatchWriter(Database("postgresql://u@127.0.0.1:1/db"), "g", "w"))


def _rec(partition: int, offset: int, size: int = 10) -> Record:
    return Record("t", partition, offset, None, b"x" * size, [])


@given(st.integers(1, 8), st.lists(st.integers(0, 500), min_size=1, max_size=64, unique=True))
def test_partitions_spread_evenly_whatever_their_numbers(slots: int, parts: list[int]) -> None:
    """Least loaded first: the slots' shares differ by at most one, even when every
    partition number has one parity (Kafka deals partitions to workers in turn, so with
    two workers each one's partitions are all even or all odd)."""
    m = SlotMap(slots)
    got = [m.of(("t", p)) for p in parts]
    assert all(0 <= s < slots for s in got)
    shares = Counter(got)
    assert max(shares.values()) - min(shares.values(), default=0) <= 1
    if len(parts) >= slots:
        assert len(shares) == slots
    assert [m.of(("t", p)) for p in parts] == got  # fixed until released


def test_two_slots_share_a_worker_s_even_partitions() -> None:
    m = SlotMap(2)
    assert [m.of(("t", p)) for p in (0, 2, 4, 6, 8, 10)] == [0, 1, 0, 1, 0, 1]


def test_a_released_partition_frees_its_place_and_may_come_back_elsewhere() -> None:
    m = SlotMap(2)
    assert (m.of(("t", 0)), m.of(("t", 1)), m.of(("t", 2))) == (0, 1, 0)
    m.release([("t", 0), ("t", 9)])  # 9 was never seen: nothing happens
    assert m.of(("t", 3)) == 0  # slot 0 now holds one partition, as slot 1 does
    m.release([("t", 1)])
    assert m.of(("t", 0)) == 1


def test_one_slot_takes_every_partition() -> None:
    m = SlotMap(1)
    assert {m.of(("t", p)) for p in range(50)} == {0}
    with pytest.raises(ValueError):
        SlotMap(0)


def test_full_by_events_or_by_bytes() -> None:
    slot = _slot()
    slot.add(_rec(0, 0, 600), 600)
    assert not slot.full(2, 1000)
    slot.add(_rec(0, 1, 600), 600)
    assert slot.full(3, 1000) and slot.full(2, 10_000)


def test_take_empties_the_buffer_with_its_decoded_prefix() -> None:
    slot = _slot()
    for i in range(3):
        slot.add(_rec(0, i), 10)
    slot.decoded.append(decode(b"{}"))
    records, decoded = slot.take(3, 30)
    assert [r.offset for r in records] == [0, 1, 2] and len(decoded) == 1
    assert slot.buffer == [] and slot.decoded == [] and slot.buffer_bytes == 0


def test_take_cuts_a_batch_at_its_bounds_and_leaves_the_rest_in_order() -> None:
    """A buffer holds up to two batches' worth: a batch is its longest prefix within the
    count and the bytes, and what follows stays, its decoded prefix aligned."""
    slot = _slot()
    for i in range(5):
        slot.add(_rec(i % 2, i), 10)
    slot.decoded.extend(decode(b"{}") for _ in range(4))
    records, decoded = slot.take(3, 1_000)
    assert [r.offset for r in records] == [0, 1, 2] and len(decoded) == 3
    assert [r.offset for r in slot.buffer] == [3, 4] and len(slot.decoded) == 1
    assert slot.buffer_bytes == 20
    records, decoded = slot.take(10, 15)  # bytes: 10 fits, 20 would not
    assert [r.offset for r in records] == [3] and len(decoded) == 1
    assert [r.offset for r in slot.buffer] == [4] and slot.decoded == []


def test_take_gives_a_record_larger_than_the_byte_bound_a_batch_of_its_own() -> None:
    slot = _slot()
    slot.add(_rec(0, 0, 500), 500)
    slot.add(_rec(0, 1, 10), 10)
    records, _ = slot.take(10, 100)
    assert [r.offset for r in records] == [0] and slot.buffer_bytes == 10


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 300)), max_size=60),
    st.integers(1, 20),
    st.integers(1, 2_000),
)
def test_batches_taken_in_turn_are_the_buffer_in_order_each_within_its_bounds(
    recs: list[tuple[int, int]], max_events: int, max_bytes: int
) -> None:
    slot = _slot()
    for offset, (partition, size) in enumerate(recs):
        slot.add(_rec(partition, offset, size), size)
    taken: list[Record] = []
    while slot.buffer:
        batch, _ = slot.take(max_events, max_bytes)
        assert 1 <= len(batch) <= max_events
        assert len(batch) == 1 or sum(r.size() for r in batch) <= max_bytes
        taken += batch
    assert [r.offset for r in taken] == list(range(len(recs)))
    assert slot.buffer_bytes == 0


def test_pull_takes_a_partitions_records_out_in_order() -> None:
    slot = _slot()
    for i in range(6):
        slot.add(_rec(i % 3, i), 10)
    slot.decoded.extend(decode(b"{}") for _ in range(4))
    pulled = slot.pull({("t", 1)})
    assert [r.offset for r in pulled] == [1, 4]
    assert [r.offset for r in slot.buffer] == [0, 2, 3, 5] and len(slot.decoded) == 3
    assert slot.buffer_bytes == 40 and slot.pull({("t", 7)}) == []


def test_drop_keeps_the_decoded_prefix_aligned_with_the_buffer() -> None:
    """Decode results belong to a prefix of the buffer; after dropping a partition's
    records each kept result must still sit beside its own record."""
    slot = _slot()
    recs = [_rec(p, o, 10 + o) for o, p in enumerate([0, 2, 0, 2, 0])]
    for r in recs:
        slot.add(r, r.size())
    slot.decoded = [decode(r.value) for r in recs[:3]]  # records 0..2 decoded
    marks = slot.decoded
    slot.drop({("t", 2)})
    assert [r.offset for r in slot.buffer] == [0, 2, 4]
    assert slot.decoded == [marks[0], marks[2]]  # the results of offsets 0 and 2
    assert slot.buffer_bytes == sum(r.size() for r in slot.buffer)
    assert all(isinstance(d, Rejection) for d in slot.decoded)  # b"x..." is not JSON


def test_put_back_goes_first_and_is_decoded_again() -> None:
    slot = _slot()
    slot.add(_rec(0, 5), 10)
    slot.decoded = [decode(b"{}")]
    slot.put_back([_rec(0, 3), _rec(0, 4)])
    assert [r.offset for r in slot.buffer] == [3, 4, 5]
    assert slot.decoded == [] and slot.buffer_bytes == 30


def test_header_bytes_count_in_a_record_s_size_and_cut_batches() -> None:
    """A record's size counted its key and value only: 2,000 records of a few bytes with
    900 kB of headers each were one batch under a 1 MiB bound (a hostile review)."""
    big: list[tuple[str | None, str | bytes | None]] = [("blob", b"a" * 900_000)]
    recs = [Record("t", 0, i, b"k", b"not json", big) for i in range(2000)]
    overhead = HEADER_OVERHEAD
    assert recs[0].size() == len(b"k") + len(b"not json") + len("blob") + 900_000 + overhead
    slot = _slot()
    for rec in recs:
        slot.add(rec, rec.size())
    records, _ = slot.take(2000, 1 << 20)
    assert len(records) == 1
    assert [len(c) for c in chunks(recs[:3], 1 << 20)] == [1, 1, 1]


def test_each_header_counts_its_overhead() -> None:
    """A record of empty headers (2 bytes each on the wire, a tuple each in memory)
    counted nothing: 500,000 of them were a record of size 3 (a hostile review)."""
    empty: list[tuple[str | None, str | bytes | None]] = [("", None)] * 500_000
    assert Record("t", 0, 0, b"k", b"vv", empty).size() >= 500_000 * 32


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "take", "drop", "back", "decode"]),
            st.integers(0, 3),
            st.integers(0, 300),
        ),
        max_size=40,
    )
)
def test_a_slot_keeps_each_buffered_record_s_size_whatever_it_is_asked(
    steps: list[tuple[str, int, int]],
) -> None:
    """The take measures its prefix from the sizes kept when records came (sizing every
    record again, headers and all, was ~4 % of a drain's GIL samples): whatever the
    order of adds, takes, drops, put-backs and decodes ahead, they stay each buffered
    record's own, the decoded prefix stays the buffer's, and a batch keeps its bounds."""
    slot, offset = _slot(), 0
    for op, arg, length in steps:
        if op == "add":
            rec = Record("t", arg, offset, None, b"x" * length, [("h", b"v" * (length % 7))])
            slot.add(rec, record_size(rec.key, rec.value, rec.header_list()))
            offset += 1
        elif op == "take" and slot.buffer:
            events, size = max(1, arg), 200 * (arg + 1)
            taken, decoded = slot.take(events, size)
            assert taken and (len(taken) == 1 or sum(r.size() for r in taken) <= size)
            assert len(taken) <= events
            assert decoded == [decode(r.value) for r in taken[: len(decoded)]]
        elif op == "drop":
            slot.drop({("t", arg)})
        elif op == "back":
            slot.put_back(slot.pull({("t", arg)}))
        elif op == "decode":
            done = len(slot.decoded)
            slot.decoded.extend(decode(r.value) for r in slot.buffer[done : done + arg])
        assert slot.sizes == [r.size() for r in slot.buffer]
        assert slot.buffer_bytes == sum(slot.sizes)
        assert slot.decoded == [decode(r.value) for r in slot.buffer[: len(slot.decoded)]]
