"""Where the services are: explicit settings first, else the local dev stack."""

from __future__ import annotations

from ackline.clients import database_dsn
from ackline.settings import Settings


def endpoints(settings: Settings) -> tuple[str, str]:
    """(bootstrap, dsn): from the settings when both are set, else the local stack.

    The DSN carries the PostgreSQL TLS settings (:func:`ackline.clients.database_dsn`).
    """
    if settings.kafka_bootstrap and settings.database_url:
        return settings.kafka_bootstrap, database_dsn(
            settings.database_url.get_secret_value(), settings
        )
    from ackline.dev import stack

    info = stack.resolve(settings.state_dir)
    bootstrap = settings.kafka_bootstrap or info.kafka_bootstrap
    dsn = settings.database_url.get_secret_value() if settings.database_url else info.database_url
    return bootstrap, database_dsn(dsn, settings)
