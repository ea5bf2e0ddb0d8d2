"""The ingest DSN rule and the role helpers (pure; the server side is in
tests/integration/test_privileges.py)."""

from __future__ import annotations

import os
import re

import pytest
from pydantic import SecretStr

from ackline.clients import ingest_dsn
from ackline.core.errors import SettingsError
from ackline.roles import dsn_password, dsn_user, scram_sha256_verifier, with_user
from ackline.settings import Settings


@pytest.fixture(autouse=True)
def _no_ackline_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("ACKLINE_"):
            monkeypatch.delenv(name)


def test_with_user_swaps_the_user_and_drops_the_password() -> None:
    dsn = "postgresql://postgres:pw@db.example:5432/ackline?sslmode=require&password=x"
    swapped = with_user(dsn, "ackline_ingest")
    assert swapped == "postgresql://ackline_ingest@db.example:5432/ackline?sslmode=require"
    assert dsn_user(swapped) == "ackline_ingest" and dsn_password(swapped) is None
    assert with_user("postgresql://127.0.0.1:5/db", "r") == "postgresql://r@127.0.0.1:5/db"
    assert dsn_user("postgresql://h/db?user=bob") == "bob"
    assert dsn_password("postgresql://u:p%40ss@h/db") == "p@ss"


def test_ingest_dsn_local_stack_derives_the_ingest_role() -> None:
    s = Settings()
    assert ingest_dsn(s, "postgresql://postgres@127.0.0.1:49177/ackline") == (
        "postgresql://ackline_ingest@127.0.0.1:49177/ackline"
    )


def test_ingest_dsn_explicit_url_wins_and_keeps_tls() -> None:
    s = Settings(
        database_ingest_url=SecretStr("postgresql://ackline_ingest:pw@db/ackline"),
        database_sslmode="require",
    )
    assert ingest_dsn(s, "postgresql://admin:secret@db/ackline") == (
        "postgresql://ackline_ingest:pw@db/ackline?sslmode=require"
    )


def test_ingest_dsn_refuses_to_borrow_the_admin_password() -> None:
    with pytest.raises(SettingsError) as err:
        ingest_dsn(Settings(), "postgresql://admin:secret@db/ackline")
    assert err.value.setting == "ACKLINE_DATABASE_INGEST_URL"
    assert "secret" not in str(err.value)


def test_scram_verifier_form() -> None:
    v = scram_sha256_verifier("pw", salt=b"0123456789abcdef", iterations=4096)
    assert re.fullmatch(r"SCRAM-SHA-256\$4096:[A-Za-z0-9+/=]+\$[A-Za-z0-9+/=]+:[A-Za-z0-9+/=]+", v)
    assert v == scram_sha256_verifier("pw", salt=b"0123456789abcdef")
    assert v != scram_sha256_verifier("pw2", salt=b"0123456789abcdef")
    assert scram_sha256_verifier("pw") != scram_sha256_verifier("pw")  # random salt


def test_scram_verifier_refuses_what_saslprep_would_change() -> None:
    with pytest.raises(ValueError):
        scram_sha256_verifier("pässword")
    with pytest.raises(ValueError):
        scram_sha256_verifier("tab\there")
