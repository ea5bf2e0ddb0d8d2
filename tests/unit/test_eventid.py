"""UUIDv7 layout (RFC 9562 section 5.7) and order."""

from __future__ import annotations

import uuid

import pytest

from ackline.schemas.eventid import unix_ms_of, uuid7


def test_rfc_9562_test_vector_layout() -> None:
    # RFC 9562 appendix A.6: 2022-02-22 19:22:22 UTC = 0x017F22E279B0 ms, rand_a 0xCC3,
    # rand_b 0x18C4DC0C0C07398F -> 017F22E2-79B0-7CC3-98C4-DC0C0C07398F.
    rand = (0xCC3 << 62) | (0x18C4DC0C0C07398F & ((1 << 62) - 1))
    got = uuid7(0x017F22E279B0, rand)
    assert got == uuid.UUID("017f22e2-79b0-7cc3-98c4-dc0c0c07398f")
    assert got.version == 7 and got.variant == uuid.RFC_4122
    assert unix_ms_of(got) == 0x017F22E279B0


def test_ids_sort_by_time_and_differ_within_a_millisecond() -> None:
    ids = [uuid7(1_700_000_000_000 + ms) for ms in range(1000)]
    assert ids == sorted(ids)
    same = {uuid7(1_700_000_000_000) for _ in range(1000)}
    assert len(same) == 1000
    assert uuid7().version == 7


def test_other_versions_carry_no_time_and_bad_times_are_refused() -> None:
    assert unix_ms_of(uuid.uuid4()) is None
    with pytest.raises(ValueError, match="48-bit"):
        uuid7(1 << 48)
    with pytest.raises(ValueError, match="48-bit"):
        uuid7(-1)
