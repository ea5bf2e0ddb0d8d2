"""The processor contract: what a user writes, and what ackline promises in return.

A *processor* is a named object with one coroutine, :meth:`Processor.apply`, that gets
a batch of ingested events in changefeed order and a connection inside an open
transaction. ackline commits the processor's effects and its cursor in that one
transaction (:mod:`ackline.sinks.feed.processors.runner`), so whatever dies at whatever
moment, an event's effects are committed exactly once — as long as the effects are
statements on that connection, and nothing else (an email, an HTTP call) that a rollback
cannot take back.

The rules for ``apply``:

* make every effect on ``conn`` and commit nothing (no ``conn.transaction()`` of your
  own that commits, no other connection): the runner commits;
* hold no state between calls that the database does not hold: the same events can be
  handed to another instance, or again to this one after a rollback;
* raise to refuse a batch: nothing of it commits, and the runner narrows the failure to
  the first event that raises, commits everything before it, and stops there with
  ``processors.error`` set (``ackline processors status``);
* keep it short: the transaction holds an xid, which holds back the horizon of every
  changefeed reader (not ingest) until it commits.

Optional members: ``filter`` (a :class:`~ackline.sinks.feed.types.Filter`; events it
drops are passed over and never delivered; instances share the cursor, so the newest
instance to start records its filter and an older one with another filter stops:
:func:`fingerprint`, :mod:`ackline.sinks.feed.processors.runner`),
``committed(batch, result)`` (called after COMMIT with what ``apply`` returned, for
in-memory statistics only), ``reset(conn)``
(deletes the processor's own state; ``ackline processors reset`` runs it as the operator,
in the transaction that rewinds the cursor) and ``setup_sql`` (idempotent DDL and grants
for the processor's tables; ``ackline processors setup`` runs it as the operator).
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

import asyncpg

from ackline.sinks.errors import FeedError
from ackline.sinks.feed.types import ALL, Cursor, FeedEvent, Filter

NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
"""A processor's name: its cursor in ``feed_cursors`` and its row in ``processors``."""


@dataclass(frozen=True, slots=True)
class ProcessorBatch:
    """What ``apply`` gets besides the connection: the events, and where they sit.

    ``events`` are in feed order and already filtered; ``start``/``end`` are the cursors
    before and after the batch (``end`` is what commits with the effects); ``instance``
    names the process applying it (``ACKLINE_WORKER_ID`` or ``--instance``).
    """

    processor: str
    instance: str
    start: Cursor
    end: Cursor
    events: tuple[FeedEvent, ...]


@runtime_checkable
class Processor(Protocol):
    """See the module docstring. ``name`` must match :data:`NAME`."""

    name: str

    async def apply(self, conn: asyncpg.Connection, batch: ProcessorBatch) -> Any: ...


def check(processor: object, where: str) -> Processor:
    """``processor`` if it keeps the contract's shape, else a FeedError saying what lacks."""
    if not isinstance(processor, Processor):
        raise FeedError(f"{where} is not a processor: it needs a name and an async apply()")
    if not inspect.iscoroutinefunction(processor.apply):
        raise FeedError(f"{where}: apply() must be a coroutine function (async def)")
    name = processor.name
    if not isinstance(name, str) or not NAME.match(name):
        raise FeedError(
            f"{where}: processor name {name!r} must be 1-100 characters of "
            "[A-Za-z0-9_.-], starting with a letter or digit"
        )
    feed_filter = getattr(processor, "filter", ALL)
    if not isinstance(feed_filter, Filter):
        raise FeedError(f"{where}: filter must be an ackline Filter, not {type(feed_filter)}")
    return processor


def filter_of(processor: Processor) -> Filter:
    found = getattr(processor, "filter", ALL)
    return found if isinstance(found, Filter) else ALL


def fingerprint(feed_filter: Filter) -> str:
    """The filter as ``processors.filter`` records it: canonical JSON with sorted keys and
    sorted values, ``null`` for "any" (``{"agents":null,"types":null}`` is every event).
    Pure; two filters get the same text exactly when they are equal (the order the
    types or agents were given in makes no difference).

    The text is compared with what other instances (other versions of ackline too)
    recorded, so its form never changes: a new form would make every instance of an
    unchanged processor look like a filter change.
    """
    return json.dumps(
        {
            "agents": None if feed_filter.agents is None else sorted(feed_filter.agents),
            "types": None if feed_filter.types is None else sorted(feed_filter.types),
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    )


class IdleTooLongError(FeedError):
    """A processor's own code held its batch's transaction idle past the connection's
    ``idle_in_transaction_session_timeout``, and the server ended the session: the batch's
    failure (the runner halves it), not the database going away."""


class AbortedByApplyError(FeedError):
    """A statement of a processor's ``apply`` failed and ``apply`` went on (it caught the
    error without a savepoint), so the batch's transaction was aborted when it returned:
    the batch's failure (the runner halves it), not one before any event."""


class TransactionEndedError(FeedError):
    """A processor's ``apply`` ended the batch's transaction itself (a COMMIT or ROLLBACK
    of its own). Not a :class:`ProcessorError`: a COMMIT moved the cursor with whatever
    was applied so far, so narrowing the batch down could pass events over; the processor
    stops at once instead."""


class ProcessorError(FeedError):
    """A processor's ``apply`` raised (anything but a transient database error).

    The batch rolled back; the runner narrows it down to the first event that raises.
    """

    def __init__(self, processor: str, cause: BaseException) -> None:
        text = " ".join(f"{type(cause).__name__}: {cause}".split())
        super().__init__(f"processor {processor!r} raised {text}")
        self.processor = processor
        self.cause = cause
        self.text = text
