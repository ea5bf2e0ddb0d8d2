"""Logging: plain text for people at a terminal, JSON lines for machines.

``log_format`` ``auto`` (the default) picks text when stderr is a terminal and JSON
otherwise (a container, a service manager, a file). A JSON line holds ``ts``,
``level``, ``logger``, ``msg`` and every ``extra=`` field of the call. One line per
committed batch goes to the ``ackline.batches`` logger at INFO: on in JSON mode, and
in text mode only with ``--verbose`` (a terminal is not a place for a line per batch).
Settings and client configurations are never logged: they hold secrets.

librdkafka's own log lines (``FAIL``, ``ERROR`` …: with a broker down, the same connect
failure about 20 times a second) go through :class:`KafkaLogBridge`, passed as
``logger`` to every confluent-kafka client ackline creates: each distinct line is
logged once (logger ``ackline.kafka``, librdkafka's level), its repeats are counted and
summed up in the next line of the same shape a window later. Without the bridge,
librdkafka writes them to stderr itself, past the log format, and they bury the one
line that matters.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal, NoReturn, TextIO

BATCH_LOGGER = "ackline.batches"
_batches = logging.getLogger(BATCH_LOGGER)  # its lines: ackline.streams.committed

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    vars(logging.LogRecord("n", logging.INFO, "p", 1, "m", None, None)).keys()
) | {"message", "asctime"}


def resolve_format(setting: str, stream: TextIO) -> Literal["json", "text"]:
    """``auto`` → text on a terminal, JSON otherwise; ``json``/``text`` as given."""
    if setting == "json":
        return "json"
    if setting == "text":
        return "text"
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``extra=`` fields are kept as top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in line:
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def configure_logging(log_format: str, verbose: bool = False, stream: TextIO | None = None) -> str:
    """Install the root handler for ``log_format``; return the format chosen."""
    out = stream if stream is not None else sys.stderr
    chosen = resolve_format(log_format, out)
    handler = logging.StreamHandler(out)
    if chosen == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    quiet = chosen == "text" and not verbose
    _batches.setLevel(logging.WARNING if quiet else logging.NOTSET)
    return chosen


KAFKA_LOGGER = "ackline.kafka"
# Numbers (ms, counts, offsets, thread ids, client numbers) vary between repeats of one
# message; a line's shape is its text without them.
_NUMBERS = re.compile(r"\d+")


class KafkaLogBridge:
    """A ``logger`` for confluent-kafka clients: librdkafka's lines through Python
    logging, repeats folded.

    confluent-kafka calls ``log(level, "%s [%s] %s", facility, client, message)`` (from
    the thread serving the client's queue: poll, flush, consume). A line whose shape
    (its text without numbers) was logged less than ``window_s`` ago is only counted;
    the first line of that shape after the window is logged with the count of those
    left out. At most ``max_shapes`` shapes are remembered (the oldest is forgotten
    first), so memory stays bounded whatever librdkafka says. Thread-safe.
    """

    def __init__(
        self,
        name: str = KAFKA_LOGGER,
        window_s: float = 60.0,
        max_shapes: int = 512,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logging.getLogger(name)
        self.window_s = window_s
        self._max = max_shapes
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, list[float]] = OrderedDict()  # shape -> [since, repeats]

    def log(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        try:
            text = msg % args if args else str(msg)
        except (TypeError, ValueError):
            text = " ".join([str(msg), *map(str, args)])
        shape = _NUMBERS.sub("#", text)
        now = self._clock()
        with self._lock:
            entry = self._seen.get(shape)
            if entry is not None and now - entry[0] < self.window_s:
                entry[1] += 1
                return
            left_out = 0 if entry is None else int(entry[1])
            self._seen[shape] = [now, 0]
            self._seen.move_to_end(shape)
            while len(self._seen) > self._max:
                self._seen.popitem(last=False)
        if left_out:
            text = f"{text} (and {left_out} more like it in the last {self.window_s:.0f} s)"
        self.logger.log(level, "librdkafka: %s", text)


_BRIDGE = KafkaLogBridge()


def kafka_logger() -> KafkaLogBridge:
    """The process's one bridge, to pass as ``"logger"`` in a confluent-kafka config."""
    return _BRIDGE


def exit_flushed(status: int) -> NoReturn:
    """Exit at once with ``status`` (``os._exit``: no ``finally``, no atexit, whatever
    thread calls it), after flushing the log handlers and stderr, so the line that said
    why is not lost with the process."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # exiting anyway
            handler.flush()
    sys.stderr.flush()
    os._exit(status)


FATAL_EXIT = 70
"""EX_SOFTWARE: the status of a crash-only exit (:func:`die`)."""

REFUSED_EXIT = 2
"""The status of a refusal: a bad setting, or a state no restart cures (the command
line's status for any AcklineError, and :func:`refuse`'s)."""


def refusal_line(line: str) -> str:
    """How a refusal is said on stderr, by the command line and :func:`refuse` alike."""
    return f"ackline: error: {line}"


def die(what: str, exc: BaseException) -> NoReturn:
    """Crash-only exit: log ``what`` and ``exc`` at CRITICAL, flush, ``os._exit`` with
    :data:`FATAL_EXIT`. Nothing is acked or committed after it: what was not committed to
    PostgreSQL is read again by the next owner."""
    logging.getLogger("ackline").critical(
        "%s: %r; exiting without acking (crash-only)", what, exc, exc_info=exc
    )
    exit_flushed(FATAL_EXIT)


def refuse(line: str) -> NoReturn:
    """Crash-only exit of a refusal that no restart cures (the schema is not what the
    migrations leave): its one line, as the command line prints it, and
    :data:`REFUSED_EXIT`, not :func:`die`'s traceback and 70, which a supervisor takes
    for a crash to restart. As with :func:`die`, nothing is acked or committed after it:
    what was not committed to PostgreSQL is read again by the next owner."""
    print(refusal_line(line), file=sys.stderr, flush=True)
    exit_flushed(REFUSED_EXIT)
