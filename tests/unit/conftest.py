"""Fixtures shared by the unit tests."""

from __future__ import annotations

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
