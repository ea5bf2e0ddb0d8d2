"""How many events a changefeed read asks for after reads cut by bytes (fits_next)."""

from __future__ import annotations

from ackline.sinks.feed.changefeed import ANY_COUNT, fits_next


def test_a_read_cut_by_bytes_asks_twice_what_fitted_next() -> None:
    assert fits_next(ANY_COUNT, 80, bytes_cut=True, shortened=False, most=5_000) == 160
    assert fits_next(160, 1, bytes_cut=True, shortened=True, most=5_000) == 2


def test_a_read_the_smaller_ask_cut_doubles_it_back_then_lifts_it() -> None:
    assert fits_next(160, 160, bytes_cut=False, shortened=True, most=5_000) == 320
    assert fits_next(2_560, 2_560, bytes_cut=False, shortened=True, most=5_000) == ANY_COUNT


def test_a_read_that_ended_with_its_window_keeps_the_ask() -> None:
    # fewer than asked came: the feed had no more, which says nothing of the sizes
    assert fits_next(160, 40, bytes_cut=False, shortened=True, most=5_000) == 160
    assert fits_next(ANY_COUNT, 40, bytes_cut=False, shortened=False, most=5_000) == ANY_COUNT


def test_a_processor_reads_at_most_its_batch_bytes() -> None:
    """`ackline process --batch-bytes` reaches the processor's feed (it could not be set)."""
    from ackline import cli
    from ackline.sinks.feed.processors.registry import load
    from ackline.sinks.feed.processors.runner import ProcessorRunner
    from ackline.sinks.feed.types import MAX_BYTES

    assert ProcessorRunner(load("runs"), instance="i").feed.max_bytes == MAX_BYTES
    assert ProcessorRunner(load("runs"), instance="i", batch_bytes=4_096).feed.max_bytes == 4_096
    args = cli.parser().parse_args(["process", "runs", "--batch-bytes", "4096"])
    assert args.batch_bytes == 4_096
