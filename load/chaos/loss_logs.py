"""What the workers logged while events were lost: the evidence a failed CI run keeps.

CI keeps a failed chaos run's output and nothing else: its stack, database and worker logs
are gone. The verdict names each run of lost winners and the batches just before and
after it on its partition (:mod:`ackline.load.losses`); that says *where* a batch
committed past records nobody wrote, not *why*. The why is in the workers' logs of that
moment: who claimed the partition at which DB offset and generation, which revoke, seek,
fence, cut-off or dropped record came first. :func:`context` picks those lines (pure):
from ``LEAD_S`` before the first commit of the batches around the run (the verdict's
:class:`~ackline.load.verify.LossWindow`) to ``TAIL_S`` after the last; every line at INFO
and above (librdkafka's only from WARNING: it repeats itself), and of the committed
batches only those on the run's partition; at most ``LIMIT`` lines, so a long window
cannot bury the rest of the output.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from ackline.core.logs import BATCH_LOGGER, KAFKA_LOGGER
from ackline.load.verify import LossWindow

LEAD_S = 60.0
"""Lines this long before the batch before the lost run count (its claim, a rebalance)."""
TAIL_S = 30.0
"""...and this long after the batch after it: a batch's time is its transaction's start,
and a held COMMIT (a fault, a revoke's wait) can end seconds later."""
LIMIT = 240
"""At most this many lines per lost run: the first third and the last two thirds (the
claim that started the batch after the run is near its end)."""
MESSAGE_CHARS = 400
"""A longer message is cut (faust logs whole assignment tables)."""


def context(logs: Iterable[tuple[str, Iterable[str]]], window: LossWindow) -> list[str]:
    """The lines of ``logs`` ((worker id, its JSON log lines)) that tell what happened
    around ``window``, in time order, each as ``HH:MM:SS.mmm worker LEVEL logger: msg``.
    Pure."""
    since = _bound(window.since, -LEAD_S)
    until = _bound(window.until, TAIL_S)
    picked: list[tuple[datetime, str]] = []
    for worker, lines in logs:
        for raw in lines:
            line = _parse(raw)
            if line is None:
                continue
            ts = line["ts"]
            if (since is not None and ts < since) or (until is not None and ts > until):
                continue
            text = _text(line, window.partition)
            if text is not None:
                picked.append((ts, f"{ts.strftime('%H:%M:%S.%f')[:-3]} {worker} {text}"))
    picked.sort(key=lambda p: p[0])
    shown = [text for _, text in picked]
    if len(shown) <= LIMIT:
        return shown
    head = LIMIT // 3
    tail = LIMIT - head
    return [
        *shown[:head],
        f"... {len(shown) - LIMIT:,} lines left out ...",
        *shown[-tail:],
    ]


def _bound(iso: str, shift_s: float) -> datetime | None:
    return None if not iso else datetime.fromisoformat(iso) + timedelta(seconds=shift_s)


def _parse(raw: str) -> dict[str, Any] | None:
    """One JSON log line with its ``ts`` parsed; None for anything else (a library's own
    stderr, a line cut by a SIGKILL)."""
    if not raw.startswith("{"):
        return None
    try:
        line = json.loads(raw)
        line["ts"] = datetime.fromisoformat(line["ts"])
    except (ValueError, KeyError, TypeError):
        return None
    return line if isinstance(line, dict) else None


def _text(line: dict[str, Any], partition: int) -> str | None:
    """How ``line`` is shown, or None when it does not bear on ``partition``'s loss."""
    level = str(line.get("level", "info")).upper()
    number = logging.getLevelName(level)
    severity = number if isinstance(number, int) else logging.INFO
    logger = str(line.get("logger", ""))
    if logger == BATCH_LOGGER:
        ranges = [r for r in line.get("ranges", ()) if r.get("partition") == partition]
        if not ranges:
            return None
        parts = ", ".join(
            f"[{r.get('first_offset')}, {r.get('next_offset')}) epoch {r.get('epoch')}"
            for r in ranges
        )
        return f"batch {line.get('batch_id')} committed on partition {partition}: {parts}"
    if severity < logging.INFO or (logger == KAFKA_LOGGER and severity < logging.WARNING):
        return None
    msg = str(line.get("msg", ""))
    if len(msg) > MESSAGE_CHARS:
        msg = msg[:MESSAGE_CHARS] + "..."
    return f"{level} {logger}: {msg}"
