"""Logging: plain text for people at a terminal, JSON lines for machines.

``log_format`` ``auto`` (the default) picks text when stderr is a terminal and JSON
otherwise (a container, a service manager, a file). A JSON line holds ``ts``,
``level``, ``logger``, ``msg`` and every ``extra=`` field of the call. One line per
committed batch goes to the ``ackline.batches`` logger at INFO: on in JSON mode, and
in text mode only with ``--verbose`` (a terminal is not a place for a line per batch).
Settings and client configurations are never logged: they hold secrets.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

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
