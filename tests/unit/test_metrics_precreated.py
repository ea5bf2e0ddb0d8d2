"""Every labelled series an alert reads exists at 0 from the worker's first scrape
(issue 18: increase() misses the first increment of a series that appears with 1, so
the first conflict after a restart did not fire the critical alert)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from prometheus_client import generate_latest

from ackline.runtime.wiring import RETRY_CAUSES, build_ingest
from ackline.schemas.decode import REASONS
from ackline.settings import load_settings
from ackline.sinks.ingest.classify import Layer

ROOT = Path(__file__).resolve().parents[2]


def _scrape() -> str:
    settings = load_settings(environ={})
    ingest = build_ingest(settings, "127.0.0.1:9", "postgresql://u@127.0.0.1:9/db")
    return generate_latest(ingest.metrics.registry).decode()


def test_a_fresh_worker_exports_every_alerted_series_at_zero() -> None:
    text = _scrape()
    for layer in get_args(Layer):
        assert f'ackline_conflicts_total{{layer="{layer}"}} 0.0' in text
        assert f'ackline_duplicates_total{{layer="{layer}"}} 0.0' in text
    for reason in REASONS:
        assert f'ackline_rejects_total{{reason="{reason}"}} 0.0' in text
    for cause in RETRY_CAUSES:
        assert f'ackline_db_retries_total{{cause="{cause}"}} 0.0' in text


def test_the_retry_causes_are_the_writers() -> None:
    source = (ROOT / "sinks" / "ingest" / "writer.py").read_text(encoding="utf-8")
    used = set(re.findall(r'_retrying\("([a-z_]+)"\)', source))
    assert used and used == set(RETRY_CAUSES)
