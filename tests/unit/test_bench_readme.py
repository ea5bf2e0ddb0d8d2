"""The bench block of docs/performance.md and the bench's summary in README.md are generated
from the committed results and must equal them."""

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


def test_readme_summary_is_the_committed_results() -> None:
    summary = json.loads(readme.RESULTS.read_text(encoding="utf-8"))
    generated = readme.summary_block(summary)
    assert generated in readme.README.read_text(encoding="utf-8"), (
        "the bench summary of README.md differs from load/bench/results.json: "
        "run `.venv/bin/python -m ackline.load.bench.readme`"
    )
    r = readme.ratios(summary)
    assert f"{r['ratio_to_limit']:.2f} x the COPY limit" in generated
    assert "Missed:" in generated and "\n\n" not in generated  # one paragraph


def test_splice_replaces_only_the_block() -> None:
    text = f"before\n{readme.START}\nold\n{readme.END}\nafter\n"
    assert readme.splice(text, "NEW") == "before\nNEW\nafter\n"


def test_splice_without_markers_is_a_clear_error() -> None:
    with pytest.raises(LoadError, match="no bench block"):
        readme.splice("no markers here", "NEW")


def test_a_peer_that_died_on_the_replay_is_said_in_one_table_cell() -> None:
    """A bench run (fresh clone, 2026-12-02) had the naive faust peer die with a traceback
    of no 'Error:' line: the first 100 characters of it, newlines and all, broke the
    table's row in two."""
    from ackline.load.bench.readme import _verdict

    error = "faust exited 1 before the replay to be consumed:\n line 519, in _and_transition\n"
    cell = _verdict({"replay": {"error": error + "    return await fun(|x"}})
    assert "\n" not in cell and cell.startswith("died: faust exited 1"), cell
    assert "line 519" in cell and "\\|" not in cell[:60]
