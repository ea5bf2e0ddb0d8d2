"""Client settings derived from :class:`~ackline.settings.Settings`. Pure functions.

Every confluent-kafka client ackline makes (the consumer, the dead-letter producer,
the admin client, the producer SDK and the operator commands) gets
:func:`kafka_client_config`; every asyncpg connection gets the DSN of
:func:`database_dsn`. The dicts and DSNs returned here hold secrets: pass them to the
client, never to a log line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ackline.core.errors import SettingsError
from ackline.roles import INGEST, PROCESSOR, dsn_password, with_user
from ackline.settings import Settings

if TYPE_CHECKING:
    from ackline.sinks.connection import Bounds


def kafka_client_config(settings: Settings) -> dict[str, Any]:
    """librdkafka security properties for ``settings`` (only those that are set)."""
    conf: dict[str, Any] = {"security.protocol": settings.kafka_security_protocol}
    if settings.kafka_sasl_mechanism is not None:
        conf["sasl.mechanism"] = settings.kafka_sasl_mechanism
    if settings.kafka_sasl_username is not None:
        conf["sasl.username"] = settings.kafka_sasl_username
    if settings.kafka_sasl_password is not None:
        conf["sasl.password"] = settings.kafka_sasl_password.get_secret_value()
    paths = {
        "ssl.ca.location": settings.kafka_ssl_ca_location,
        "ssl.certificate.location": settings.kafka_ssl_certificate_location,
        "ssl.key.location": settings.kafka_ssl_key_location,
    }
    conf.update({key: str(path) for key, path in paths.items() if path is not None})
    if settings.kafka_ssl_key_password is not None:
        conf["ssl.key.password"] = settings.kafka_ssl_key_password.get_secret_value()
    return conf


def database_dsn(dsn: str, settings: Settings) -> str:
    """``dsn`` with the TLS settings as ``sslmode``/``sslrootcert`` query parameters.

    asyncpg reads both from the DSN. A setting replaces the same parameter already in
    the DSN; unset settings leave the DSN as it is.
    """
    extra: dict[str, str] = {}
    if settings.database_sslmode is not None:
        extra["sslmode"] = settings.database_sslmode
    if settings.database_sslrootcert is not None:
        extra["sslrootcert"] = str(settings.database_sslrootcert)
    if not extra:
        return dsn
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in extra]
    query.extend(extra.items())
    return urlunsplit(parts._replace(query=urlencode(query)))


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


def ingest_setting(settings: Settings) -> str:
    """The setting :func:`ingest_dsn`'s DSN came from, for an error to name."""
    if settings.database_ingest_url is None:
        return "ACKLINE_DATABASE_URL"
    return "ACKLINE_DATABASE_INGEST_URL"


def processor_setting(settings: Settings) -> str:
    """The setting :func:`processor_dsn`'s DSN came from, for an error to name."""
    if settings.database_processor_url is None:
        return "ACKLINE_DATABASE_URL"
    return "ACKLINE_DATABASE_PROCESSOR_URL"


def processor_dsn(settings: Settings, dsn: str) -> str:
    """The DSN `ackline process` connects with: the processor role, by the rule of
    :func:`ingest_dsn` (``database_processor_url``, else ``dsn`` as ``ackline_processor``
    with no password; a ``dsn`` with a password needs ``database_processor_url``)."""
    if settings.database_processor_url is not None:
        return database_dsn(settings.database_processor_url.get_secret_value(), settings)
    if dsn_password(dsn) is not None:
        raise SettingsError(
            "ACKLINE_DATABASE_PROCESSOR_URL",
            f"required when ACKLINE_DATABASE_URL carries a password: processors connect as "
            f"{PROCESSOR} (set its password with `ackline roles set-password {PROCESSOR}`)",
        )
    return with_user(dsn, PROCESSOR)


def feed_bounds(settings: Settings) -> Bounds:
    """The bounds of the changefeed's connections (``connector``: `tail`, `process`,
    `dispatch` and the processors' lag watch), from the worker's settings: the connect
    (ACKLINE_DB_CONNECT_TIMEOUT_S), the dead-link bounds (TCP user timeout and
    keepalives, sized by ACKLINE_DB_STATEMENT_TIMEOUT_S, which bounds none of their
    statements) and ACKLINE_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS."""
    from ackline.sinks.connection import Bounds  # asyncpg: only for the commands that connect

    return Bounds(
        connect_s=settings.db_connect_timeout_s,
        statement_s=settings.db_statement_timeout_s,
        idle_in_transaction_ms=settings.db_idle_in_transaction_timeout_ms,
    )
