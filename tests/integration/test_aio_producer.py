"""The asyncio producer SDK against the real broker, ingested by a real worker.

Two faults a producing service meets: a commit whose outcome it cannot know (the broker
is frozen with SIGSTOP while the commit is in flight), after which a new instance resends
the same records; and a zombie instance fenced by a newer one with the same
transactional.id. In both, ackline must end with every event exactly once. Last, how the
synchronous producer closes a fenced instance, and how both close one whose broker is away.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, ExitStack, contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Message, cimpl

from ackline.dev import stack
from ackline.streams.aio_producer import AsyncActivityProducer
from ackline.streams.aio_producer import log as producer_log
from ackline.streams.errors import OutcomeUnknownError, ProduceError, ProducerFencedError
from ackline.streams.producer import ActivityProducer, Delivery, Outgoing, prepare
from ackline.streams.producer import log as sync_log
from tests.integration.harness import Services, Worker
from tests.integration.producing import (
    committed_values,
    ingested,
    last_offsets,
    unit_of_work,
    wait_past,
)

pytestmark = pytest.mark.integration


def records() -> list[Outgoing]:
    """Two requests' worth of events, prepared once: every attempt sends these bytes."""
    envs = unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-a", 3)
    envs += unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-b", 2)
    return [prepare(e) for e in envs]


@contextmanager
def frozen_broker(services: Services) -> Iterator[None]:
    """The broker SIGSTOPped for the block, SIGCONTed after it whatever happens."""
    pid = stack.status(services.state_dir)["kafka"]["pid"]
    assert pid, "this test freezes the local stack's broker: it needs its pid"
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert b"kafka" in cmdline, f"pid {pid} is not the broker: {cmdline[:200]!r}"
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 5
        while _proc_state(pid) != "T":  # the stop is delivered asynchronously
            assert time.monotonic() < deadline, f"the broker ({pid}) did not stop"
            time.sleep(0.01)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _proc_state(pid: int) -> str:
    """The process's state letter in /proc (``T``: stopped by a signal)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


class Heartbeat:
    """Counts ticks of a 20 ms sleep loop: it only ticks while the event loop is free."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0.02)
            self.ticks += 1

    def __enter__(self) -> Heartbeat:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def test_a_resend_after_an_uncertain_commit_is_ingested_once(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    sent = records()
    txn_id = f"svc-{uuid.uuid4().hex[:8]}"

    async def produce() -> tuple[int, list[Delivery]]:
        first = AsyncActivityProducer(services.bootstrap, topic, txn_id)
        await first.start()
        with (
            ExitStack() as thaw,
            pytest.raises(OutcomeUnknownError) as unknown,
            Heartbeat() as beat,
        ):
            async with first.transaction(timeout=2.0):
                for record in sent:
                    await first.send(record)
                assert await first.flush(30) == 0  # in the open transaction, not committed
                thaw.enter_context(frozen_broker(services))  # until the commit gave up
        assert not isinstance(unknown.value, ProducerFencedError)
        with pytest.raises(OutcomeUnknownError):  # the instance knows it is unusable
            await first.send(sent[0])
        await first.close()
        # What docs/producing.md says to do: a new instance, the same records.
        async with AsyncActivityProducer(services.bootstrap, topic, txn_id) as second:
            return beat.ticks, await second.send_transaction(sent)

    ticks, deliveries = asyncio.run(produce())
    assert ticks >= 3, "the event loop was held while the broker was frozen"

    copies = committed_values(services.bootstrap, topic)
    originals = {r.value for r in sent}
    assert set(copies) == originals
    # The commit request was already in the frozen broker's socket: it committed when the
    # broker woke up, so the resend made a second copy of every record. Unknown to the
    # service, harmless to ackline: each copy must be a counted duplicate.
    assert len(copies) == 2 * len(sent)

    worker = Worker(services, dsn, topic, tmp_path)
    wait_past(dsn, worker, topic, last_offsets(deliveries))
    got = ingested(dsn)
    assert got.event_ids == {r.event_id for r in sent}
    assert (got.inserted, got.duplicates, got.conflicts, got.rejects) == (
        len(sent),
        len(sent),
        0,
        0,
    )
    assert worker.stop() == 0


def test_a_sync_instance_whose_commit_was_not_confirmed_is_unusable(
    services: Services, topic: str
) -> None:
    """The asyncio SDK's rule, and docs/producing.md's, in the synchronous SDK: after an
    OutcomeUnknownError the instance is done. It was not marked so: a later abort() said
    "nothing of the transaction was committed" (TransientProduceError), untrue for a commit
    that may have gone through, and a new transaction failed on librdkafka's state. Found
    by a review."""
    sent = records()
    first = ActivityProducer(services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}")
    first.start()
    try:
        with (
            ExitStack() as thaw,
            pytest.raises(OutcomeUnknownError) as unknown,
            first.transaction(timeout=2.0),
        ):
            for record in sent:
                first.send_record(record)
            assert first.client.flush(30) == 0  # delivered, not committed
            thaw.enter_context(frozen_broker(services))  # until the commit gave up
        assert not isinstance(unknown.value, ProducerFencedError)
        with pytest.raises(OutcomeUnknownError, match="unusable"):
            first.abort(5)
        with pytest.raises(OutcomeUnknownError, match="unusable"):
            first.send_transaction(sent)
    finally:
        first.close()


def test_a_second_start_is_refused_and_leaks_no_client(services: Services, topic: str) -> None:
    """A second start() on an open instance made a second client and dropped the first
    where nothing could close it (its librdkafka threads and connections lived until a
    collection). Both SDKs now refuse it; the instance goes on with its first client. A
    start() after close() is refused too: an instance starts once (a closed one may have
    been marked unusable, which a new client did not undo)."""
    sent = records()
    before = _live_clients()
    sync = ActivityProducer(services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}")
    sync.start()
    try:
        with pytest.raises(ProduceError, match=r"start\(\) was already called"):
            sync.start()
        assert len(_new_clients(before)) == 1
        sync.send_transaction(sent[:2])
    finally:
        sync.close()
    with pytest.raises(ProduceError, match="was closed"):
        sync.start()

    async def go() -> int:
        aio = AsyncActivityProducer(services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}")
        await aio.start()
        try:
            with pytest.raises(ProduceError, match=r"start\(\) was already called"):
                await aio.start()
            alive = len(_new_clients(before))
            await aio.send_transaction(sent[2:])
        finally:
            await aio.close()
        with pytest.raises(ProduceError, match="was closed"):
            await aio.start()
        return alive

    assert asyncio.run(go()) == 1
    assert _new_clients(before) == []
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in sent)


def test_a_call_after_close_says_the_instance_was_closed(services: Services, topic: str) -> None:
    """A call on a closed instance said "start() was not called", sending the user to look
    for a start that had run. Both SDKs now say the instance was closed; before start()
    they still say that start() was not called."""
    sync = ActivityProducer(services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}")
    with pytest.raises(ProduceError, match=r"ActivityProducer.start\(\) was not called"):
        sync.send_record(records()[0])
    sync.start()
    sync.close()
    with pytest.raises(ProduceError, match="this ActivityProducer was closed"):
        sync.send_record(records()[0])

    async def go() -> None:
        aio = AsyncActivityProducer(services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}")
        with pytest.raises(ProduceError, match=r"AsyncActivityProducer.start\(\) was not"):
            await aio.send(records()[0])
        await aio.start()
        await aio.close()
        with pytest.raises(ProduceError, match="this AsyncActivityProducer was closed"):
            await aio.send(records()[0])

    asyncio.run(go())


def test_a_send_outside_a_transaction_block_is_refused_and_queues_nothing(
    services: Services, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """send() with no transaction() block open queued its record and returned its future:
    librdkafka failed it (``_STATE``), nothing raised, the producer closed cleanly and only
    close() logged "1 record(s) not delivered, dropped"; a send_transaction() after it
    began a new transaction without it, the loss told only by asyncio's "Future exception
    was never retrieved". The synchronous producer raises at once; so does this one now,
    before anything is queued, before and after a block, and the transactions around the
    refusal commit what they hold."""
    stray, *sent = records()[:3]

    async def go() -> None:
        async with AsyncActivityProducer(
            services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}"
        ) as producer:
            with pytest.raises(ProduceError, match="no open transaction"):
                await producer.send(stray)
            await producer.send_transaction(sent[:1])
            async with producer.transaction():
                await producer.send(sent[1])
            with pytest.raises(ProduceError, match="no open transaction"):
                await producer.send(stray)

    with caplog.at_level(logging.WARNING):
        asyncio.run(go())
        gc.collect()  # the futures are gone: asyncio logs any error never retrieved
    assert "never retrieved" not in caplog.text
    assert "not delivered" not in caplog.text  # close() dropped nothing
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in sent)


def test_a_fenced_zombie_cannot_commit_and_its_successor_resends(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    sent = records()
    txn_id = f"svc-{uuid.uuid4().hex[:8]}"

    async def produce() -> list[Delivery]:
        zombie = AsyncActivityProducer(services.bootstrap, topic, txn_id)
        await zombie.start()
        successor = AsyncActivityProducer(services.bootstrap, topic, txn_id)
        try:
            with pytest.raises(ProducerFencedError):
                async with zombie.transaction(timeout=30):
                    for record in sent:
                        await zombie.send(record)
                    assert await zombie.flush(30) == 0  # delivered, inside its transaction
                    await successor.start()  # same transactional.id: fences the zombie
            with pytest.raises(ProducerFencedError):
                await zombie.send_transaction(sent)
            return await successor.send_transaction(sent)
        finally:
            await zombie.close()
            await successor.close()

    deliveries = asyncio.run(produce())
    copies = committed_values(services.bootstrap, topic)
    assert sorted(copies) == sorted(r.value for r in sent)  # the zombie's were aborted

    worker = Worker(services, dsn, topic, tmp_path)
    wait_past(dsn, worker, topic, last_offsets(deliveries))
    got = ingested(dsn)
    assert got.event_ids == {r.event_id for r in sent}
    assert (got.inserted, got.duplicates, got.conflicts, got.rejects) == (len(sent), 0, 0, 0)
    assert worker.stop() == 0


class _CancelOnRetry(logging.Handler):
    """Cancels ``task`` when the producer logs that it will call commit_transaction again:
    the cancellation lands in the pause before that call (the next await)."""

    def __init__(self, task: asyncio.Task[None]) -> None:
        super().__init__(logging.WARNING)
        self.task = task
        self.fired = False

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying" in record.getMessage() and not self.fired:
            self.fired = True
            self.task.cancel()


def test_a_task_cancelled_between_two_commit_attempts_leaves_the_instance_unusable(
    services: Services, topic: str
) -> None:
    """The commit times out (the broker frozen after the records were delivered), a
    retriable error, and the task is cancelled in the pause before the next attempt. The
    commit request is already in the broker's socket: the transaction may commit (here it
    does, once the broker wakes up). The instance must refuse what follows as after any
    cancelled commit; it went on as if nothing had happened, and its abort() then said
    "nothing of the transaction was committed" (TransientProduceError)."""
    sent = records()

    async def produce() -> None:
        producer = AsyncActivityProducer(services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}")
        await producer.start()
        try:
            with ExitStack() as thaw:

                async def commit() -> None:
                    async with producer.transaction(timeout=3.0):
                        for record in sent:
                            await producer.send(record)
                        assert await producer.flush(30) == 0  # delivered, not committed
                        thaw.enter_context(frozen_broker(services))

                task = asyncio.get_running_loop().create_task(commit())
                cancel = _CancelOnRetry(task)
                producer_log.addHandler(cancel)
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                else:
                    pytest.fail(f"the commit was not cancelled (retried: {cancel.fired})")
                finally:
                    producer_log.removeHandler(cancel)
                assert cancel.fired, "the commit was not retried"
                with pytest.raises(OutcomeUnknownError, match="unusable"):
                    await producer.abort()
                with pytest.raises(OutcomeUnknownError, match="unusable"):
                    await producer.send_transaction(sent)
        finally:
            await producer.close()

    asyncio.run(produce())
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in sent)


@contextmanager
def fenced_sync_zombie(
    services: Services, topic: str, sent: list[Outgoing]
) -> Iterator[tuple[ActivityProducer, ActivityProducer]]:
    """A synchronous instance (the zombie) whose transaction held ``sent``, delivered, when
    its successor with the same transactional.id started and fenced it; the zombie's
    commit has raised ProducerFencedError. Both are closed after the block."""
    txn_id = f"svc-{uuid.uuid4().hex[:8]}"
    zombie = ActivityProducer(services.bootstrap, topic, txn_id)
    zombie.start()
    successor = ActivityProducer(services.bootstrap, topic, txn_id)
    try:
        with pytest.raises(ProducerFencedError), zombie.transaction(timeout=30):
            for record in sent:
                zombie.send_record(record)
            assert zombie.client.flush(30) == 0  # delivered, inside its transaction
            successor.start()  # same transactional.id: fences the zombie
        yield zombie, successor
    finally:
        zombie.close()
        successor.close()


def test_a_fenced_synchronous_instance_closes_without_raising(
    services: Services, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A zombie fenced by its successor is in librdkafka's fatal state: its flush raises.
    The synchronous close() let that KafkaException out (the asyncio one never raised), so
    a ``finally: producer.close()`` replaced the ProducerFencedError the caller must act on.
    Now it releases the client whatever its state; the successor commits the records."""
    sent = records()
    with fenced_sync_zombie(services, topic, sent) as (zombie, successor):
        with caplog.at_level(logging.WARNING, logger=sync_log.name):
            zombie.close()
        assert "closing a producer that cannot deliver (KafkaError{FATAL,code=_FENCED" in (
            caplog.text
        )
        with pytest.raises(ProduceError, match=r"this ActivityProducer was closed"):
            zombie.client  # noqa: B018 (released)
        successor.send_transaction(sent)
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in sent)


def test_a_fenced_synchronous_instance_refuses_a_new_transaction_with_the_sdks_error(
    services: Services, topic: str
) -> None:
    """Once librdkafka knows the instance is fenced (its commit failed so), its
    begin_transaction raises. The synchronous transaction() let that KafkaException out
    raw, where send_transaction and the asyncio producer map it; now it is the SDK's
    ProducerFencedError, and the block does not run. Since the fenced commit also marks
    the instance unusable (as the asyncio SDK's), the refusal names that and the fencing."""
    with (
        fenced_sync_zombie(services, topic, records()) as (zombie, _),
        pytest.raises(ProducerFencedError, match=r"unusable \(.*fenced"),
        zombie.transaction(timeout=30),
    ):
        pytest.fail("the block of a transaction that did not begin ran")
    assert committed_values(services.bootstrap, topic) == []


def test_a_close_counts_the_records_it_drops_not_librdkafkas_queue(
    services: Services, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A zombie fenced before it knows it queues records in a transaction; its close()
    flush meets the fencing (librdkafka's fatal error), and none of the records is
    delivered. Both SDKs logged librdkafka's out-queue length as the records dropped:
    "0 record(s) dropped", the records failed and their reports served by then (the
    length also counts each report and log line waiting to be served, records or not).
    Now they count the records not delivered when close() began that it did not
    deliver. And the closed zombies' clients are freed: the asyncio one's was kept alive
    until the interpreter exited (librdkafka's "Connection refused" lines after pytest),
    held by the traceback of the flush's error."""
    sent = records()
    txn_id = f"svc-{uuid.uuid4().hex[:8]}"
    before = _live_clients()
    zombie, successor = _fenced(services, topic, txn_id)
    try:
        zombie.client.begin_transaction()
        for record in sent:
            zombie.send_record(record)
        with caplog.at_level(logging.WARNING, logger=sync_log.name):
            zombie.close(timeout=10)
    finally:
        zombie.close()
        successor.close()
    # Why it cannot deliver: the fenced fatal error, or, when confluent-kafka's flush
    # raises a SystemError with no error behind it (seen once in five runs), that text.
    why = re.escape("KafkaError{FATAL,code=_FENCED") + "|.*returned NULL without setting"
    dropped = rf"cannot deliver \((?:{why}).*\): {len(sent)} record\(s\) dropped"
    assert re.search(dropped, caplog.text), caplog.text
    caplog.clear()

    async def aio() -> None:
        zombie, successor = await _fenced_aio(services, topic, txn_id)
        try:
            block = await _entered(zombie)
            for record in sent:
                await zombie.send(record)
            with caplog.at_level(logging.WARNING, logger=producer_log.name):
                await zombie.close(timeout=10)
            await _left_closed(block)
        finally:
            await zombie.close()
            await successor.close()

    asyncio.run(aio())
    assert re.search(dropped, caplog.text), caplog.text
    caplog.clear()
    kept = _new_clients(before)
    assert not kept, f"{len(kept)} closed client(s) still alive: {kept}"


def test_a_producer_fenced_in_its_transaction_frees_its_client_when_closed(
    services: Services, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A zombie learns it is fenced inside its transaction (the commit raises
    ProducerFencedError), is closed and dropped: its client must go with it. The asyncio
    client raised the fenced commit as a SystemError that nothing ever freed, whose
    traceback's frames held the client, and with it librdkafka's threads and connections,
    until the interpreter exited. Both SDKs.

    Its close() flush returns at once with nothing queued, the records it sent not
    delivered: close() said they were "not delivered in 30 s", a timeout that never ran.
    It now says the flush ended with nothing queued, and how many of them had a failed
    report and how many none."""
    caplog.set_level(logging.WARNING, logger="ackline")
    sent = records()[:5]
    txn_id = f"svc-{uuid.uuid4().hex[:8]}"
    before = _live_clients()
    zombie, successor = _fenced(services, topic, txn_id)
    try:
        with pytest.raises(ProducerFencedError):
            zombie.send_transaction(sent, timeout=10)
    finally:
        zombie.close()
        successor.close()
    del zombie, successor
    kept = _new_clients(before)
    assert not kept, f"synchronous: {len(kept)} closed client(s) still alive"
    _dropped_for_want_of_reports(caplog)

    async def aio() -> None:
        zombie, successor = await _fenced_aio(services, topic, txn_id)
        try:
            with pytest.raises(ProducerFencedError):
                await zombie.send_transaction(sent, timeout=10)
        finally:
            await zombie.close()
            await successor.close()

    asyncio.run(aio())
    kept = _new_clients(before)
    assert not kept, f"asyncio: {len(kept)} closed client(s) still alive"
    _dropped_for_want_of_reports(caplog)


def _dropped_for_want_of_reports(caplog: pytest.LogCaptureFixture) -> None:
    """close() said the records were dropped with nothing queued, and claimed no timeout."""
    said = [r.getMessage() for r in caplog.records if r.name.startswith("ackline.streams")]
    assert any("the flush ended with nothing queued" in line for line in said), said
    assert not any("not delivered in" in line for line in said), said
    caplog.clear()


def _fenced(
    services: Services, topic: str, txn_id: str
) -> tuple[ActivityProducer, ActivityProducer]:
    """A zombie and the successor that fenced it; the zombie does not know it yet."""
    zombie = ActivityProducer(services.bootstrap, topic, txn_id)
    zombie.start()
    successor = ActivityProducer(services.bootstrap, topic, txn_id)
    successor.start()
    return zombie, successor


async def _fenced_aio(
    services: Services, topic: str, txn_id: str
) -> tuple[AsyncActivityProducer, AsyncActivityProducer]:
    """:func:`_fenced`, asyncio."""
    zombie = AsyncActivityProducer(services.bootstrap, topic, txn_id)
    await zombie.start()
    successor = AsyncActivityProducer(services.bootstrap, topic, txn_id)
    await successor.start()
    return zombie, successor


def _new_clients(before: list[object]) -> list[object]:
    """The clients alive now (:func:`_live_clients`) that were not ``before``."""
    return [c for c in _live_clients() if not any(c is b for b in before)]


def _live_clients() -> list[object]:
    """The confluent-kafka clients alive after a full collection: a closed producer's
    client must be among them no longer (its librdkafka threads and broker connections
    live as long as it does)."""
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, cimpl.Producer)]


def test_a_synchronous_close_drops_what_the_broker_did_not_take_and_says_how_many(
    services: Services, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Records queued in an open transaction, the broker frozen: close(timeout) gives up
    after about ``timeout``, says at WARNING how many records it dropped, and releases
    the client; nothing of the transaction is committed."""
    sent = records()
    producer = ActivityProducer(services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}")
    producer.start()
    with frozen_broker(services):
        producer.client.begin_transaction()
        for record in sent:
            producer.send_record(record)
        began = time.monotonic()
        with caplog.at_level(logging.WARNING, logger=sync_log.name):
            producer.close(timeout=1)
        took = time.monotonic() - began
    assert took < 5, f"close(timeout=1) took {took:.1f} s"
    assert f"{len(sent)} record(s) not delivered in 1 s, dropped" in caplog.text
    assert committed_values(services.bootstrap, topic) == []


def _aio_close_on_a_frozen_broker(
    services: Services,
    topic: str,
    sent: list[Outgoing],
    close: Callable[[AsyncActivityProducer], Awaitable[None]],
) -> float:
    """``sent`` queued by an asyncio producer in an open transaction while the broker is
    frozen, then ``close(producer)``: how long that took, in seconds."""

    async def produce() -> float:
        producer = AsyncActivityProducer(services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}")
        await producer.start()
        block = await _entered(producer)
        loop = asyncio.get_running_loop()
        with frozen_broker(services):
            for record in sent:
                await producer.send(record)
            began = loop.time()
            await close(producer)
            took = loop.time() - began
        await _left_closed(block)
        return took

    return asyncio.run(produce())


async def _entered(producer: AsyncActivityProducer) -> AbstractAsyncContextManager[None]:
    """A ``transaction()`` block entered, to be left by :func:`_left_closed` once the
    producer is closed in it (as a service may at shutdown): what is sent meanwhile stays
    in the open transaction, which close() must deal with."""
    block = producer.transaction()
    await block.__aenter__()
    return block


async def _left_closed(block: AbstractAsyncContextManager[None]) -> None:
    """The end of :func:`_entered`'s block, its producer closed: it commits nothing."""
    with pytest.raises(ProduceError, match="was closed"):
        await block.__aexit__(None, None, None)


def test_an_asyncio_close_drops_what_the_broker_did_not_take_and_says_how_many(
    services: Services, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """:func:`test_a_synchronous_close_drops_what_the_broker_did_not_take_and_says_how_many`
    through the asyncio producer, which dropped them without a word (or at INFO, without a
    count, when its flush raised)."""
    sent = records()

    async def close(producer: AsyncActivityProducer) -> None:
        with caplog.at_level(logging.WARNING, logger=producer_log.name):
            await producer.close(timeout=1)

    took = _aio_close_on_a_frozen_broker(services, topic, sent, close)
    assert took < 5, f"close(timeout=1) took {took:.1f} s"
    assert f"{len(sent)} record(s) not delivered in 1 s, dropped" in caplog.text
    assert "never retrieved" not in caplog.text  # counted once, not an ERROR a record
    assert committed_values(services.bootstrap, topic) == []


def test_a_synchronous_close_interrupted_by_ctrl_c_still_says_what_it_drops(
    services: Services, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Ctrl-C while close() waits on a frozen broker (its flush is interruptible): the
    KeyboardInterrupt skipped the WARNING and the purge, so the records queued were lost
    without a word. It now says how many, purges, then lets the interrupt out."""
    sent = records()
    producer = ActivityProducer(services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}")
    producer.start()
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    ctrl_c = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    try:
        with frozen_broker(services):
            producer.client.begin_transaction()
            for record in sent:
                producer.send_record(record)
            began = time.monotonic()
            ctrl_c.start()
            with (
                caplog.at_level(logging.WARNING, logger=sync_log.name),
                pytest.raises(KeyboardInterrupt),
            ):
                producer.close(timeout=30)
            took = time.monotonic() - began
    finally:
        ctrl_c.cancel()
        signal.signal(signal.SIGINT, before)
    assert took < 5, f"close() interrupted after 1 s took {took:.1f} s"
    said = f"interrupted (KeyboardInterrupt): {len(sent)} record(s) not delivered, dropped"
    assert said in caplog.text
    assert committed_values(services.bootstrap, topic) == []


def test_an_asyncio_close_cancelled_still_says_what_it_drops_and_closes(
    services: Services, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The asyncio close() cancelled while its flush waits on a frozen broker (Ctrl-C
    under asyncio.run cancels the main task): the WARNING, the purge and AIOProducer's
    own close were skipped. It now does all three, then lets the cancel out."""
    sent = records()

    async def close(producer: AsyncActivityProducer) -> None:
        with caplog.at_level(logging.WARNING, logger=producer_log.name):
            closing = asyncio.create_task(producer.close(timeout=30))
            await asyncio.sleep(1)
            closing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await closing

    took = _aio_close_on_a_frozen_broker(services, topic, sent, close)
    assert took < 10, f"close() cancelled after 1 s took {took:.1f} s"
    said = f"interrupted (CancelledError): {len(sent)} record(s) not delivered, dropped"
    assert said in caplog.text
    assert "never retrieved" not in caplog.text
    assert committed_values(services.bootstrap, topic) == []


def test_a_default_on_delivery_in_extra_reports_each_record_without_a_hook_of_its_own(
    services: Services, topic: str
) -> None:
    """confluent-kafka calls the configuration's ``on_delivery`` for each record produced
    without a callback of its own. The synchronous SDK gives every record its own (to
    count what close() drops), so a service's default in ``extra`` never fired. It must,
    for every record sent without a hook: in a transaction of the caller's own, in
    send_transaction and in a transaction() block; a send's own hook replaces it, as in
    confluent-kafka."""
    sent = records()
    default: list[tuple[object, bytes | None]] = []
    own: list[bytes | None] = []

    def report(err: object, msg: Message) -> None:
        default.append((err, msg.value()))

    producer = ActivityProducer(
        services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}", extra={"on_delivery": report}
    )
    producer.start()
    try:
        producer.client.begin_transaction()
        producer.send_record(sent[0])
        producer.client.commit_transaction(30)
        producer.send_transaction(sent[1:3])
        with producer.transaction():
            producer.send_record(sent[3])
            producer.send_record(sent[4], on_delivery=lambda err, msg: own.append(msg.value()))
    finally:
        producer.close()
    assert default == [(None, r.value) for r in sent[:4]]
    assert own == [sent[4].value]
