"""``ackline run --runtime faust``: a faust Worker around :func:`~.faust_app.make_app`'s app.

Start: check the topic exists and create the dead-letter topic if missing (as the
default runtime does); serve /metrics, /healthz, /readyz when metrics_port is set; then
the faust Worker joins the group. The first assignment claims the partitions in
PostgreSQL and seeks them to the DB offsets before faust lets any record through.

Stop: SIGTERM/SIGINT run faust's graceful stop: the flow stops, the batch in flight and
the records already taken are written and acked (``stream_wait_empty``), the DB offsets
are committed to Kafka, the agent stops, ackline's connections close; the status is 0.
faust's waits have no bound of their own (a broker gone keeps its commit and its
LeaveGroup waiting), so a stop that has not ended ``ACKLINE_SHUTDOWN_WAIT_S`` +
:data:`STOP_EXTRA_S` after the signal exits with status 1, as the default runtime's
does; a second SIGINT exits at once (130).
A batch that fails exits the process at once instead (crash-only, status 70), and so does
one whose dead letters a stop gave up on (the dead-letter topic cannot be written).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from ackline.core.errors import AcklineError, Terminated
from ackline.core.logs import exit_flushed
from ackline.core.metrics import Metrics
from ackline.core.signals import exit_now, run_stoppable, stops_between
from ackline.runtime import BeforeJoin
from ackline.runtime.faust_app import FaustApp, make_app
from ackline.runtime.health import probe_database
from ackline.runtime.wiring import build_ingest, load_payload_plugins, tune_malloc
from ackline.settings import Settings
from ackline.streams.deadletter import prepare_topics
from ackline.streams.faust_runtime import risk
from ackline.streams.faust_runtime.headers import install_lenient_headers
from ackline.streams.faust_runtime.sink import FaustSink
from ackline.streams.faust_runtime.transport import AcklineConsumer
from ackline.streams.lag import partition_lag
from ackline.streams.ownership import marks_past_retention
from ackline.streams.release import ReleaseGate

log = logging.getLogger(__name__)
DRAIN_CHECK_S = 0.5
LAG_INTERVAL_S = 5.0
SENTINEL_S = 0.1
STOP_EXTRA_S = 20.0
"""How long past ``ACKLINE_SHUTDOWN_WAIT_S`` a stop may take before the worker exits
anyway: the default runtime's bound (its close and its connections' close, 10 s each)."""


class _Worker(faust.Worker):
    """faust's Worker, leaving ackline's logging configuration alone, with no terminal
    spinner, and stopping without mode's last fixed second.

    mode's Worker clears the root logger's handlers and installs its own at start;
    ackline configured logging already (text or JSON lines, ``ackline.core.logs``).
    """

    stop_bound_s = 3600.0  # set by run()
    _overdue: threading.Timer | None = None
    _signalled = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # faust's start-up spinner ends by writing a backspace and "show cursor" to
        # stdout even when it is a file or a pipe; a service's stdout gets none of that
        self.spinner = None

    def _setup_logging(self) -> None:
        return None

    def _schedule_shutdown(self, sig: signal.Signals) -> None:
        """The first signal starts faust's graceful stop and the clock on it; a SIGINT
        during the stop (Ctrl-C twice) exits at once: PostgreSQL decides what committed."""
        if not self._signalled:
            self._signalled = True
            if self._overdue is None:
                self._arm()
        else:
            exit_now(sig)  # SIGINT: at once; SIGTERM again: the stop goes on
        super()._schedule_shutdown(sig)

    def on_worker_shutdown(self) -> None:
        """Every stop passes here (a signal's, or faust's own after a crash of its fetcher
        or a rebalance callback): the clock starts, if no signal started it."""
        if self._overdue is None:
            self._arm()
        super().on_worker_shutdown()

    def _arm(self) -> None:
        self._overdue = threading.Timer(self.stop_bound_s, _stop_overdue, (self.stop_bound_s,))
        self._overdue.daemon = True
        self._overdue.start()

    async def stop(self) -> None:
        """faust's stop, and the clock on it stopped once it is over (what is left, the
        loop's close, waits for nothing of Kafka's or PostgreSQL's)."""
        await super().stop()
        self.stopped()

    def stopped(self) -> None:
        """The stop ended in time: the clock on it stops."""
        if self._overdue is not None:
            self._overdue.cancel()

    async def _sentinel_task(self) -> None:
        """The loop's last run before mode closes it. mode sleeps one second here, after
        every service stopped and every task ended (``_gather_all``); a few turns of the
        loop let the callbacks of closed transports run."""
        await asyncio.sleep(SENTINEL_S)


def run(
    settings: Settings,
    bootstrap: str,
    dsn: str,
    until_drained: bool = False,
    before_join: BeforeJoin | None = None,
) -> int:
    """Run the faust worker until SIGTERM/SIGINT (or until drained); return the status.
    ``before_join`` runs after the topic checks, before faust starts (and joins).

    Refuses to start (SettingsError) on a faust-streaming it was not proven on, unless
    ``ACKLINE_FAUST_ACCEPT_RISK`` names that risk (:mod:`.risk`).
    """
    problems = risk.version_problems(
        faust.__version__,
        faust_aiokafka.Consumer,
        faust_aiokafka.AIOKafkaConsumerThread,
        faust.Stream,
        faust.App,
        faust_aiokafka.ConsumerRebalanceListener,
    )
    risk.check(problems, settings.faust_accept_risk)
    if problems:
        log.warning("running with the accepted risk %s: %s", risk.UNTESTED_VERSION, problems)
    install_lenient_headers()  # before the app's consumer exists: non-UTF-8 header keys
    ingest = build_ingest(settings, bootstrap, dsn)
    tune_malloc()
    load_payload_plugins(settings.payload_plugins)
    app = make_app(ingest)
    metrics = ingest.metrics
    # The topic checks make librdkafka calls from this thread, and a stop raised inside one
    # (its log callbacks run there, outside the checks' own short tries) was dropped: the
    # worker then failed 10 s later as if Kafka were down (exit 2). Recorded here, it ends
    # the checks at their next try and is raised after them.
    with stops_between() as stop:
        partitions = prepare_topics(
            bootstrap, settings.topic, settings.dlq_topic, ingest.kafka_conf, stop.pending
        )
    metrics.topic_partitions.set(partitions)
    ingest.serve()  # /healthz answers while before_join waits for PostgreSQL
    if before_join is not None:
        # a stop meanwhile is recorded (run_stoppable) and the wait returns: raised after it
        with ingest.waiting_to_join():
            ingest.incarnation.start_from(run_stoppable(before_join(lambda: False)))

    async def probe() -> None:
        await probe_database(ingest.dsn, metrics, settings.db_check_interval_s, settings.worker_id)

    app.task(probe)
    watch = ingest.incarnation

    async def incarnation() -> None:  # another incarnation: stop as SIGTERM does
        await watch.run(on_other=lambda: os.kill(os.getpid(), signal.SIGTERM))

    app.task(incarnation)
    app.timer(LAG_INTERVAL_S)(_lag_reporter(app, metrics, watch.fresh_since))
    if until_drained:
        app.timer(DRAIN_CHECK_S)(_drain_watch(app, settings.topic, partitions, watch.fresh_since))
    worker = _Worker(app, quiet=True, loglevel=logging.getLogger().level or logging.INFO)
    worker.stop_bound_s = settings.shutdown_wait_s + STOP_EXTRA_S
    try:
        worker.execute_from_commandline()
    except Terminated:
        raise  # a stop before faust took the signal over: ackline.cli's clean stop
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    else:  # pragma: no cover - execute_from_commandline always raises SystemExit
        code = 0
    finally:
        worker.stopped()
        ingest.server.close()
    log.info("stopped after %d committed batches", app.parts.sink.committed_batches)
    if watch.refusal is not None:  # stopped on a recreated topic: as a start refuses
        raise AcklineError(watch.refusal)
    if app.refusal is not None:  # stopped in a group it cannot join
        raise AcklineError(app.refusal)
    return code


def _stop_overdue(bound_s: float) -> None:
    """The stop has not ended ``bound_s`` after the signal (faust's commit or LeaveGroup
    waiting for a broker gone, a close waiting for a database gone): exit 1 without the
    rest. Safe at any point: PostgreSQL decides what committed, Kafka's offsets are only
    advisory, and the group moves the partitions after the session timeout."""
    log.error(
        "the faust worker did not stop within %g s of the stop request "
        "(ACKLINE_SHUTDOWN_WAIT_S + 20 s): exiting 1 without leaving its group; what "
        "committed in PostgreSQL stands",
        bound_s,
    )
    exit_flushed(1)


def _drain_watch(
    app: FaustApp, topic: str, partitions: int, fresh_since: Callable[[float], bool]
) -> Any:
    """A timer that sends this process SIGTERM once it owns every partition, has read
    each to its end (the last stable offset) and has written everything it read, and
    the topic's incarnation was confirmed since (not drained into a recreated topic).

    "Written everything" is observed twice in a row, a check apart: the agent idle,
    no message unacked, and no record taken since the previous check.
    """
    last_seen: list[int] = [-1]
    drained_at: list[float | None] = [None]

    async def check() -> None:
        sink = app.parts.sink
        owned = sink.ledger.owned()
        consumer = app.consumer
        quiet = sink.idle and not consumer.unacked and len(owned) == partitions
        if not quiet:
            last_seen[0] = -1
            return
        tps = [TP(topic, p) for _, p in sorted(owned)]
        ends = await consumer.highwaters(*tps)
        for tp in tps:
            position = await consumer.position(tp)
            if position is None or position < ends.get(tp, 0):
                last_seen[0] = -1
                return
        taken = sink.records_taken
        if last_seen[0] != taken:
            drained_at[0] = None
        elif fresh_since(drained_at[0] if drained_at[0] is not None else time.monotonic()):
            log.info("drained: every partition read to its end and written")
            os.kill(os.getpid(), signal.SIGTERM)
        elif drained_at[0] is None:
            drained_at[0] = time.monotonic()
        last_seen[0] = taken

    return check


def _lag_reporter(app: FaustApp, metrics: Metrics, fresh_since: Callable[[float], bool]) -> Any:
    """A timer: ``ackline_partition_lag`` per partition of the ledger, the lag of
    :mod:`ackline.streams.lag` (:func:`~ackline.streams.lag.partition_lag`): the last
    stable offset (the consumer is read_committed, so ``highwaters`` asks ListOffsets for
    the LSO and a transaction open upstream is not lag) minus the DB next offset, or
    minus the consumer's position when no record handed to faust is past the DB next
    offset (:func:`fetched_uncommitted`): the transaction markers and aborted records
    below the position are not lag, and without this an idle, caught-up partition of a
    transactional topic showed lag 1 or more for ever, and ``/readyz`` 503;
    ``ackline_partitions_not_consumed`` = assigned partitions not consumed (fenced and not
    taken back, or blocked); a blocked partition whose log end reached its DB offset is
    sought there and consumed again once the topic's incarnation was confirmed since it
    got there (``fresh_since``: a topic made again grows past the old DB offsets too);
    fenced partitions due a retake are taken back; a
    rewind mark that retention passed makes the worker rejoin the group.

    A retake or a log-end read that fails (a claim refused, the broker away past its
    request timeout) is logged with its traceback and tried again at the next tick, the
    gauges refreshed whatever happened to the retake (``/readyz`` reads them): an
    exception out of a faust timer ends the worker, and in a broker outage every worker
    of the group at once. PostgreSQL away holds a retake until it is back (the control
    connection retries), and the gauges with it."""
    shown: set[tuple[str, int]] = set()
    release = ReleaseGate(fresh_since)

    retention = RetentionWatch()

    async def report() -> None:
        sink = app.parts.sink
        try:
            await sink.retake()
        except Exception:
            log.warning(
                "taking back fenced partitions failed; again in %g s", LAG_INTERVAL_S, exc_info=True
            )
        try:
            await retention.check(app, sink)
        except Exception:
            log.warning("the retention check failed; again in %g s", LAG_INTERVAL_S, exc_info=True)
        try:
            await gauges(sink)
        except Exception:
            log.warning("the lag check failed; again in %g s", LAG_INTERVAL_S, exc_info=True)

    async def gauges(sink: FaustSink) -> None:
        ledger = sink.ledger
        tracked = {tp: ledger.db_next(tp) for tp in ledger.tracked()}
        release.keep_only(ledger.blocked())
        for topic, partition in shown - set(tracked):
            metrics.lag.remove(topic, str(partition))
        shown.intersection_update(tracked)
        assigned = {(tp.topic, tp.partition) for tp in app.consumer.assignment()}
        metrics.assigned.set(len(ledger.owned()))  # a retake that failed may not have
        metrics.not_consumed.set(len(assigned - set(ledger.owned())))
        if not tracked:
            return
        # the ends after the positions: a record handed out in between is below its end
        # and at or past the position read, so counted
        marks = await cast(AcklineConsumer, app.consumer).lag_marks(sorted(tracked))
        ends = await app.consumer.highwaters(*(TP(t, p) for t, p in tracked))
        for (topic, partition), end in ((tp, ends.get(TP(*tp))) for tp in tracked):
            if end is None:
                continue
            # read again, after the marks: a claim may have run, a batch committed
            done = ledger.db_next((topic, partition))
            position, handed = marks.get((topic, partition), (None, None))
            if (
                (topic, partition) in ledger.blocked()
                and done is not None
                and end >= done
                and release.may_release((topic, partition))
            ):
                rewind = ledger.unblock((topic, partition))
                await sink.kafka.seek({rewind.tp: rewind.offset})
                position = None  # sought: the position read before is not the one now
                log.warning(
                    "%s[%d]: the log end reached the DB offset %d again", topic, partition, done
                )
            pending = fetched_uncommitted(handed, done)
            metrics.lag.labels(topic, str(partition)).set(
                partition_lag(end, done, position, pending)
            )
            shown.add((topic, partition))
        metrics.note_behind(time.time())

    return report


class RetentionWatch:
    """Rejoins the group for a rewind mark that retention passed. Such a mark never
    clears here: faust's queues keep what was fetched before the seek back, so nothing
    above the mark can be taken. The next assignment claims the partition from its DB
    offset, which aiokafka resets to the log start.

    A mark counts as passed once two ticks in a row saw the log start past it, the same
    mark under the same claim: records at or below it fetched after the seek may still
    be queued behind older ones (their admission clears the mark), and a rejoin then
    would drop them to be read again, and past the log start, never. One rejoin per mark
    (a rebalance costs the whole group: the leader's JoinGroup revokes every member)."""

    def __init__(self) -> None:
        self._seen: set[tuple[tuple[str, int], int, int]] = set()  # (tp, mark, generation)
        self._rejoined: set[tuple[tuple[str, int], int, int]] = set()

    async def check(self, app: FaustApp, sink: FaustSink) -> None:
        """Order of effects: read the marked partitions' log starts (bounded by one tick);
        read the marks again (a claim or the re-read may have moved them meanwhile); log
        the partitions whose mark is passed the second tick in a row; ask aiokafka to
        rejoin, and remember the marks only once it was asked. The revoke that follows
        releases every partition; the claim after it reads the DB offsets. Nothing is
        written or acked here, so a crash at any step leaves the DB offsets to decide."""
        ledger = sink.ledger
        marks = ledger.marks()
        if not marks:
            self._seen.clear()
            self._rejoined.clear()
            return
        async with asyncio.timeout(LAG_INTERVAL_S):
            starts = await app.consumer.earliest_offsets(*(TP(t, p) for t, p in marks))
        marks = ledger.marks()  # again: the await let a claim or the re-read move them
        passed = marks_past_retention(
            marks, {(tp.topic, tp.partition): o for tp, o in starts.items()}
        )
        now = {(tp, marks[tp], ledger.generation) for tp in passed}
        due = (now & self._seen) - self._rejoined
        self._seen = now
        if not due:
            return
        log.warning(
            "retention deleted the re-read of %s past its rewind mark (partition, mark, log "
            "start): nothing there can be taken again until a new claim; rejoining the group",
            sorted((tp[1], mark, passed[tp]) for tp, mark, _ in due),
        )
        await cast(AcklineConsumer, app.consumer).rejoin()
        self._rejoined |= due


def fetched_uncommitted(handed: int | None, db_next: int | None) -> bool:
    """Whether a record handed to faust (``handed``: the offset after the highest) is at
    or past the DB next offset: read and not committed in PostgreSQL yet (in faust's
    queue, in a batch, being written). Pure.

    Read ``handed`` with the position and ``db_next`` after both: a batch that committed
    in between moves ``db_next`` past records it wrote, never past one still in flight.
    A record refused after a seek back is read again from the DB offset, so it counts
    until PostgreSQL has it; counting it errs toward lag, never toward none.
    """
    return handed is not None and handed > (db_next or 0)
