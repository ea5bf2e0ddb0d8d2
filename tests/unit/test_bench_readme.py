"""The bench block of docs/performance.md is generated from the committed results and must
equal them."""

from __future__ import annotations

import json

import pytest

from ackline.load.bench import readme
from ackline.load.errors import LoadError


def test_performance_page_block_is_the_committed_results() -> None:
    summary = json.loads(readme.RESULTS.read_text(encoding="utf-8"))
    text = readme.PAGE.read_text(encoding="utf-8")
    assert readme.block(summary) in text, (
        "the bench block of docs/performance.md differs from load/bench/results.json: "
        "run `.venv/bin/python -m ackline.load.bench.readme`"
    )
    ackline = summary["systems"]["ackline"]["ingest"]["events_per_s"]
    assert f"| {ackline:,.0f} |" in readme.block(summary)


def test_splice_replaces_only_the_block() -> None:
    text = f"before\n{readme.START}\nold\n{readme.END}\nafter\n"
    assert readme.splice(text, "NEW") == "before\nNEW\nafter\n"


def test_splice_without_markers_is_a_clear_error() -> None:
    with pytest.raises(LoadError, match="no bench block"):
        readme.splice("no markers here", "NEW")
