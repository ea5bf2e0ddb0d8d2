"""Writer slots (streams/slots.py): which slot writes a partition, and a slot's buffer."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from ackline.schemas.decode import Rejection, decode
from ackline.sinks.connection import Database
from ackline.sinks.ingest.writer import BatchWriter
from ackline.streams.assemble import Record
from ackline.streams.slots import Slot, slot_of


def _slot() -> Slot:  # nothing connects: the writer is never used here
    return Slot(BatchWriter(Database("postgresql://u@127.0.0.1:1/db"), "g", "w"))


def _rec(partition: int, offset: int, size: int = 10) -> Record:
    return Record("t", partition, offset, None, b"x" * size, [])


@given(st.integers(1, 8), st.sets(st.integers(0, 500), min_size=1, max_size=64))
def test_a_partition_has_one_slot_and_partitions_spread(slots: int, parts: set[int]) -> None:
    """Fixed per partition (a partition's batches then commit in order) and even: the
    slots' shares of consecutive partitions differ by at most one."""
    for p in parts:
        assert 0 <= slot_of(("t", p), slots) < slots
        assert slot_of(("t", p), slots) == slot_of(("other", p), slots)
    shares = Counter(slot_of(("t", p), slots) for p in range(slots * 3 + 1))
    assert max(shares.values()) - min(shares.values()) <= 1


def test_one_slot_takes_every_partition() -> None:
    assert {slot_of(("t", p), 1) for p in range(50)} == {0}


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
    records, decoded = slot.take()
    assert [r.offset for r in records] == [0, 1, 2] and len(decoded) == 1
    assert slot.buffer == [] and slot.decoded == [] and slot.buffer_bytes == 0


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
