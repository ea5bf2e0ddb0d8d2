"""The one frozen settings model.

Precedence, highest first: explicit overrides passed by the CLI, ``ACKLINE_*``
environment variables, defaults. A setting that fails validation stops the program
at start with a :class:`~ackline.errors.SettingsError` that names it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ackline.errors import SettingsError

ENV_PREFIX = "ACKLINE_"


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseSettings):
    """Every knob of ackline, read once at start and never mutated."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", case_sensitive=False
    )

    # Where the services are. Unset: the local stack started by `ackline dev up`.
    kafka_bootstrap: str | None = None
    database_url: SecretStr | None = None
    state_dir: Path = Path(".ackline")

    # What to consume and where poison goes.
    topic: str = "agent-activity"
    group_id: str = "ackline"
    dlq_topic: str = "agent-activity.dlq"
    worker_id: str = Field(default_factory=_default_worker_id)
    group_protocol: Literal["classic", "consumer"] = "classic"
    session_timeout_ms: int = Field(default=10_000, ge=1_000, le=300_000)
    max_poll_interval_ms: int = Field(default=300_000, ge=1_000, le=3_600_000)
    start_from: Literal["earliest", "latest"] = "earliest"

    # Batching and backpressure.
    batch_max_events: int = Field(default=2_000, ge=1, le=100_000)
    batch_max_ms: int = Field(default=200, ge=1, le=60_000)
    max_message_bytes: int = Field(default=1_048_576, ge=256, le=64 * 1_048_576)
    max_json_depth: int = Field(default=32, ge=2, le=512)

    # Operations.
    metrics_port: int = Field(default=0, ge=0, le=65_535)
    retry_max_seconds: float = Field(default=30.0, gt=0)
    revoke_wait_s: float = Field(default=20.0, gt=0)
    shutdown_wait_s: float = Field(default=30.0, gt=0)
    db_idle_in_transaction_timeout_ms: int = Field(default=15_000, ge=100)
    faults: str = ""
    fault_stall_seconds: float = Field(default=3600.0, gt=0)

    @field_validator("topic", "group_id", "dlq_topic")
    @classmethod
    def _kafka_name(cls, value: str) -> str:
        allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
        if not value or len(value) > 249 or not set(value) <= allowed:
            raise ValueError("must be 1-249 characters of [a-zA-Z0-9._-]")
        return value

    @field_validator("database_url")
    @classmethod
    def _dsn(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(
            ("postgres://", "postgresql://")
        ):
            raise ValueError("must be a postgresql:// URL")
        return value

    def redacted(self) -> dict[str, Any]:
        """The effective settings with secrets shown as '**********'."""
        return {
            name: ("**********" if isinstance(value, SecretStr) else value)
            for name, value in self.model_dump().items()
        }


def load_settings(**overrides: Any) -> Settings:
    """Build the settings or raise a SettingsError naming the first bad setting."""
    clean = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**clean)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "?"
        raise SettingsError(ENV_PREFIX + field.upper(), first["msg"]) from exc
