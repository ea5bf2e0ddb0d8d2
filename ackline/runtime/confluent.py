"""`ackline run` on the default runtime: the confluent-kafka consumer thread.

Builds the worker with :func:`ackline.runtime.wiring.build_ingest`, starts the consumer
thread (:class:`ackline.streams.consumer.ConsumerRuntime`) and handles the signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ackline.clients import kafka_client_config
from ackline.core.errors import AcklineError
from ackline.core.signals import exit_now, stop_signals
from ackline.core.tasks import in_daemon_thread, settle
from ackline.runtime import BeforeJoin
from ackline.runtime.health import probe_database
from ackline.runtime.wiring import build_ingest, decode_limits, load_payload_plugins, tune_malloc
from ackline.settings import Settings
from ackline.streams.consumer import ConsumerRuntime
from ackline.streams.consumer_config import RuntimeConfig
from ackline.streams.deadletter import prepare_topics

T = TypeVar("T")

log = logging.getLogger(__name__)


def runtime_config(settings: Settings, bootstrap: str) -> RuntimeConfig:
    return RuntimeConfig(
        bootstrap=bootstrap,
        topic=settings.topic,
        group_id=settings.group_id,
        worker_id=settings.worker_id,
        group_protocol=settings.group_protocol,
        session_timeout_ms=settings.session_timeout_ms,
        start_from=settings.start_from,
        batch_max_events=settings.batch_max_events,
        batch_linger_ms=settings.batch_linger_ms,
        batch_max_bytes=settings.batch_max_bytes,
        limits=decode_limits(settings),
        revoke_wait_s=settings.revoke_wait_s,
        db_leave_after_s=settings.db_leave_after_s,
        shutdown_wait_s=settings.shutdown_wait_s,
        max_poll_interval_ms=settings.max_poll_interval_ms,
        newer_version_wait_s=settings.newer_version_wait_s,
        kafka_extra=tuple(kafka_client_config(settings).items()),
    )


async def run(
    settings: Settings,
    bootstrap: str,
    dsn: str,
    until_drained: bool = False,
    on_signal: Callable[[int], None] | None = None,
    exit_on_repeat: bool = False,
    before_join: BeforeJoin | None = None,
) -> int:
    """Consume until SIGTERM/SIGINT (or until drained); return the exit status.

    Order of effects at start: wire the worker (:func:`build_ingest`: the ingest DSN may
    raise SettingsError) and register the payload plugins, both before anything connects;
    handle SIGTERM/SIGINT; check the topic exists and create the dead-letter topic if
    missing; serve /metrics, /healthz, /readyz (when metrics_port is set);
    ``before_join`` (`ackline run`: wait for PostgreSQL); start the
    PostgreSQL health probe and the watch of the topic's incarnation; connect lazily;
    join the group in the consumer thread. The watch finding the topic recreated stops
    the worker as SIGTERM does, and the run then raises the start's refusal
    (AcklineError: status 2). At
    SIGTERM or SIGINT: the consumer thread finishes or cancels the batches in flight, stores
    offsets, leaves the group; then the probe and the HTTP server stop, connections close
    and the status is 0; ``on_signal`` is told which signal it was, and the handlers that
    were there before are back (:func:`stop_signals`). With ``exit_on_repeat`` (`ackline
    run`) a second SIGINT exits at once (:func:`exit_now`); a caller with cleanup of its
    own after the worker (``ackline demo`` stops its stack) leaves it off.

    ``dsn`` is the operator's; every connection of the worker is made as the ingest
    role (:func:`ackline.clients.ingest_dsn`), which may only append event data.
    """
    ingest = build_ingest(settings, bootstrap, dsn)
    load_payload_plugins(settings.payload_plugins)
    loop = asyncio.get_running_loop()
    runtime = ConsumerRuntime(
        runtime_config(settings, bootstrap),
        ingest.control_db,
        ingest.writers,
        ingest.dead_letters,
        ingest.metrics,
        loop,
        ingest.faults,
    )
    runtime.drain_and_stop = until_drained
    stopping = asyncio.Event()
    halted = threading.Event()  # the same request, for a thread

    def request_stop() -> None:
        runtime.request_stop()
        stopping.set()
        halted.set()

    # First, so a stop request during start-up ends the run cleanly (status 0) at once,
    # instead of killing the process mid-start.
    with stop_signals(loop, request_stop, on_signal, exit_now if exit_on_repeat else None):
        partitions = await _unless_stopped(
            lambda: prepare_topics(
                bootstrap, settings.topic, settings.dlq_topic, ingest.kafka_conf, halted.is_set
            ),
            stopping,
        )
        if partitions is not None:
            ingest.metrics.topic_partitions.set(partitions)
            ingest.serve()  # /healthz answers while before_join waits for PostgreSQL
            if before_join is not None:
                with ingest.waiting_to_join():
                    ingest.incarnation.start_from(await before_join(stopping.is_set))
        if partitions is None or stopping.is_set():
            await ingest.close(CLOSE_WAIT_S)
            log.info("stopped before the worker started")
            return 0
        done: asyncio.Future[None] = loop.create_future()

        def body() -> None:
            try:
                runtime.run()
            except BaseException as exc:
                loop.call_soon_threadsafe(settle, done, None, exc)
            else:
                loop.call_soon_threadsafe(settle, done, None, None)

        probe = asyncio.create_task(
            probe_database(
                ingest.dsn, ingest.metrics, settings.db_check_interval_s, settings.worker_id
            )
        )
        runtime.incarnation_fresh = ingest.incarnation.fresh_since
        runtime.incarnation_settled = ingest.incarnation.settled
        watch = asyncio.create_task(ingest.incarnation.run(on_other=request_stop))
        _tune_gc()
        tune_malloc()
        _tune_switching()
        thread = threading.Thread(target=body, name="ackline-consumer", daemon=True)
        thread.start()
        status = 0
        try:
            if not await _joined(done, stopping, settings.shutdown_wait_s + CLOSE_WAIT_S):
                log.error(
                    "the consumer did not close within %g s of the stop request "
                    "(ACKLINE_SHUTDOWN_WAIT_S + %g s): Kafka does not answer its offset "
                    "commit or LeaveGroup. Exiting without leaving the group: what "
                    "committed in PostgreSQL stands, and the group reassigns the "
                    "partitions after the session timeout",
                    settings.shutdown_wait_s + CLOSE_WAIT_S,
                    CLOSE_WAIT_S,
                )
                status = 1
        finally:
            request_stop()
            for task in (probe, watch):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await ingest.close(CLOSE_WAIT_S)
    log.info("stopped after %d committed batches", runtime.committed_batches)
    if ingest.incarnation.refusal is not None:  # stopped on a recreated topic: as at start
        raise AcklineError(ingest.incarnation.refusal)
    return status


CLOSE_WAIT_S = 10.0
"""How long the consumer's close (store offsets, commit them, leave the group) and the
connections' close may take after the batches in flight settled. librdkafka's close
waits for the broker with no bound of its own: with the broker gone, a worker stayed
deaf to SIGTERM until it came back."""


async def _unless_stopped(work: Callable[[], T], stopping: asyncio.Event) -> T | None:
    """``work()`` in a daemon thread, the loop free meanwhile; None once ``stopping`` is
    set (the thread is left to end by itself).

    On the loop, the topic checks held it for as long as Kafka took to answer (10 s when
    it was not there), and a SIGTERM or SIGINT meanwhile was handled only after them: the
    worker then failed as if Kafka were down (status 2), its stop lost. ``work`` should
    end soon after the stop (here its metadata waits poll the same request)."""
    task, thread = in_daemon_thread(work, "ackline-topics")
    halt = asyncio.ensure_future(stopping.wait())
    both: set[asyncio.Future[Any]] = {task, halt}
    try:
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
    finally:
        halt.cancel()
    if stopping.is_set():
        for _ in range(60):  # its waits poll the same request: let it end (3 s at most)
            if not thread.is_alive():
                break
            await asyncio.sleep(0.05)
        return None
    return task.result()


async def _joined(done: asyncio.Future[None], stopping: asyncio.Event, bound_s: float) -> bool:
    """Wait for the consumer thread's end (``done``, whose exception is raised); once a
    stop is requested, at most ``bound_s`` more. False when that bound ran out: the
    thread, a daemon, is left blocked in librdkafka and the process exits without it."""
    stop = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait((done, stop), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if not done.done():
        await asyncio.wait((done,), timeout=bound_s)
        if not done.done():
            return False
    done.result()
    return True


GIL_SWITCH_S = 0.0005


def _tune_switching() -> None:
    """Hand the GIL over within 0.5 ms instead of Python's 5 ms.

    While the consumer thread decodes the next batch (pure Python, holding the GIL) the
    loop thread writes the current one, a dozen round trips to PostgreSQL per batch. Each
    reply woke the loop thread, which then waited for the decoding thread to give up the
    GIL: up to 5 ms per round trip with PostgreSQL idle. Measured per 2,000-event batch
    (1M events, one worker): BEGIN 5.7 -> 1.1 ms, the fence 4.7 -> 1.1 ms, the savepoint
    3.6 -> 0.9 ms; 37,337 -> 42,040 events/s at the same worker CPU per event.
    """
    sys.setswitchinterval(GIL_SWITCH_S)


def _tune_gc() -> None:
    """Fewer, cheaper garbage collections for a worker that makes objects per event.

    Everything alive at start (modules, settings, clients) moves to the permanent
    generation (``gc.freeze``), so full collections no longer walk it, and the youngest
    generation is collected every 50,000 allocations instead of 700: decoding allocates
    a few dozen short-lived objects per event, almost all freed by reference counting.
    Measured on 200k events: about 6 % less worker CPU (docs/performance.md, "Where
    the time went"). Cycles are still collected, just less often.
    """
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
