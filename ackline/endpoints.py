"""Where the services are: explicit settings first, else the local dev stack."""

from __future__ import annotations

from ackline.clients import database_dsn
from ackline.errors import SettingsError
from ackline.roles import INGEST, dsn_password, with_user
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


def ingest_dsn(settings: Settings, dsn: str) -> str:
    """The DSN `ackline run` connects with: the ingest role, never the migrating user.

    ``database_ingest_url`` when set (with the TLS settings); else ``dsn`` (the operator's,
    from :func:`endpoints`) with its user swapped for ``ackline_ingest`` and no password,
    which works where PostgreSQL trusts that role, as the local stack does. A ``dsn`` with
    a password and no ``database_ingest_url`` is a SettingsError: the worker must not
    borrow the migrating user's credentials, and has none of its own.
    """
    if settings.database_ingest_url is not None:
        return database_dsn(settings.database_ingest_url.get_secret_value(), settings)
    if dsn_password(dsn) is not None:
        raise SettingsError(
            "ACKLINE_DATABASE_INGEST_URL",
            f"required when ACKLINE_DATABASE_URL carries a password: the worker connects as "
            f"{INGEST} (set its password with `ackline roles set-password {INGEST}`)",
        )
    return with_user(dsn, INGEST)
