"""Settings fail at start naming the setting; fault specs parse or fail clearly."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from ackline.core.errors import SettingsError
from ackline.core.faults import Faults, InjectedFault, parse
from ackline.settings import load_settings


def test_bad_setting_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACKLINE_BATCH_MAX_EVENTS", "zero")
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "ACKLINE_BATCH_MAX_EVENTS" in str(info.value)


def test_bad_topic_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACKLINE_TOPIC", "no spaces allowed")
    with pytest.raises(SettingsError, match="ACKLINE_TOPIC"):
        load_settings()


def test_dsn_is_secret_and_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACKLINE_DATABASE_URL", "postgresql://u:hunter2@h/db")
    s = load_settings()
    assert "hunter2" not in repr(s)
    # the password only: where the DSN points is what an operator checks (issue 18)
    assert s.redacted()["database_url"] == "postgresql://u:**********@h/db"


def test_settings_are_frozen() -> None:
    s = load_settings()
    with pytest.raises(ValidationError):
        s.topic = "x"  # type: ignore[misc]


def test_fault_spec_parses_and_fires_on_nth_hit() -> None:
    f = Faults("mid_copy=fail@2")
    f.hit("mid_copy")
    with pytest.raises(InjectedFault):
        f.hit("mid_copy")
    f.hit("mid_copy")  # fires once


def test_a_stall_ends_at_its_release_file_which_ends_one_stall(tmp_path: Path) -> None:
    release = tmp_path / "release"
    f = Faults("after_fetch=stall,after_commit=stall", stall_seconds=60, release_file=release)
    release.touch()
    started = time.monotonic()
    f.hit("after_fetch")
    assert time.monotonic() - started < 5 and not release.exists()
    release.touch()
    asyncio.run(f.ahit("after_commit"))
    assert time.monotonic() - started < 10 and not release.exists()


def test_a_release_that_names_a_point_ends_a_stall_there_only(tmp_path: Path) -> None:
    release = tmp_path / "release"
    f = Faults("after_fetch=stall,after_commit=stall", stall_seconds=0.3, release_file=release)
    release.write_text("after_commit")
    started = time.monotonic()
    f.hit("after_fetch")
    assert time.monotonic() - started >= 0.3 and release.exists()
    f.hit("after_commit")
    assert time.monotonic() - started < 5 and not release.exists()


def test_a_stall_without_its_release_lasts_stall_seconds(tmp_path: Path) -> None:
    f = Faults("after_fetch=stall", stall_seconds=0.3, release_file=tmp_path / "never")
    started = time.monotonic()
    f.hit("after_fetch")
    assert time.monotonic() - started >= 0.3


def test_a_rejoin_is_left_to_the_caller_once() -> None:
    f = Faults("after_assign=rejoin@2")
    assert [asyncio.run(f.ahit("after_assign")) for _ in range(3)] == [False, True, False]
    assert asyncio.run(Faults("after_commit=stall@2").ahit("after_commit")) is False


@pytest.mark.parametrize(
    "spec", ["nowhere=kill", "mid_copy=explode", "mid_copy=kill@0", "after_commit=rejoin"]
)
def test_bad_fault_spec(spec: str) -> None:
    with pytest.raises(SettingsError, match="ACKLINE_FAULTS"):
        parse(spec)
