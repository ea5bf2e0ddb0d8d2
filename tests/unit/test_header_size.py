"""What a record's headers count against the byte bound of buffers and batches."""

from __future__ import annotations

import tracemalloc

import pytest

from ackline.streams.headers import HEADER_OVERHEAD, headers_size


@pytest.mark.parametrize(("key_len", "value_len"), [(0, 0), (4, 2), (12, 16), (24, 36), (8, 1000)])
def test_small_headers_count_at_least_the_memory_they_hold(key_len: int, value_len: int) -> None:
    """Many small headers (where the per-header overhead is most of it): the count must
    not fall short of what the Python objects confluent-kafka builds for them (a list of
    ``(str, bytes)`` tuples) hold, or a flood of such records fills the memory past the
    bound. At 64 bytes a header it counted about half (a review: 75 MB held against 33.5
    MB counted); at 128, headers with values of two bytes or more still fell short."""
    n = 20_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        headers = [
            (f"{i:0{key_len}d}"[:key_len], bytes([65 + i % 26]) * value_len) for i in range(n)
        ]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert headers_size(headers) >= held, (headers_size(headers), held)
    assert headers_size([("k", b"v")]) == HEADER_OVERHEAD + 2
