"""`ackline rejects show N` of a reject an erasure cleared (operator probe): it printed
``value (None bytes):`` and ``(null)``, Python's None and SQL's NULL, where the raw record
was erased on purpose; it now says so, with the erasure that did it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from ackline import cli
from ackline.commands import inspect as inspect_cmd
from ackline.settings import Settings
from ackline.sinks.admin.inspect import RejectDetail, RejectRow


def _detail(erasure_id: int | None, raw_value: bytes | None) -> RejectDetail:
    row = RejectRow(
        reject_id=7,
        reason="undecodable",
        detail="erased" if erasure_id is not None else "bad json",
        topic="t",
        partition=0,
        offset=3,
        dlq_topic="t.dlq",
        dlq_partition=0,
        dlq_offset=1,
        batch_id=2,
        rejected_at=datetime(2026, 12, 5, tzinfo=UTC),
        value_bytes=None if raw_value is None else len(raw_value),
        erasure_id=erasure_id,
    )
    raw_key = None if erasure_id is not None else b"k"
    headers: list[Any] = [] if erasure_id is not None else [["h", "v"]]
    return RejectDetail(row=row, raw_key=raw_key, raw_value=raw_value, headers=headers)


def _show(
    detail: RejectDetail, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> str:
    monkeypatch.setattr(inspect_cmd, "_with_db", lambda settings, query: detail)
    args = cli.parser().parse_args(["rejects", "show", "7"])
    assert inspect_cmd.cmd_rejects(args, Settings()) == 0
    return capsys.readouterr().out


def test_an_erased_reject_says_it_was_erased(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _show(_detail(erasure_id=4, raw_value=None), monkeypatch, capsys)
    assert "None" not in out and "(null)" not in out
    assert "value        (erased by erasure 4)" in out
    assert "key          (erased by erasure 4)" in out


def test_a_reject_that_was_not_erased_shows_its_bytes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _show(_detail(erasure_id=None, raw_value=b"{oops"), monkeypatch, capsys)
    assert "value (5 bytes):\n{oops" in out and "erased" not in out


def test_a_reject_without_a_value_says_no_bytes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _show(_detail(erasure_id=None, raw_value=None), monkeypatch, capsys)
    assert "value (no bytes):" in out and "None" not in out


def test_the_json_names_the_erasure() -> None:
    assert _detail(erasure_id=4, raw_value=None).to_json()["erasure_id"] == 4
