"""Where the services are: explicit settings first, else the local dev stack.

A command asks only for what it uses: :func:`database` (PostgreSQL only: migrate,
verify, conflicts, rejects, roles, tail, dispatch), :func:`kafka` (produce, capture,
replay) or :func:`endpoints` (both). A setting given wins; what is not given comes from
the running local stack of ``state_dir`` (`ackline dev up`), and a stack that is not
running is an error only when it is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ackline.clients import database_dsn
from ackline.settings import Settings

if TYPE_CHECKING:
    from ackline.dev.stack import StackInfo


@dataclass(frozen=True)
class Resolved:
    """An endpoint and where it came from: ``setting`` or ``dev stack (<state_dir>)``."""

    value: str | None
    source: str


def database(settings: Settings) -> str:
    """The operator's DSN (with the PostgreSQL TLS settings): ACKLINE_DATABASE_URL, else
    the local stack's."""
    if settings.database_url is not None:
        return database_dsn(settings.database_url.get_secret_value(), settings)
    return database_dsn(_stack(settings).database_url, settings)


def kafka(settings: Settings) -> str:
    """The bootstrap servers: ACKLINE_KAFKA_BOOTSTRAP, else the local stack's."""
    if settings.kafka_bootstrap:
        return settings.kafka_bootstrap
    return _stack(settings).kafka_bootstrap


def endpoints(settings: Settings) -> tuple[str, str]:
    """(bootstrap, dsn): from the settings when set, else the local stack.

    The DSN carries the PostgreSQL TLS settings (:func:`ackline.clients.database_dsn`).
    """
    return kafka(settings), database(settings)


def in_use(settings: Settings) -> tuple[Resolved, Resolved]:
    """(Kafka, PostgreSQL) as a command would use them now, for `ackline config show`:
    never raises; a local stack that is not running shows as such."""
    from ackline.dev.errors import DevStackError

    bootstrap = Resolved(settings.kafka_bootstrap, "setting") if settings.kafka_bootstrap else None
    url = settings.database_url
    dsn = Resolved(url.get_secret_value(), "setting") if url is not None else None
    if bootstrap is None or dsn is None:
        where = f"dev stack ({settings.state_dir})"
        try:
            info = _stack(settings)
        except DevStackError:
            down = Resolved(None, f"{where}: not running")
            return bootstrap or down, dsn or down
        bootstrap = bootstrap or Resolved(info.kafka_bootstrap, where)
        dsn = dsn or Resolved(info.database_url, where)
    return bootstrap, dsn


def _stack(settings: Settings) -> StackInfo:
    from ackline.dev import stack

    return stack.resolve(settings.state_dir)
