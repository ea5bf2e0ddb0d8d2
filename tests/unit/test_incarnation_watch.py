"""The running watch's gate (ackline.runtime.incarnation_watch): a held partition is
released only after a read of the topic ID that began once it was due; the reads
themselves, against Kafka and PostgreSQL, are tests/integration/test_recreated_topic.py."""

from __future__ import annotations

from ackline.runtime.incarnation_watch import IncarnationWatch
from ackline.sinks.ingest.incarnation import Confirmed


def _watch() -> IncarnationWatch:
    return IncarnationWatch("127.0.0.1:1", {}, "t", "g", "postgresql://x", 1.0, "w")


def test_nothing_is_held_back_before_a_first_confirmation() -> None:
    """Unchecked (the ID unreadable, no migration 0015): as before the watch."""
    assert _watch().fresh_since(100.0)


def test_a_release_waits_for_a_read_begun_after_it_was_due() -> None:
    w = _watch()
    w.confirmed, w.confirmed_at = "A", 50.0
    assert not w.fresh_since(100.0)  # confirmed before the log end reached the offset
    assert w.fresh_since(50.0)
    w.confirmed_at = 101.0
    assert w.fresh_since(100.0)


def test_nothing_is_released_once_another_incarnation_was_found() -> None:
    w = _watch()
    w.confirmed, w.confirmed_at = "A", 200.0
    w.refusal = "topic t is another incarnation"
    assert not w.fresh_since(100.0)


def test_the_starts_confirmed_id_is_the_baseline_and_needs_no_second_record() -> None:
    w = _watch()
    w.start_from(None)  # the start could not read or check it: the first read is checked
    assert w.confirmed is None and w.fresh_since(100.0)
    w.start_from(Confirmed("A", 40.0))
    assert w.confirmed == "A" and w.confirmed_at == 40.0
    assert not w.fresh_since(100.0)  # read before the partition was due
    assert w.fresh_since(40.0)


def test_a_stop_ends_the_wait_of_a_batch_held_while_the_topic_is_gone() -> None:
    """A review: a batch held while the topic was gone waited through the worker's stop
    (faust's stop waits for every taken record to be acked, so the worker ran out its
    stop bound and exited 1; the default runtime's waited ACKLINE_SHUTDOWN_WAIT_S). A
    stop ends the wait, the batch not written; the topic found again lets it go."""
    import asyncio

    w = _watch()
    w.missing = True
    stopping: list[bool] = []

    async def go() -> None:
        held = asyncio.create_task(w.settled(lambda: bool(stopping)))
        await asyncio.sleep(0.2)
        assert not held.done()
        stopping.append(True)
        assert await asyncio.wait_for(held, 2) is False
        w.missing = False
        assert await w.settled(lambda: True) is True  # the topic there: a stop writes it

    asyncio.run(go())
