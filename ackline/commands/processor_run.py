"""The one wiring of a command that runs processors: `ackline process` and `ackline dispatch`.

Both follow the feed the same way (:func:`run_processors`): the stop signals bounded by
ACKLINE_SHUTDOWN_WAIT_S, the runners and their lag watch (which heartbeats
``processors.last_seen_at``: `ackline processors status` shows the instance running),
one progress line per processor every ACKLINE_PROGRESS_LOG_S, and the exit status. What
each says is its own: its start line and its summary line. `dispatch` ran its runner
alone, so it logged nothing while it followed the feed and was never seen running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from ackline.core.signals import bounded_stop, stopped_status, work_done
from ackline.settings import Settings

if TYPE_CHECKING:
    import asyncpg

    from ackline.sinks.feed.processors.runner import ProcessorRunner, Report

Connect = Callable[[], Awaitable["asyncpg.Connection"]]


def _nothing() -> None:
    """No step of its own after the runners."""


async def run_processors(
    runners: Sequence[ProcessorRunner],
    connect: Connect,
    settings: Settings,
    *,
    wait: bool,
    started: Callable[[], None],
    summary: Callable[[list[Report], int | None], None],
    each: Callable[[Connect], Connect] | None = None,
    watch_connect: Connect | None = None,
    ended: Callable[[], None] = _nothing,
) -> int:
    """Run ``runners`` (sharing one ProcessorMetrics) until they end (``wait`` False:
    caught up, paused or failed) or a stop signal, and return the exit status: 1 when a
    processor failed or was superseded, 128 + the signal when a stop cut a run that would
    have ended by itself, else 0.

    Order: the signals are handled, then ``started`` (the start line: from here a stop
    prints the summary); the progress lines begin; the runners and the lag watch run
    (:func:`run_all`: each batch commits its effects and cursor together, so a crash
    anywhere leaves what committed and nothing else); the progress lines stop (none after
    the runners, nor after the summary); ``ended`` (a step of the caller's, such as
    closing its HTTP server); ``summary`` with the reports and the signal that cut them
    (None if none did), still under the handlers, so a later stop does not cut the line;
    the status is recorded as the work done (a stop from then on changes nothing)."""
    from ackline.runtime.progress_line import ProcessorsProgress, ProgressLog
    from ackline.sinks.feed.processors.runner import Outcome, run_all

    names = [r.name for r in runners]
    registry = runners[0].metrics.registry
    progress = ProgressLog(ProcessorsProgress(registry, names), settings.progress_log_s)
    try:
        with bounded_stop(asyncio.Event(), settings.shutdown_wait_s) as stopping:
            started()
            progress.start()
            reports = await run_all(
                runners,
                connect,
                stopping,
                wait=wait,
                watch_interval=min(5.0, settings.db_check_interval_s),
                watch_connect=watch_connect,
                each=each,
            )
            progress.stop()
            ended()
            cut = (Outcome.STOPPED, Outcome.CANCELLED)
            by = stopping.signal if any(r.outcome in cut for r in reports) else None
            summary(reports, by)
            if any(r.outcome in (Outcome.FAILED, Outcome.SUPERSEDED) for r in reports):
                return work_done(1)
            return work_done(stopped_status(by) if not wait and by is not None else 0)
    finally:
        progress.stop()
