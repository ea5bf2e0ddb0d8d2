"""A transaction is whole or absent, whatever the client refuses along the way.

Records the client itself refuses never reach the broker, so the broker's transaction does
not know of them: a producer that commits anyway commits the others without them. Three
ways in, each against the real broker, each through both SDK producers:

* an event that ackline's decoder accepts (up to 1 MiB) but librdkafka's default
  ``message.max.bytes`` (1,000,000) did not: it must be committed with its transaction;
* a record over a ``message.max.bytes`` the service set lower: nothing is committed, and
  the error names the setting, also when a ``transaction()`` block catches it and goes on;
* more records in one transaction than librdkafka's local queue holds
  (``queue.buffering.max.messages``): every record committed, once; with the broker
  away, the wait for room ends at the call's timeout, nothing committed;
* the broker away for longer than ``message.timeout.ms``: nothing committed, and the
  error says the same records may be sent again (:class:`TransientProduceError`), also
  when the abort itself cannot reach the broker;
* a topic whose ``max.message.bytes`` is below librdkafka's batch size: records that each
  fit are committed (the producer batches within the limit it reads at ``start()``), and
  with the limit lowered after ``start()`` their batch's refusal is transient;
* a topic that does not exist, with a short ``timeout``: the error names it, transient;
* a start on a topic that does not exist: a WARNING names it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from ackline.schemas import new_envelope
from ackline.streams.aio_producer import AsyncActivityProducer
from ackline.streams.errors import OutcomeUnknownError, ProduceError, TransientProduceError
from ackline.streams.producer import ActivityProducer, Outgoing, prepare
from tests.integration.harness import Services
from tests.integration.producing import committed_values, set_max_message_bytes, unit_of_work
from tests.integration.test_aio_producer import frozen_broker

pytestmark = pytest.mark.integration

Send = Callable[[Services, str, Sequence[Outgoing], dict[str, Any]], None]


def _aio(block: bool) -> Send:
    """Send through the asyncio producer: ``send_transaction``, or ``send`` calls in a
    ``transaction()`` block."""

    def send(
        services: Services, topic: str, records: Sequence[Outgoing], extra: dict[str, Any]
    ) -> None:
        async def run() -> None:
            producer = AsyncActivityProducer(
                services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}", extra=extra
            )
            await producer.start()
            try:
                await _aio_send(producer, records, block, 30)
            finally:
                await producer.close()

        asyncio.run(run())

    return send


async def _aio_send(
    producer: AsyncActivityProducer, records: Sequence[Outgoing], block: bool, timeout: float
) -> None:
    """``send_transaction``, or ``send`` calls in a ``transaction()`` block."""
    if not block:
        await producer.send_transaction(records, timeout=timeout)
        return
    async with producer.transaction(timeout=timeout):
        for record in records:
            await producer.send(record)


def _sync_send(
    producer: ActivityProducer,
    records: Sequence[Outgoing],
    block: bool,
    timeout: float,
    *,
    catch: bool = False,
) -> None:
    """``send_transaction``, or ``send_record`` calls in a ``transaction()`` block (that
    ``catch``es each send's ProduceError and goes on, if asked)."""
    if not block:
        producer.send_transaction(records, timeout=timeout)
        return
    with producer.transaction(timeout=timeout):
        for record in records:
            with contextlib.suppress(*((ProduceError,) if catch else ())):
                producer.send_record(record)


def _sync(block: bool) -> Send:
    """Send through the synchronous producer, the same two ways."""

    def send(
        services: Services, topic: str, records: Sequence[Outgoing], extra: dict[str, Any]
    ) -> None:
        producer = ActivityProducer(
            services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}", extra=extra
        )
        producer.start()
        try:
            _sync_send(producer, records, block, 30)
        finally:
            producer.close()

    return send


SENDS = pytest.mark.parametrize(
    "send",
    [_aio(False), _aio(True), _sync(False), _sync(True)],
    ids=["aio-send_transaction", "aio-transaction", "sync-send_transaction", "sync-transaction"],
)


def _big(size: int) -> Outgoing:
    """A valid ``tool.result`` whose record value is about ``size`` bytes."""
    request = f"r{uuid.uuid4().hex[:6]}"
    envelope = new_envelope(
        "tool.result",
        f"run-{request}:big",
        "agent-a",
        request,
        {"run_id": f"run-{request}", "call_id": "c1", "ok": True, "output": "", "duration_ms": 5},
    )
    pad = size - len(prepare(envelope).value)
    envelope = new_envelope(
        "tool.result",
        envelope.txn_id,
        "agent-a",
        request,
        {
            "run_id": f"run-{request}",
            "call_id": "c1",
            "ok": True,
            # random: lz4 cannot shrink it, so the broker weighs the whole record
            "output": secrets.token_hex(pad // 2 + 1)[:pad],
            "duration_ms": 5,
        },
    )
    return prepare(envelope)


def _around(middle: Outgoing) -> list[Outgoing]:
    small = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-b", 1)]
    return [*small[:2], middle, *small[2:]]


@SENDS
def test_an_event_the_decoder_accepts_is_committed_with_its_transaction(
    services: Services, topic: str, send: Send
) -> None:
    big = _big(1_040_000)
    assert 1_000_000 < len(big.value) <= 1_048_576, len(big.value)
    records = _around(big)
    send(services, topic, records, {})
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in records)


@SENDS
def test_a_record_over_the_services_own_limit_commits_nothing(
    services: Services, topic: str, send: Send
) -> None:
    records = _around(_big(20_000))
    with pytest.raises(ProduceError, match=r"message\.max\.bytes") as refused:
        send(services, topic, records, {"message.max.bytes": 10_000})
    assert not isinstance(refused.value, OutcomeUnknownError)
    assert committed_values(services.bootstrap, topic) == []


_LOW_LIMIT = {"message.max.bytes": 10_000}


@dataclass
class Outcome:
    """What a ``transaction()`` block that catches every send's ProduceError led to."""

    raised: ProduceError | None = None
    """What the block's end raised (None: it committed)."""
    visible: list[bytes] = field(default_factory=list)
    """What a read_committed consumer saw after it."""
    sends: list[ProduceError | None] = field(default_factory=list)
    """What each send raised (None: it queued its record)."""
    on_error: Callable[[], object] = lambda: None
    """Called after a send raised."""
    slot: str = ""
    """The producer's transactional.id, for a resend from a new instance of it."""

    @contextmanager
    def send(self) -> Iterator[None]:
        """Around one send: keep what it raised instead of raising it."""
        try:
            yield
        except ProduceError as exc:
            self.sends.append(exc)
            self.on_error()
        else:
            self.sends.append(None)


Caught = Callable[[Services, str, Sequence[Outgoing]], Outcome]


def _block_sync(
    producer: ActivityProducer, records: Sequence[Outgoing], timeout: float, out: Outcome
) -> None:
    """A ``transaction(timeout)`` block sending ``records``, each send's ProduceError
    caught into ``out``, and what the block's end raised into ``out.raised``."""
    try:
        with producer.transaction(timeout=timeout):
            for record in records:
                with out.send():
                    producer.send_record(record)
    except ProduceError as exc:
        out.raised = exc


async def _block_aio(
    producer: AsyncActivityProducer, records: Sequence[Outgoing], timeout: float, out: Outcome
) -> None:
    """:func:`_block_sync` through the asyncio producer."""
    try:
        async with producer.transaction(timeout=timeout):
            for record in records:
                with out.send():
                    await producer.send(record)
    except ProduceError as exc:
        out.raised = exc


def _caught_sync(services: Services, topic: str, records: Sequence[Outgoing]) -> Outcome:
    """A ``transaction()`` block that catches every send's ProduceError and goes on
    (:class:`Outcome`); then a second transaction on the same instance with the records
    that fit."""
    producer = ActivityProducer(
        services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}", extra=_LOW_LIMIT
    )
    producer.start()
    out = Outcome()
    try:
        _block_sync(producer, records, 30, out)
        out.visible = committed_values(services.bootstrap, topic)
        _sync_send(producer, _fitting(records), True, 30)
    finally:
        producer.close()
    return out


def _caught_aio(services: Services, topic: str, records: Sequence[Outgoing]) -> Outcome:
    """:func:`_caught_sync` through the asyncio producer."""

    async def run() -> Outcome:
        producer = AsyncActivityProducer(
            services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}", extra=_LOW_LIMIT
        )
        await producer.start()
        out = Outcome()
        try:
            await _block_aio(producer, records, 30, out)
            out.visible = await asyncio.to_thread(committed_values, services.bootstrap, topic)
            async with producer.transaction(timeout=30):
                for record in _fitting(records):
                    await producer.send(record)
        finally:
            await producer.close()
        return out

    return asyncio.run(run())


def _fitting(records: Sequence[Outgoing]) -> list[Outgoing]:
    """The records under :data:`_LOW_LIMIT`."""
    return [r for r in records if len(r.value) < _LOW_LIMIT["message.max.bytes"]]


@pytest.mark.parametrize("caught", [_caught_aio, _caught_sync], ids=["aio", "sync"])
def test_a_refusal_the_block_catches_still_commits_nothing(
    services: Services, topic: str, caught: Caught
) -> None:
    """The block catches the too-large record's ProduceError (refused before queueing,
    so the broker's transaction never learns of it) and sends the others. Both producers
    committed them without it: a partial transaction. Now the commit step aborts and
    raises a ProduceError naming the refusal; the next transaction of the same instance
    starts clean and commits."""
    records = _around(_big(20_000))
    out = caught(services, topic, records)
    assert out.visible == [], "a transaction was committed without the record its block caught"
    assert type(out.raised) is ProduceError, repr(out.raised)
    refusal = r"nothing committed: .*ProduceError: record 0 .*message\.max\.bytes"
    assert re.search(refusal, str(out.raised)), str(out.raised)
    others = _fitting(records)
    assert len(others) == len(records) - 1
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in others)


@pytest.mark.parametrize("caught", [_caught_aio, _caught_sync], ids=["aio", "sync"])
def test_sends_after_one_the_block_caught_raise_at_once(
    services: Services, topic: str, caught: Caught
) -> None:
    """Once a send in a ``transaction()`` block raised, the transaction is bound to be
    aborted, yet the later sends of a block that caught the error still queued their
    records for the broker. Now each raises at once, its record not queued, naming the
    first error, with the class the block's end raises (here a refusal: ProduceError)."""
    big = _big(20_000)
    records = [big, *_fitting(_around(big))]
    out = caught(services, topic, records)
    first, *later = out.sends
    assert first is not None and "message.max.bytes" in str(first), repr(first)
    assert later, "the block sent nothing after the refusal"
    for exc in later:
        assert type(exc) is ProduceError and exc.__cause__ is first, repr(exc)
        assert re.search(r"not sent: .*earlier send .*message\.max\.bytes", str(exc)), str(exc)
    assert type(out.raised) is ProduceError and str(first) in str(out.raised), repr(out.raised)
    assert out.visible == []


def test_an_aborted_block_leaves_no_delivery_error_unretrieved(
    services: Services, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An asyncio ``transaction()`` block queues a record the broker will refuse (over the
    topic's ``max.message.bytes``), then catches a send the client refused and ends: the
    abort's flush fails the first record's future. That abort path never retrieved the
    error, so asyncio logged "Future exception was never retrieved" for each such record
    when it was collected, after the SDK had raised what became of them."""
    set_max_message_bytes(services.bootstrap, topic, 20_000)
    to_the_broker, to_the_client = _big(60_000), _big(200_000)

    async def run() -> str:
        producer = AsyncActivityProducer(
            services.bootstrap,
            topic,
            f"svc-{uuid.uuid4().hex[:8]}",
            extra={"message.max.bytes": 100_000},
        )
        await producer.start()
        try:
            async with producer.transaction(timeout=30):
                await producer.send(to_the_broker)  # its future fails in the abort's flush
                with contextlib.suppress(ProduceError):
                    await producer.send(to_the_client)  # over message.max.bytes
        except ProduceError as exc:
            return f"{type(exc).__name__}: {exc}"  # not the error: its frames hold the futures
        finally:
            await producer.close()
        return "committed"

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        raised = asyncio.run(run())
        gc.collect()  # the futures are gone: asyncio logs any error never retrieved
    assert re.match(r"ProduceError: transaction aborted.*message\.max\.bytes", raised), raised
    assert "never retrieved" not in caplog.text
    assert committed_values(services.bootstrap, topic) == []


@SENDS
def test_more_records_than_the_local_queue_holds_are_all_committed(
    services: Services, topic: str, send: Send
) -> None:
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-c", 20)]
    send(services, topic, records, {"queue.buffering.max.messages": 5})
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in records)


def _thawed_after(services: Services, seconds: float) -> threading.Timer:
    """The broker frozen now and woken ``seconds`` later, from another thread."""
    thaw = ExitStack()
    thaw.enter_context(frozen_broker(services))
    timer = threading.Timer(seconds, thaw.close)
    timer.start()
    return timer


def test_records_that_time_out_while_the_broker_is_away_commit_nothing_and_may_be_resent(
    services: Services, topic: str
) -> None:
    """Both producers, started before the broker goes away for longer than
    ``message.timeout.ms``; then the same records again from new instances."""
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-d", 1)]
    extra = {"message.timeout.ms": 3_000}

    sync = ActivityProducer(services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}", extra=extra)
    sync.start()
    timer = _thawed_after(services, 6)
    try:
        with pytest.raises(TransientProduceError, match="again"):
            sync.send_transaction(records, timeout=30)
    finally:
        timer.join()
        sync.close()

    async def aio() -> None:
        producer = AsyncActivityProducer(
            services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}", extra=extra
        )
        await producer.start()
        timer = _thawed_after(services, 6)
        try:
            with pytest.raises(TransientProduceError, match="again"):
                await producer.send_transaction(records, timeout=30)
        finally:
            await asyncio.to_thread(timer.join)
            await producer.close()

    asyncio.run(aio())
    assert committed_values(services.bootstrap, topic) == []
    _sync(False)(services, topic, records, extra)  # the same records, broker back
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in records)


def _send_record(producer: ActivityProducer, record: Outgoing) -> None:
    producer.send_record(record)


def _send_bytes(producer: ActivityProducer, record: Outgoing) -> None:
    producer.send_bytes(record.key, record.value, list(record.headers))


@pytest.mark.parametrize("send", [_send_record, _send_bytes], ids=["send_record", "send_bytes"])
def test_records_a_block_sent_that_time_out_while_the_broker_is_away_say_so(
    services: Services, topic: str, send: Callable[[ActivityProducer, Outgoing], None]
) -> None:
    """:func:`test_records_that_time_out_while_the_broker_is_away_commit_nothing_and_may_be_resent`
    in a synchronous ``transaction()`` block. Its end judges a failed transaction by the
    delivery reports of the records sent in it; ``send_bytes`` kept none (``send_record``
    does), so a raw record timed out with the broker away ended as a plain ProduceError,
    a refusal by the SDK's own rule, where its docstring and docs/producing.md say
    TransientProduceError: send the same again."""
    record = prepare(unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-d", 1)[0])
    extra = {"message.timeout.ms": 3_000}
    producer = ActivityProducer(
        services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}", extra=extra
    )
    producer.start()
    timer = _thawed_after(services, 6)
    try:
        with pytest.raises(TransientProduceError, match="again"), producer.transaction(30):
            send(producer, record)
    finally:
        timer.join()
        producer.close()
    assert committed_values(services.bootstrap, topic) == []
    producer = ActivityProducer(services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}")
    producer.start()
    try:
        with producer.transaction(30):  # the same bytes again, broker back
            send(producer, record)
    finally:
        producer.close()
    assert committed_values(services.bootstrap, topic) == [record.value]


_SMALL_QUEUE = {"queue.buffering.max.messages": 4}
"""Room for fewer records than the transaction has (the asyncio producer flushes every two)."""


_NO_ROOM = "nothing of the transaction"
"""What a wait for room given up says (an abort not confirmed says it too)."""


def _thaw_now(timer: threading.Timer) -> None:
    """Wake the broker of :func:`_thawed_after` now, not when its timer fires (thawing
    twice is harmless: the timer may fire meanwhile)."""
    timer.cancel()
    timer.function(*timer.args, **timer.kwargs)


def _no_room_aio(services: Services, topic: str, slot: str, records: Sequence[Outgoing]) -> float:
    """The asyncio producer's ``send_transaction`` with a 2 s timeout, the broker frozen for
    10 s (or until it gave up, as it should after 2 s: a wait until the thaw is the defect):
    how long it took to give up. It flushes when half its local queue is taken."""

    async def run() -> float:
        producer = AsyncActivityProducer(services.bootstrap, topic, slot, extra=_SMALL_QUEUE)
        await producer.start()
        timer = _thawed_after(services, 10)
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            with pytest.raises(TransientProduceError, match=_NO_ROOM):
                await producer.send_transaction(records, timeout=2)
            return loop.time() - began
        finally:
            _thaw_now(timer)
            await producer.close()

    return asyncio.run(run())


def _no_room_sync(block: bool) -> Callable[[Services, str, str, Sequence[Outgoing]], float]:
    """:func:`_no_room_aio` through the synchronous producer (``send_transaction``, or a
    ``transaction()`` block): it waits for room on the full queue itself."""

    def run(services: Services, topic: str, slot: str, records: Sequence[Outgoing]) -> float:
        producer = ActivityProducer(services.bootstrap, topic, slot, extra=_SMALL_QUEUE)
        producer.start()
        timer = _thawed_after(services, 10)
        began = time.monotonic()
        try:
            with pytest.raises(TransientProduceError, match=_NO_ROOM):
                _sync_send(producer, records, block, 2)
            return time.monotonic() - began
        finally:
            _thaw_now(timer)
            producer.close()

    return run


@pytest.mark.parametrize(
    "no_room",
    [_no_room_aio, _no_room_sync(False), _no_room_sync(True)],
    ids=["aio-send_transaction", "sync-send_transaction", "sync-transaction"],
)
def test_a_full_local_queue_waits_no_longer_than_the_transactions_timeout(
    services: Services,
    topic: str,
    no_room: Callable[[Services, str, str, Sequence[Outgoing]], float],
) -> None:
    """With the broker away, a wait for room in the local queue lasted up to 60 s (the
    asyncio producer's flush, the synchronous one's produce() loop until the records timed
    out, or the broker came back) whatever timeout the caller gave; now it waits the
    transaction's, aborts, and says nothing was committed. Both producers the same way."""
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-q", 1)]
    assert len(records) > _SMALL_QUEUE["queue.buffering.max.messages"]
    slot = f"svc-{uuid.uuid4().hex[:8]}"
    took = no_room(services, topic, slot, records)
    assert took < 9, f"gave up after {took:.1f} s with a 2 s timeout (a drain and an abort)"
    assert committed_values(services.bootstrap, topic) == []
    # the same records from a new instance of the same slot, broker back: its start aborts
    # what the old one left open (records that reached the broker after the thaw)
    _aio(False)(services, topic, records, {"transactional.id": slot})
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in records)


def _swallowed_sync(services: Services, topic: str, records: Sequence[Outgoing]) -> Outcome:
    """A synchronous ``transaction(timeout=3)`` block, the broker frozen, that catches
    every send's ProduceError and goes on: the send that finds no room in the local queue
    within 3 s raises TransientProduceError, and the block wakes the broker then (so the
    abort can be confirmed). :class:`Outcome`, ``visible`` read after the block."""
    slot = f"svc-{uuid.uuid4().hex[:8]}"
    producer = ActivityProducer(services.bootstrap, topic, slot, extra=_SMALL_QUEUE)
    producer.start()
    timer = _thawed_after(services, 20)
    out = Outcome(on_error=functools.partial(_thaw_now, timer), slot=slot)
    try:
        _block_sync(producer, records, 3, out)
    finally:
        _thaw_now(timer)
        producer.close()
    out.visible = committed_values(services.bootstrap, topic)
    return out


def _swallowed_aio(services: Services, topic: str, records: Sequence[Outgoing]) -> Outcome:
    """:func:`_swallowed_sync` through the asyncio producer (its send flushes when half
    the local queue is taken, and raises when that flush does not drain in 3 s)."""

    slot = f"svc-{uuid.uuid4().hex[:8]}"

    async def run() -> Outcome:
        producer = AsyncActivityProducer(services.bootstrap, topic, slot, extra=_SMALL_QUEUE)
        await producer.start()
        timer = _thawed_after(services, 20)
        out = Outcome(on_error=functools.partial(_thaw_now, timer), slot=slot)
        try:
            await _block_aio(producer, records, 3, out)
        finally:
            _thaw_now(timer)
            await producer.close()
        return out

    out = asyncio.run(run())
    out.visible = committed_values(services.bootstrap, topic)
    return out


@pytest.mark.parametrize("swallowed", [_swallowed_aio, _swallowed_sync], ids=["aio", "sync"])
def test_a_transient_send_error_the_block_swallows_commits_nothing_and_says_transient(
    services: Services, topic: str, swallowed: Caught, caplog: pytest.LogCaptureFixture
) -> None:
    """A send in a ``transaction()`` block meets no room in the local queue within the
    transaction's timeout (the broker frozen), raises TransientProduceError, and the
    block swallows it and goes on. The block's end must abort, not commit without that
    record, and raise TransientProduceError naming it (nothing committed: send the same
    records again), or, when the broker just woken cannot confirm the abort within the
    3 s, the abort's own TransientProduceError (nothing committed: resend from a new
    instance); a read_committed consumer sees none of the block's records. The same
    records then commit, exactly once, from a new instance of the same transactional.id
    (whose start aborts what an unconfirmed abort left open)."""
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-w", 1)]
    assert len(records) > _SMALL_QUEUE["queue.buffering.max.messages"]
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        out = swallowed(services, topic, records)
        gc.collect()
    failed = [exc for exc in out.sends if exc is not None]
    assert failed and isinstance(failed[0], TransientProduceError), out.sends
    assert isinstance(out.raised, TransientProduceError), repr(out.raised)
    no_room = r"nothing committed: .*TransientProduceError: the local queue .* 3 s \(the tr"
    unconfirmed = r"^abort\S* not confirmed .*nothing of the transaction was committed"
    assert re.search(f"{no_room}|{unconfirmed}", str(out.raised)), str(out.raised)
    assert out.visible == []
    assert "never retrieved" not in caplog.text
    _sync(False)(services, topic, records, {"transactional.id": out.slot})
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in records)


def test_an_abort_the_broker_cannot_confirm_commits_nothing_and_may_be_resent(
    services: Services, topic: str
) -> None:
    """A record delivered into the transaction (so the broker holds it open), then the
    broker away: the next record times out, the abort cannot reach the broker. Both
    producers say nothing was committed, refuse further work, and a new instance with
    the same transactional.id sends the same records once the broker is back."""
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-e", 1)]
    extra = {"message.timeout.ms": 3_000}
    sync_id, aio_id = f"svc-{uuid.uuid4().hex[:8]}", f"svc-{uuid.uuid4().hex[:8]}"

    sync = ActivityProducer(services.bootstrap, topic, sync_id, extra=extra)
    sync.start()
    timer: threading.Timer | None = None
    try:
        with (
            pytest.raises(TransientProduceError, match="nothing of the transaction"),
            sync.transaction(timeout=5),
        ):
            sync.send_record(records[0])
            assert sync.client.flush(10) == 0  # in the broker's open transaction
            timer = _thawed_after(services, 15)
            for record in records[1:]:
                sync.send_record(record)
        with pytest.raises(TransientProduceError, match="unusable"):
            sync.send_transaction(records)
    finally:
        if timer is not None:
            _thaw_now(timer)  # both answers are in: no need to wait out the 15 s
        sync.close()

    async def aio() -> None:
        producer = AsyncActivityProducer(services.bootstrap, topic, aio_id, extra=extra)
        await producer.start()
        timer: threading.Timer | None = None
        try:
            with pytest.raises(TransientProduceError, match="nothing of the transaction"):
                async with producer.transaction(timeout=5):
                    await producer.send(records[0])
                    assert await producer.flush(10) == 0
                    timer = _thawed_after(services, 15)
                    for record in records[1:]:
                        await producer.send(record)
            with pytest.raises(TransientProduceError, match="unusable"):
                await producer.send_transaction(records)
        finally:
            if timer is not None:
                _thaw_now(timer)
            await producer.close()

    asyncio.run(aio())
    # New instances of both slots: starting aborts what each old one left open.
    settle_aio = ActivityProducer(services.bootstrap, topic, aio_id)
    settle_aio.start()
    settle_aio.close()
    _sync(False)(services, topic, records, {"transactional.id": sync_id})
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in records)


_STALL = {"queue.buffering.max.messages": 3, "message.timeout.ms": 2_000}
"""A local queue smaller than the transaction, records timing out 2 s into the freeze."""
_TIMED_OUT = r"record\(s\) not delivered, first: _MSG_TIMED_OUT.*again"
"""Judged by the records that timed out (an abort not confirmed also says "again")."""


def _stalled_sync(
    services: Services, topic: str, records: Sequence[Outgoing], block: bool, catch: bool = False
) -> None:
    """The synchronous producer sends ``records`` while the broker is frozen for 6 s (in a
    block that catches the sends' errors, if asked: the ``_STATE`` refusals).

    It learns the partitions' leader first: records then wait for it and time out on it,
    which fails the transaction at once (with no leader known they time out unassigned,
    and only the commit fails, a path the test above covers)."""
    producer = ActivityProducer(
        services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}", extra=_STALL
    )
    producer.start()
    timer: threading.Timer | None = None
    try:
        producer.client.list_topics(topic, timeout=10)
        timer = _thawed_after(services, 6)
        with pytest.raises(TransientProduceError, match=_TIMED_OUT):
            _sync_send(producer, records, block, 30, catch=catch)
    finally:
        if timer is not None:
            timer.join()
        producer.close()


def _stalled_aio(services: Services, topic: str, records: Sequence[Outgoing], block: bool) -> None:
    """:func:`_stalled_sync` through the asyncio producer."""

    async def run() -> None:
        producer = AsyncActivityProducer(
            services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}", extra=_STALL
        )
        await producer.start()
        timer: threading.Timer | None = None
        try:
            await producer._client().list_topics(topic, timeout=10)  # no public way
            timer = _thawed_after(services, 6)
            with pytest.raises(TransientProduceError, match=_TIMED_OUT):
                await _aio_send(producer, records, block, 30)
        finally:
            if timer is not None:
                await asyncio.to_thread(timer.join)
            await producer.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("stalled", "block"),
    [
        (_stalled_aio, False),
        (_stalled_aio, True),
        (_stalled_sync, False),
        (_stalled_sync, True),
        (functools.partial(_stalled_sync, catch=True), True),
    ],
    ids=[
        "aio-send_transaction",
        "aio-transaction",
        "sync-send_transaction",
        "sync-transaction",
        "sync-transaction-caught",
    ],
)
def test_records_timed_out_behind_a_full_local_queue_commit_nothing_and_may_be_resent(
    services: Services,
    topic: str,
    stalled: Callable[[Services, str, Sequence[Outgoing], bool], None],
    block: bool,
) -> None:
    """More records than the local queue holds, and the broker (the partition's leader)
    away longer than ``message.timeout.ms``, back before the abort gives up. The queued
    records time out on the leader, librdkafka puts the transaction in its abortable-error
    state and refuses every later produce() with ``_STATE`` (and purges what is queued).
    Nothing is committed because the broker was away, not because a record was refused:
    :class:`TransientProduceError`, also when the block caught the ``_STATE`` refusals
    and went on. A plain ``ProduceError`` told the caller the records were bad, and a
    caller that drops refused records dropped good events."""
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-s", 3)]
    assert len(records) > 2 * _STALL["queue.buffering.max.messages"]
    stalled(services, topic, records, block)
    assert committed_values(services.bootstrap, topic) == []
    _sync(False)(services, topic, records, {})  # the same records again, broker back
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in records)


@pytest.mark.parametrize("let_out", [False, True], ids=["caught", "let-out"])
def test_after_a_state_refusal_a_blocks_later_sends_are_refused_as_documented(
    services: Services, topic: str, let_out: bool
) -> None:
    """Records time out behind a full local queue (the broker frozen), so librdkafka
    refuses the next produce() with ``_STATE``, and the block catches that and goes on.
    Every later send must raise as ``transaction()`` and docs/producing.md say: at once,
    not queued, :func:`send_refused` naming the first error, of the class the block's end
    raises (transient: the broker was away). They raised the internal ``_STATE``
    refusal again, a plain ProduceError. A block that lets such a refusal out still gets
    the transaction judged by its records' delivery errors; nothing is committed."""
    # Four queues' worth: on a loaded host librdkafka let a second queueful in after the
    # first timeouts, before the transaction's failure reached produce(), and with 7
    # records the first _STATE came at the last one, no later send left to check (a
    # fresh run); 12 leave later sends behind even then.
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-z", 8)]
    assert len(records) >= 4 * _STALL["queue.buffering.max.messages"]
    producer = ActivityProducer(
        services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}", extra=_STALL
    )
    producer.start()
    out = Outcome()
    timer: threading.Timer | None = None
    try:
        producer.client.list_topics(topic, timeout=10)  # so records time out on the leader
        timer = _thawed_after(services, 6)
        if let_out:
            try:
                with producer.transaction(timeout=30):
                    for record in records:
                        if any(exc is not None for exc in out.sends):
                            producer.send_record(record)  # its refusal leaves the block
                        else:
                            with out.send():
                                producer.send_record(record)
            except ProduceError as exc:
                out.raised = exc
        else:
            _block_sync(producer, records, 30, out)
    finally:
        if timer is not None:
            timer.join()
        producer.close()
    assert isinstance(out.raised, TransientProduceError), repr(out.raised)
    assert re.search(_TIMED_OUT, str(out.raised)), str(out.raised)
    failed = [exc for exc in out.sends if exc is not None]
    assert failed and "_STATE" in str(failed[0]), out.sends
    for later in failed[1:]:
        assert isinstance(later, TransientProduceError), repr(later)
        assert str(later).startswith("not sent: this transaction cannot commit"), str(later)
        assert "_STATE" in str(later), str(later)
    if not let_out:
        assert len(failed) > 1, out.sends
    assert committed_values(services.bootstrap, topic) == []
    _sync(False)(services, topic, records, {})  # the same records again, broker back
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in records)


@SENDS
def test_records_that_each_fit_a_lowered_topic_limit_are_committed_together(
    services: Services, topic: str, send: Send
) -> None:
    """The topic's ``max.message.bytes`` lowered below librdkafka's batch size
    (``batch.size``, 1,000,000 by default): six incompressible records of one key, each
    well under the limit, went out in one batch over it. The broker refused the batch
    (MESSAGE_TOO_LARGE), librdkafka failed every record in it with MSG_SIZE_TOO_LARGE
    (it never splits a batch), and the SDK called that a refusal for good: a caller
    told so drops records that would have gone through. Now the producer batches within
    the topic's limit and the transaction commits."""
    set_max_message_bytes(services.bootstrap, topic, 20_000)
    records = [_big(6_000) for _ in range(6)]  # one key (agent-a): one partition, one batch
    assert sum(len(r.value) for r in records) > 20_000
    send(services, topic, records, {})
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in records)


@SENDS
def test_a_record_over_a_lowered_topic_limit_alone_is_still_a_refusal(
    services: Services, topic: str, send: Send
) -> None:
    """The other side of the test above: a record that does not fit the topic's
    ``max.message.bytes`` even alone is refused for good (ProduceError, not transient),
    and nothing of its transaction is committed."""
    set_max_message_bytes(services.bootstrap, topic, 20_000)
    records = _around(_big(30_000))
    with pytest.raises(ProduceError, match="MSG_SIZE_TOO_LARGE") as refused:
        send(services, topic, records, {})
    assert not isinstance(refused.value, TransientProduceError | OutcomeUnknownError)
    assert committed_values(services.bootstrap, topic) == []


Started = Callable[[Services, str], None]
"""What a test does to the topic once the producer has started (None: nothing)."""
Sender = Callable[[Services, str, Sequence[Outgoing]], None]


def _sync_started(block: bool, timeout: float, then: Started | None = None) -> Sender:
    """A sync producer started on the topic, ``then`` run, the records sent."""

    def send(services: Services, topic: str, records: Sequence[Outgoing]) -> None:
        producer = ActivityProducer(services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}")
        producer.start()
        try:
            if then is not None:
                then(services, topic)
            _sync_send(producer, records, block, timeout)
        finally:
            producer.close()

    return send


def _aio_started(block: bool, timeout: float, then: Started | None = None) -> Sender:
    """:func:`_sync_started` with the asyncio producer."""

    def send(services: Services, topic: str, records: Sequence[Outgoing]) -> None:
        async def run() -> None:
            producer = AsyncActivityProducer(
                services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}"
            )
            await producer.start()
            try:
                if then is not None:
                    await asyncio.to_thread(then, services, topic)
                await _aio_send(producer, records, block, timeout)
            finally:
                await producer.close()

        asyncio.run(run())

    return send


@pytest.mark.parametrize(
    "send",
    [
        _aio_started(False, 3),
        _aio_started(True, 3),
        _sync_started(False, 3),
        _sync_started(True, 3),
    ],
    ids=["aio-send_transaction", "aio-transaction", "sync-send_transaction", "sync-transaction"],
)
def test_a_topic_that_does_not_exist_is_named_within_a_short_timeout(
    services: Services, send: Sender
) -> None:
    """A producer to a topic that does not exist (the test broker creates none on first
    use), with a ``timeout`` shorter than librdkafka's wait for the topic to appear
    (``topic.metadata.propagation.max.ms``, 30 s). The synchronous SDK said "commit not
    confirmed in time, outcome unknown" and the asyncio one "records not delivered in
    time": neither named the topic. Now the error says the topic does not exist, and is
    transient: nothing was committed, the same records may be sent once it does."""
    missing = f"t-missing-{uuid.uuid4().hex[:8]}"
    records = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-m", 1)]
    began = time.monotonic()
    with pytest.raises(TransientProduceError) as raised:
        send(services, missing, records)  # timeout=3
    assert time.monotonic() - began < 20
    text = str(raised.value)
    assert f"topic {missing} does not exist" in text, text


@pytest.mark.parametrize("sdk", ["sync", "aio"])
def test_a_start_on_a_topic_that_does_not_exist_warns_at_once(
    services: Services, topic: str, sdk: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``start()`` reads the topic's ``max.message.bytes`` and learnt there that the topic
    does not exist, but said nothing: a mistyped topic showed only when the first
    transaction failed, up to 30 s later (``topic.metadata.propagation.max.ms``), as
    transient. Now the start warns at once, naming the topic; an existing topic gets no
    such warning."""
    missing = f"t-missing-{uuid.uuid4().hex[:8]}"

    def start(name: str) -> None:
        slot = f"svc-{uuid.uuid4().hex[:8]}"
        if sdk == "sync":
            producer = ActivityProducer(services.bootstrap, name, slot)
            producer.start()
            producer.close()
            return

        async def run() -> None:
            aio = AsyncActivityProducer(services.bootstrap, name, slot)
            await aio.start()
            await aio.close()

        asyncio.run(run())

    with caplog.at_level(logging.WARNING, logger="ackline"):
        start(missing)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"topic {missing} does not exist" in line for line in said), said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ackline"):
        start(topic)
    assert not [r for r in caplog.records if "does not exist" in r.getMessage()]


def _lowered(services: Services, topic: str) -> None:
    set_max_message_bytes(services.bootstrap, topic, 20_000)


@pytest.mark.parametrize(
    "send",
    [
        _aio_started(False, 30, _lowered),
        _aio_started(True, 30, _lowered),
        _sync_started(False, 30, _lowered),
        _sync_started(True, 30, _lowered),
    ],
    ids=["aio-send_transaction", "aio-transaction", "sync-send_transaction", "sync-transaction"],
)
def test_records_refused_as_a_batch_over_a_limit_lowered_after_start_may_be_resent(
    services: Services, topic: str, send: Sender
) -> None:
    """The topic's limit lowered after the producer started (it batches within the limit
    it read then): the broker refuses the batch of records that each fit, and that is
    transient, not a refusal for good. The same records from a new instance, which reads
    the lowered limit, are committed."""
    records = [_big(6_000) for _ in range(6)]
    with pytest.raises(TransientProduceError, match=r"max\.message\.bytes.*new one") as raised:
        send(services, topic, records)
    assert "MSG_SIZE_TOO_LARGE" in str(raised.value)
    assert committed_values(services.bootstrap, topic) == []
    _sync(False)(services, topic, records, {})
    assert sorted(committed_values(services.bootstrap, topic)) == sorted(r.value for r in records)
