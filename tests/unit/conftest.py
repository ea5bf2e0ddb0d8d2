"""Fixtures shared by the unit tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from ackline.schemas import exact
from ackline.schemas.envelope import ENVELOPES, PAYLOADS


@pytest.fixture
def registry() -> Iterator[None]:
    """Restore the process-wide payload registry after the test (plugins register into it)."""
    payloads, envelopes = dict(PAYLOADS), dict(ENVELOPES)
    yield
    PAYLOADS.clear()
    PAYLOADS.update(payloads)
    ENVELOPES.clear()
    ENVELOPES.update(envelopes)
    exact._known = (-1, frozenset())  # its cache of known models is keyed on the count


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ACKLINE_ variable of the caller's shell reaches the settings under test (a
    module uses it with ``pytestmark = pytest.mark.usefixtures("clean_env")``)."""
    for key in list(os.environ):
        if key.upper().startswith("ACKLINE_"):
            monkeypatch.delenv(key)
