"""The one frozen settings model.

Precedence, highest first: explicit overrides passed by the CLI (``--topic``,
``--group-id``, ``--log-format``), ``ACKLINE_*`` environment variables, the TOML file
named by ``--config`` or ``ACKLINE_CONFIG_FILE`` (flat ``name = value`` keys, the
field names below), defaults. A setting that fails validation stops the program at
start with a :class:`~ackline.core.errors.SettingsError` that names it, and so does an
``ACKLINE_*`` variable that names no setting (a typo must not be silently ignored).
Secrets are :class:`~pydantic.SecretStr` and never logged; :meth:`Settings.redacted`
is the only printable view.

Why this module is longer than the house's ~500 lines: every setting is one field with
its bounds and a description (docs/operating.md's table is generated from them), and the
model must stay one class; the loading rules around it are short.
"""

from __future__ import annotations

import difflib
import os
import socket
import tomllib
import typing
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import timedelta
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ackline.core.errors import SettingsError
from ackline.core.faults import Faults
from ackline.core.faults import parse as parse_faults
from ackline.sinks.admin.durations import format_duration, parse_duration, retention_period
from ackline.sinks.errors import RETRY_MAX_BACKOFF_S

ENV_PREFIX = "ACKLINE_"
CONFIG_FILE_VAR = ENV_PREFIX + "CONFIG_FILE"
REDACTED = "**********"
DEFAULT_METRICS_PORT = 9400
Source = Literal["cli", "env", "file", "default"]

# The TOML file of the settings being built now (set only inside load_settings).
_TOML_FILE: ContextVar[Path | None] = ContextVar("_TOML_FILE", default=None)


class _CrossFieldError(ValueError):
    """A check across settings failed; ``setting`` is the one to fix."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(problem)
        self.setting = setting


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


PARTITIONS_AHEAD_MAX: Final = 52
"""ACKLINE_PARTITIONS_AHEAD's bound, which `partitions ensure --ahead` keeps too."""


class Settings(BaseSettings):
    """Every knob of ackline, read once at start and never mutated."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        frozen=True,
        extra="forbid",
        case_sensitive=False,
        allow_inf_nan=False,  # no bound or interval of ours means anything at inf or nan
    )

    # Where the services are. Unset: the local stack started by `ackline dev up`.
    kafka_bootstrap: str | None = Field(
        default=None,
        description="Kafka bootstrap servers (host:port,...). Unset: the local stack's broker",
    )
    database_url: SecretStr | None = Field(
        default=None,
        description="PostgreSQL DSN of the operator (migrate, status, verify, ...). "
        "Unset: the local stack's",
    )
    # What `ackline run` connects as (least privilege, docs/roles.md).
    database_ingest_url: SecretStr | None = Field(
        default=None,
        description="PostgreSQL DSN the worker connects as. Unset: the operator's DSN with its "
        "user swapped for ackline_ingest, which works where PostgreSQL trusts that role (the "
        "local stack); required when the operator's DSN carries a password",
    )
    # What `ackline process` connects as (docs/processors.md, "Privileges").
    database_processor_url: SecretStr | None = Field(
        default=None,
        description="PostgreSQL DSN stream processors (`ackline process`) connect as. Unset: "
        "the operator's DSN with its user swapped for ackline_processor, which works where "
        "PostgreSQL trusts that role (the local stack); required when the operator's DSN "
        "carries a password",
    )
    state_dir: Path = Field(
        default=Path(".ackline"),
        description="the local stack's state (and the faust runtime's data directory)",
    )

    # What to consume and where poison goes.
    topic: str = Field(default="agent-activity", description="the topic to ingest")
    group_id: str = Field(
        default="ackline",
        description="the consumer group; its offsets and epochs live in consumer_offsets",
    )
    dlq_topic: str = Field(
        default="agent-activity.dlq",
        description="the dead-letter topic for poison records; must not be the topic ingested",
    )
    worker_id: str = Field(
        default_factory=_default_worker_id,
        min_length=1,
        description="this worker's name: the owner of its partitions, its Kafka client.id and "
        "its PostgreSQL application_name; unique in its group (a worker given a name a live "
        "member has is refused; the default taken is warned about)",
    )
    group_protocol: Literal["classic", "consumer"] = Field(
        default="classic",
        description="Kafka group protocol: classic (cooperative-sticky) or consumer (KIP-848; "
        "default runtime only)",
    )
    session_timeout_ms: int = Field(
        default=10_000,
        ge=1_000,
        le=300_000,
        description=(
            "Kafka session timeout (classic protocol); the broker refuses one outside its "
            "group.min.session.timeout.ms..group.max.session.timeout.ms (6000..1800000 by "
            "default), and a worker it refuses exits 2 naming this setting after twice the "
            "timeout, at least 30 s"
        ),
    )
    max_poll_interval_ms: int = Field(
        default=300_000,
        ge=1_000,
        le=3_600_000,
        description="Kafka max.poll.interval.ms: a worker silent this long loses its partitions",
    )
    start_from: Literal["earliest", "latest"] = Field(
        default="earliest",
        description="where a group that never committed anything starts: the log start, or "
        "for latest its last stable offset, stored by the first claim (decided once; a "
        "partition whose end does not answer in 5 s starts at the log start, with a WARNING)",
    )
    # The consumer runtime of `ackline run` (`--runtime` wins); docs/faust.md.
    runtime: Literal["confluent", "faust"] = Field(
        default="confluent",
        description="consumer runtime of `ackline run` (`--runtime` wins); faust needs the "
        "[faust] extra",
    )
    faust_accept_risk: str = Field(
        default="",
        description="named risks of the faust runtime the operator accepts (comma list; "
        "untested-faust-version)",
    )
    faust_recovery_wait_s: float = Field(
        default=90.0,
        ge=10.0,
        le=3_600.0,
        description="faust runtime: how long faust's recovery waits for an assignment's "
        "claim and seek (its broker_request_timeout, at least session_timeout_ms + 30 s); "
        "a claim and seek past 8/9 of it exits the worker (crash-only) rather than stall",
    )

    # Batching and backpressure.
    batch_max_events: int = Field(
        # 2,000: 5,000 drained a 1M backlog ~8 % faster (PostgreSQL 12.5-13.0 against
        # 13.8-16.5 us per event), but in one whole run of each its p50 / p99 at half load
        # were 54 / 174 ms against 40 / 104, and its replay 67,066 against 70,457 events/s
        # (docs/performance.md, "... batches of 5,000 measured again")
        default=2_000,
        ge=1,
        le=100_000,
        description="a batch is written at this many records",
    )
    batch_max_ms: int = Field(
        default=200,
        ge=1,
        le=60_000,
        description="faust runtime: a take is written when its first record has waited this "
        "long (or at batch_max_events); the default runtime uses batch_linger_ms",
    )
    batch_linger_ms: int = Field(
        default=0,
        ge=0,
        le=60_000,
        description="default runtime: how long a batch may wait for more records while the "
        "writer is free; 0 writes it as soon as the writer is free (group commit: batches "
        "grow only while a write is in flight)",
    )
    writer_connections: int = Field(
        # 2: the median of three paired 1M-event drains went from 33,840 to 39,272 events/s
        # (docs/performance.md, "Two writer connections")
        default=2,
        ge=1,
        le=8,
        description="default runtime: PostgreSQL connections a worker writes batches over, "
        "each for its own share of the worker's partitions (so one batch's COPY overlaps "
        "the next one's first statements); each holds its own buffer and batch in flight",
    )
    batch_max_bytes: int = Field(
        # 8 MiB: a 2,000-event batch of ~1 KB events is 2 MB, so only large records feel
        # it; a flood of 1 MiB records peaked at 300 MB of RSS with it, ~500 MB at 32 MiB
        default=8 * 1_048_576,
        ge=1_048_576,
        le=512 * 1_048_576,
        description="a batch is written at this many bytes of record keys, values and "
        "headers; twice this is buffered ahead per writer connection at most (a worker's "
        "memory, a transaction's size)",
    )
    max_message_bytes: int = Field(
        default=1_048_576,
        ge=256,
        le=64 * 1_048_576,
        description="larger records are rejected as too_large before parsing",
    )
    max_json_depth: int = Field(
        default=32,
        ge=2,
        le=255,  # schemas.decode.MAX_SUPPORTED_DEPTH: pydantic-core serialises 257 levels
        description="deeper JSON is rejected as too_deep",
    )

    # Schema evolution (docs/schema.md, "Evolving the schema").
    payload_plugins: str = Field(
        default="",
        description="extra payload versions to load at start (module:attribute,...)",
    )
    newer_version_wait_s: float = Field(
        default=0.0,
        ge=0,
        le=86_400,
        description="how long to hold a partition at a payload version newer than this worker "
        "knows before rejecting it (0: reject at once)",
    )

    # Time partitions and retention of activity (docs/retention.md).
    partition_interval: Literal["day", "week"] = Field(
        default="day",
        description="span of each activity partition the workers make ahead: a UTC day or an "
        "ISO week (a change applies to partitions made after it)",
    )
    partitions_ahead: int = Field(
        default=2,
        ge=1,
        le=PARTITIONS_AHEAD_MAX,
        description="how many intervals after today the workers keep partitions made for",
    )
    retention: str = Field(
        default="",
        description="drop activity partitions ingested longer ago than this, with its unit "
        "(90d, 12w; a bare number is refused); "
        "workers apply it hourly, never below the operator's `ackline retention apply` "
        "policy, and not at all without one. Empty: keep everything",
    )

    # Operations.
    metrics_port: int = Field(
        default=DEFAULT_METRICS_PORT,
        ge=0,
        le=65_535,
        description="port of /metrics, /healthz and /readyz of `ackline run` and "
        "`ackline process` (0: off); the default port taken by another process falls back "
        "to a free one (the start-up line says which), a port set explicitly that cannot be "
        "bound stops the worker",
    )
    retry_max_seconds: float = Field(
        default=30.0,
        gt=0,
        description="how long PostgreSQL may stay unreachable before it is an error: `tail` "
        "without --follow, `dispatch --once` and `process --until-caught-up` give up with one "
        "line, followers log one ERROR and keep retrying",
    )
    revoke_wait_s: float = Field(
        default=20.0,
        gt=0,
        description="how long a revoke waits for the batches in flight before cancelling them",
    )
    shutdown_wait_s: float = Field(
        default=30.0,
        gt=0,
        description="how long SIGTERM waits for the batches in flight (or a changefeed "
        "read) before cancelling them; a second SIGINT (Ctrl-C twice) to `tail`, "
        "`dispatch` or `process` cancels its read or batch at once",
    )
    db_idle_in_transaction_timeout_ms: int = Field(
        default=15_000,
        ge=100,
        le=2_147_483_647,  # PostgreSQL's largest
        description="idle_in_transaction_session_timeout of the worker's connections, and "
        "of the changefeed's (`tail`, `process`, `dispatch`)",
    )
    db_connect_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description=(
            "bound on connecting to PostgreSQL, for the worker, every operator command and "
            "the changefeed's connections (TCP, TLS, start-up and, for the worker, the answer "
            "to the connection's first read)"
        ),
    )
    db_statement_timeout_s: float = Field(
        default=30.0,
        ge=1,
        le=3_600,
        description="bound on every statement of the worker; past it the connection is "
        "dropped and the work retried on a new one. Also the TCP user timeout of its "
        "connections (keepalives find an idle dead one in about 2/3 of it), and of the "
        "changefeed's (`tail`, `process`, `dispatch`), whose statements it does not bound",
    )
    db_commit_timeout_s: float = Field(
        default=30.0,
        ge=1,
        le=3_600,
        description="bound on a batch's COMMIT; past it the outcome is unknown and is "
        "reconciled by reading",
    )
    db_down_error_after_s: float = Field(
        default=60.0,
        gt=0,
        le=86_400,
        description="PostgreSQL failing for the worker longer than this is logged as ERROR "
        "and fails /readyz (WARNING before)",
    )
    db_leave_after_s: float = Field(
        default=90.0,
        ge=0,
        le=86_400,
        description="a worker (the default runtime) that cannot connect to PostgreSQL for "
        "its pending writes or claims for longer than this leaves the consumer group, so "
        "that workers that can write take its partitions, and joins again once all its "
        "connections answer (0: never). A connection the server refuses (too many "
        "clients, starting up, in recovery) counts, and so does one that opens but whose "
        "first read gets no answer (a pooler or a link that logs the worker in and "
        "carries nothing after); a statement that fails on an open connection (a lock "
        "wait, a full disk) does not",
    )
    faults: str = Field(
        default="",
        description="fault points to arm, for tests and chaos (point=action[@n],...)",
    )
    fault_stall_seconds: float = Field(
        default=3600.0, gt=0, description="how long a `stall` fault stops"
    )
    fault_release_file: Path | None = Field(
        default=None,
        description="a `stall` fault ends early once this file exists, and removes it "
        "(tests: end a stall when what it waits for has happened)",
    )

    config_file: Path | None = Field(
        default=None,
        description="the TOML file these settings were read from (--config wins)",
    )

    # Kafka security, passed to every client by ackline.clients.kafka_client_config.
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="Kafka security.protocol"
    )
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        default=None, description="required with SASL_*"
    )
    kafka_sasl_username: str | None = Field(default=None, description="required with SASL_*")
    kafka_sasl_password: SecretStr | None = Field(default=None, description="required with SASL_*")
    kafka_ssl_ca_location: Path | None = Field(
        default=None, description="CA file for SSL and SASL_SSL"
    )
    kafka_ssl_certificate_location: Path | None = Field(
        default=None, description="client certificate (with its key)"
    )
    kafka_ssl_key_location: Path | None = Field(
        default=None, description="client key (with its certificate)"
    )
    kafka_ssl_key_password: SecretStr | None = Field(
        default=None, description="password of the client key"
    )

    # PostgreSQL TLS, added to the DSN as sslmode/sslrootcert (None: as the DSN says).
    database_sslmode: Literal["disable", "prefer", "require", "verify-ca", "verify-full"] | None = (
        Field(default=None, description="added to the DSN as sslmode (unset: as the DSN says)")
    )
    database_sslrootcert: Path | None = Field(
        default=None,
        description="added to the DSN as sslrootcert; needs require, verify-ca or verify-full",
    )

    # HTTP endpoint (/metrics, /healthz, /readyz), readiness and logs.
    metrics_host: str = Field(default="127.0.0.1", description="address of the HTTP endpoint")
    ready_max_commit_age_s: float = Field(
        default=60.0,
        gt=0,
        description="/readyz fails when the worker is behind and has not committed for this long",
    )
    db_check_interval_s: float = Field(
        default=5.0,
        ge=0.1,  # a check every nanosecond took a core
        le=3_600,
        description="PostgreSQL health check interval; /readyz needs one within 3 intervals",
    )
    progress_log_s: float = Field(
        default=60.0,
        ge=0,
        le=86_400,
        description="how often a running worker logs one INFO line of what it committed "
        "since the last one (rows, batches, rate, duplicates, conflicts, rejects, dead "
        "letters, fenced batches) and its lag, and `process` one per processor (events "
        "applied, lag); an idle one says so once, one behind every time; 0: never, else "
        "at least 1",
    )
    log_format: Literal["auto", "json", "text"] = Field(
        default="auto",
        description="auto: text on a terminal, JSON lines otherwise (`--log-format` wins)",
    )

    _sources: dict[str, Source] = PrivateAttr(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """CLI overrides (init kwargs) > environment > TOML file > defaults."""
        toml_file = _TOML_FILE.get()
        if toml_file is None:
            return (init_settings, env_settings)
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file))

    @field_validator(
        "kafka_ssl_ca_location",
        "kafka_ssl_certificate_location",
        "kafka_ssl_key_location",
        "database_sslrootcert",
    )
    @classmethod
    def _exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.exists():
            raise ValueError(f"no such file: {value}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        for setting, problem in _cross_field_problems(self):
            raise _CrossFieldError(setting, problem)
        return self

    @field_validator("topic", "group_id", "dlq_topic")
    @classmethod
    def _kafka_name(cls, value: str) -> str:
        allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
        if not value or len(value) > 249 or not set(value) <= allowed:
            raise ValueError("must be 1-249 characters of [a-zA-Z0-9._-]")
        if value in (".", ".."):
            raise ValueError("must not be '.' or '..' (Kafka refuses those names)")
        return value

    @field_validator("progress_log_s")
    @classmethod
    def _progress_log(cls, value: float) -> float:
        if 0 < value < 1:  # a tally of the registry, and a line, every microsecond: a core
            raise ValueError("0 (never) or at least 1 s")
        return value

    @field_validator("kafka_bootstrap")
    @classmethod
    def _bootstrap(cls, value: str | None) -> str | None:
        problem = None if value is None else bootstrap_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("retention")
    @classmethod
    def _retention(cls, value: str) -> str:
        if not value.strip():
            return ""
        # a unit required, as `retention apply --older-than` requires one: "12" meant as
        # weeks would keep 12 days
        try:
            return format_duration(retention_period(value, unit_required=True))
        except ValueError as exc:  # an upgrade: the bare number used to be days
            if value.strip().isdigit():
                raise ValueError(
                    f"{exc} (a bare number was taken for days before: {value.strip()}d keeps "
                    "that meaning)"
                ) from exc
            raise

    def retention_keep(self) -> timedelta | None:
        """The retention period, or None when retention is off."""
        return parse_duration(self.retention) if self.retention else None

    def fault_points(self) -> Faults:
        """The fault points these settings arm (ACKLINE_FAULTS; none in production)."""
        return Faults(self.faults, self.fault_stall_seconds, self.fault_release_file)

    @field_validator("faults")
    @classmethod
    def _faults(cls, value: str) -> str:
        parse_faults(value)  # at load, for every command, not only where faults are armed
        return value

    @field_validator("database_url", "database_ingest_url", "database_processor_url")
    @classmethod
    def _dsn(cls, value: SecretStr | None) -> SecretStr | None:
        problem = None if value is None else dsn_problem(value.get_secret_value())
        if problem is not None:
            raise ValueError(problem)
        return value

    def redacted(self) -> dict[str, Any]:
        """The effective settings, secrets redacted: a DSN keeps everything but its
        password (where it points is what an operator checks); other secrets are
        '**********'."""
        out: dict[str, Any] = {}
        for name, value in self.model_dump().items():
            if isinstance(value, SecretStr):
                secret = value.get_secret_value()
                out[name] = redact_dsn(secret) if name in _DSN_FIELDS else REDACTED
            else:
                out[name] = value
        return out

    def sources(self) -> dict[str, Source]:
        """Where each setting came from (cli, env, file, default), as load_settings saw it."""
        return {name: self._sources.get(name, "default") for name in type(self).model_fields}


_DSN_FIELDS = frozenset({"database_url", "database_ingest_url"})


def _port_ok(port: str) -> bool:
    """A TCP port as both clients take it: decimal digits, 1 to 65535."""
    return port.isdecimal() and 1 <= int(port) <= 65_535


def bootstrap_problem(servers: str) -> str | None:
    """What is wrong with a ``host:port,...`` list (pure), or None. librdkafka took a bad
    one and failed 10 s later with a "Broker transport failure" naming nothing."""
    for item in (i.strip() for i in servers.split(",")):
        spec = item.rpartition("://")[2]  # a listener name may lead (PLAINTEXT://)
        if not spec:
            return "must be host[:port][,host[:port]...] with no empty entry"
        if spec.startswith("["):  # [v6] or [v6]:port
            rest = spec.partition("]")[2]
            if not rest:
                continue
            if not rest.startswith(":"):
                return f"{item!r} has something after ']' that is not :port"
            spec = "v6" + rest
        elif spec.count(":") > 1:
            continue  # a bare IPv6 address: librdkafka's own default port
        host, colon, port = spec.rpartition(":")
        if colon and not host:
            return f"{item!r} has no host"
        if colon and not _port_ok(port):
            return f"{item!r} has a port that is not a number from 1 to 65535"
    return None


SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
TARGET_SESSION_ATTRS = ("any", "primary", "standby", "read-write", "read-only", "prefer-standby")
# libpq's connection parameters that asyncpg does not read: it sends every query parameter
# it does not know to the server as a setting, which refuses these (a traceback, exit 1)
_LIBPQ_ONLY = {
    "connect_timeout": "set ACKLINE_DB_CONNECT_TIMEOUT_S instead",
    "keepalives": "",
    "keepalives_idle": "",
    "keepalives_interval": "",
    "keepalives_count": "",
    "tcp_user_timeout": "",
    "hostaddr": "give the address as the host",
    "gssencmode": "",
    "channel_binding": "",
    "requirepeer": "",
    "sslcompression": "",
    "sslsni": "",
    "sslcertmode": "",
    "load_balance_hosts": "",
    "replication": "",
}
_ENCODE = "; percent-encode / ? # @ : in a user or password (%2F %3F %23 %40 %3A)"


def dsn_problem(dsn: str) -> str | None:
    """What the driver would fail on in ``dsn``, read as asyncpg reads it (pure), or None.

    A malformed URL failed in every command with a traceback that could show part of
    the password; the problem is told here without a byte of the URL."""
    if not dsn.startswith(("postgres://", "postgresql://")):
        return "must be a postgresql:// URL"
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "is not a URL (a '[' without its ']')" + _ENCODE
    if "#" in dsn:
        return "holds a '#'" + _ENCODE
    if parts.netloc.count("@") > 1:
        return "holds more than one '@' before the host" + _ENCODE
    specs = parts.netloc.rpartition("@")[2].split(",")
    if len(specs) > 1 and not all(specs):
        return "has an empty host in its list of hosts"
    for spec in specs:
        if spec.startswith("["):
            _, _, port = spec.partition("]")
            if port and not port.startswith(":"):
                return "has something after an IPv6 host's ']' that is not ':port'" + _ENCODE
            port = port[1:]
        else:
            port = spec.partition(":")[2]
        if port and not _port_ok(port):
            return "has a port that is not a number from 1 to 65535" + _ENCODE
    try:
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        return "has a query that is not name=value pairs joined by '&'" + _ENCODE
    return _query_problem(query)


def _query_problem(query: list[tuple[str, str]]) -> str | None:
    """What the driver, or PostgreSQL at connect, would refuse in a DSN's query. Pure."""
    for name, given in query:
        if name == "sslmode" and given and given not in SSL_MODES:
            return f"has sslmode={given!r}: it must be one of {', '.join(SSL_MODES)}"
        if name == "target_session_attrs" and given not in TARGET_SESSION_ATTRS:
            return (
                f"has target_session_attrs={given!r}: it must be one of "
                f"{', '.join(TARGET_SESSION_ATTRS)}"
            )
        if name in _LIBPQ_ONLY:
            fix = _LIBPQ_ONLY[name] or "remove it"
            return (
                f"has {name}, a libpq parameter the driver (asyncpg) does not read: it would "
                f"be sent to PostgreSQL as a setting, which refuses it; {fix}"
            )
    return None


def redact_dsn(dsn: str) -> str:
    """``dsn`` with its password (in the authority or as ``?password=``) replaced by
    '**********'; user, hosts, database and options kept. Pure."""
    parts = urlsplit(dsn)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":" + REDACTED
    query = [
        (k, REDACTED if k == "password" else v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    ]
    netloc = f"{userinfo}@{hosts}" if at else hosts
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, safe="*")))


def dsn_hint(setting: str = "ACKLINE_DATABASE_URL") -> str:
    """What to check when PostgreSQL does not answer at the URL of ``setting``. Pure."""
    return (
        f"is PostgreSQL running there? check {setting} (or start the local stack: `ackline dev up`)"
    )


def dsn_address(dsn: str) -> str:
    """Where a ``postgresql://`` URL points, for messages: ``host:port/database`` (no
    user, no password). Pure."""
    parts = urlsplit(dsn)
    hosts = parts.netloc.rpartition("@")[2]
    if not hosts:
        hosts = dict(parse_qsl(parts.query)).get("host", "localhost")
    database = parts.path.lstrip("/")
    return f"{hosts}/{database}" if database else hosts


def _topic_problems(s: Settings) -> list[tuple[str, str]]:
    """The dead-letter topic among the topics read: the worker reads one topic (a name,
    never a pattern), and dead letters written into it would be read back, rejected and
    written again, forever."""
    if s.dlq_topic != s.topic:
        return []
    return [
        (
            "DLQ_TOPIC",
            f"must not be ACKLINE_TOPIC ({s.topic}): a poison record would be read back "
            "from its own dead letter and rejected again, forever",
        )
    ]


def _tls_problems(s: Settings, tls: bool) -> list[tuple[str, str]]:
    """TLS files without TLS, and a certificate without its key or a key without its
    certificate."""
    problems: list[tuple[str, str]] = []
    if not tls:
        for name in (
            "kafka_ssl_ca_location",
            "kafka_ssl_certificate_location",
            "kafka_ssl_key_location",
            "kafka_ssl_key_password",
        ):
            if getattr(s, name) is not None:
                problems.append(
                    (name.upper(), "needs ACKLINE_KAFKA_SECURITY_PROTOCOL SSL or SASL_SSL")
                )
    cert, key = s.kafka_ssl_certificate_location, s.kafka_ssl_key_location
    if cert is not None and key is None:
        problems.append(
            ("KAFKA_SSL_KEY_LOCATION", "required with ACKLINE_KAFKA_SSL_CERTIFICATE_LOCATION")
        )
    if key is not None and cert is None:
        problems.append(
            ("KAFKA_SSL_CERTIFICATE_LOCATION", "required with ACKLINE_KAFKA_SSL_KEY_LOCATION")
        )
    return problems


def assign_claim_hold_s(s: Settings) -> float | None:
    """How long the default runtime's assign callback may hold a rebalance with its claim
    while PostgreSQL does not answer (docs/faults.md); None when nothing bounds it by
    leaving (ACKLINE_DB_LEAVE_AFTER_S 0) or the runtime claims outside the callback
    (faust). Pure."""
    if s.runtime != "confluent" or s.db_leave_after_s <= 0:
        return None
    return (
        s.db_leave_after_s + s.db_statement_timeout_s + s.db_connect_timeout_s + RETRY_MAX_BACKOFF_S
    )


def poll_interval_advice(s: Settings) -> str | None:
    """A warning for `ackline run` when ACKLINE_MAX_POLL_INTERVAL_MS (the group's rebalance
    timeout) is not longer than :func:`assign_claim_hold_s`, else None. Pure.

    A warning, not a refusal: past the rebalance timeout the broker goes on without the
    worker, whose late claim then fences the new owners until they take their partitions
    back (a stall, never a loss); tests shorten the interval on purpose."""
    hold = assign_claim_hold_s(s)
    if hold is None or s.max_poll_interval_ms / 1000 > hold:
        return None
    return (
        f"ACKLINE_MAX_POLL_INTERVAL_MS ({s.max_poll_interval_ms / 1000:g} s) is not longer "
        f"than an assign callback's claim may hold a rebalance while PostgreSQL does not "
        f"answer, {hold:.0f} s (ACKLINE_DB_LEAVE_AFTER_S + ACKLINE_DB_STATEMENT_TIMEOUT_S + "
        f"ACKLINE_DB_CONNECT_TIMEOUT_S + {RETRY_MAX_BACKOFF_S:g} s of retry backoff): then "
        f"the broker goes on without this worker and its late claim fences the new owners "
        f"for a while; raise it, or lower ACKLINE_DB_LEAVE_AFTER_S"
    )


def _cross_field_problems(s: Settings) -> list[tuple[str, str]]:
    """Settings that are valid alone but not together: (setting, problem), first to fix first."""
    sasl = s.kafka_security_protocol.startswith("SASL_")
    tls = s.kafka_security_protocol in ("SSL", "SASL_SSL")
    problems = _topic_problems(s)
    if sasl and s.kafka_sasl_mechanism is None:
        problems.append(("KAFKA_SASL_MECHANISM", f"required with {s.kafka_security_protocol}"))
    if sasl and s.kafka_sasl_username is None:
        problems.append(("KAFKA_SASL_USERNAME", f"required with {s.kafka_security_protocol}"))
    if sasl and s.kafka_sasl_password is None:
        problems.append(("KAFKA_SASL_PASSWORD", f"required with {s.kafka_security_protocol}"))
    if not sasl:
        for name in ("kafka_sasl_mechanism", "kafka_sasl_username", "kafka_sasl_password"):
            if getattr(s, name) is not None:
                problems.append(
                    (
                        name.upper(),
                        "needs ACKLINE_KAFKA_SECURITY_PROTOCOL SASL_PLAINTEXT or SASL_SSL",
                    )
                )
    problems += _tls_problems(s, tls)
    if s.max_poll_interval_ms < s.session_timeout_ms:  # librdkafka refuses the pair
        problems.append(("MAX_POLL_INTERVAL_MS", "must be at least ACKLINE_SESSION_TIMEOUT_MS"))
    if s.database_sslrootcert is not None and s.database_sslmode in (None, "disable", "prefer"):
        problems.append(
            ("DATABASE_SSLMODE", "must be require, verify-ca or verify-full with a root cert")
        )
    return [(ENV_PREFIX + name.upper(), problem) for name, problem in problems]


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build the settings or raise a SettingsError naming the first bad setting.

    ``overrides`` are the CLI's (None means "not given"); ``environ`` defaults to
    ``os.environ`` and is only read to check names and record where values came from
    (pydantic-settings reads the process environment itself).
    """
    env = os.environ if environ is None else environ
    clean = {k: v for k, v in overrides.items() if v is not None}
    _reject_unknown_variables(env)
    config_file = clean.get("config_file") or _env_value(env, CONFIG_FILE_VAR)
    file_values = read_config_file(Path(config_file)) if config_file else {}
    if config_file:
        _reject_unknown_keys(Path(config_file), file_values)
    sources = setting_sources(clean, env, file_values)
    token = _TOML_FILE.set(Path(config_file) if config_file else None)
    try:
        settings = Settings(**clean)
    except ValidationError as exc:
        first = exc.errors()[0]
        cause = first.get("ctx", {}).get("error")
        if isinstance(cause, _CrossFieldError):
            raise SettingsError(cause.setting, str(cause)) from exc
        field = str(first["loc"][0]) if first["loc"] else "?"
        where = {"cli": "command line", "env": "environment", "file": str(config_file)}
        origin = where.get(sources.get(field, "default"))
        if sources.get(field) == "file" and config_file:
            line = key_line(Path(config_file), field)
            origin = f"{config_file}{f' line {line}' if line else ''}, key {field}"
        problem = "unknown setting" if first["type"] == "extra_forbidden" else first["msg"]
        raise SettingsError(
            ENV_PREFIX + field.upper(), f"{problem} (from {origin})" if origin else problem
        ) from exc
    finally:
        _TOML_FILE.reset(token)
    settings._sources = sources
    return settings


def read_config_file(path: Path) -> dict[str, Any]:
    """The TOML file's top-level keys, or a SettingsError naming ACKLINE_CONFIG_FILE."""
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError as exc:
        raise SettingsError(CONFIG_FILE_VAR, f"no such file: {path}") from exc
    except OSError as exc:
        raise SettingsError(CONFIG_FILE_VAR, f"cannot read {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(CONFIG_FILE_VAR, f"{path} is not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:  # TOML is UTF-8: tomllib raises this one raw
        raise SettingsError(
            CONFIG_FILE_VAR, f"{path} is not UTF-8 text, as TOML must be: {exc}"
        ) from exc
    return data


def _reject_unknown_keys(path: Path, values: Mapping[str, Any]) -> None:
    """A key of the file that names no setting stops the program, naming the file, the
    line, the key and the closest valid key (a typo must not pass as a default)."""
    known = sorted(Settings.model_fields)
    for key, value in values.items():
        if key in Settings.model_fields:
            _reject_a_boolean(path, key, value)
            continue
        line = key_line(path, key)
        where = f"{path} line {line}" if line else str(path)
        if isinstance(value, dict):
            raise SettingsError(
                CONFIG_FILE_VAR,
                f"{where}: [{key}] is a table; settings are flat `name = value` keys "
                "at the top of the file",
            )
        close = difflib.get_close_matches(key.lower(), known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SettingsError(CONFIG_FILE_VAR, f"{where}: unknown key {key!r}{hint}")


def _reject_a_boolean(path: Path, key: str, value: Any) -> None:
    """A TOML ``true``/``false`` for a setting that is not a yes or no stops the program:
    pydantic takes a boolean as 1 or 0 for a number (``metrics_port = false`` turned the
    metrics off), where the same words from the environment are refused."""
    annotation = Settings.model_fields[key].annotation
    if not isinstance(value, bool) or bool in (annotation, *typing.get_args(annotation)):
        return
    line = key_line(path, key)
    where = f"{path} line {line}" if line else str(path)
    raise SettingsError(
        ENV_PREFIX + key.upper(),
        f"{str(value).lower()} is a TOML boolean, not a value of this setting "
        f"(from {where}, key {key})",
    )


def key_line(path: Path, key: str) -> int | None:
    """The 1-based line of ``path`` where top-level ``key`` is set (or a table of that
    name opens); None when it cannot be found. Reads the text, which TOML parsing does
    not give positions for."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    forms = {key, f'"{key}"', f"'{key}'"}
    for number, raw in enumerate(lines, 1):
        text = raw.strip()
        if text.startswith("["):
            if text.strip("[] ") in forms:
                return number
            continue
        name, eq, _ = text.partition("=")
        if eq and name.strip() in forms:
            return number
    return None


def setting_sources(
    overrides: Mapping[str, Any], environ: Mapping[str, str], file_values: Mapping[str, Any]
) -> dict[str, Source]:
    """Which source wins for each setting, by the documented precedence. Pure."""
    env_names = {k.upper() for k in environ}
    found: dict[str, Source] = {}
    for name in Settings.model_fields:
        if name in overrides:
            found[name] = "cli"
        elif ENV_PREFIX + name.upper() in env_names:
            found[name] = "env"
        elif name in file_values:
            found[name] = "file"
        else:
            found[name] = "default"
    return found


def _env_value(environ: Mapping[str, str], name: str) -> str | None:
    for key, value in environ.items():
        if key.upper() == name:
            return value or None
    return None


def _reject_unknown_variables(environ: Mapping[str, str]) -> None:
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    for key in sorted(environ):
        name = key.upper()
        if name.startswith(ENV_PREFIX) and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise SettingsError(key, f"unknown setting{hint}")
