"""A TOML settings file with a typo names the file, the line, the key and the closest
valid key (issue 18), not an environment variable that nobody set."""

from __future__ import annotations

from pathlib import Path

import pytest

from ackline.core.errors import SettingsError
from ackline.settings import load_settings


def _error(path: Path) -> SettingsError:
    with pytest.raises(SettingsError) as info:
        load_settings(environ={}, config_file=str(path))
    return info.value


def test_an_unknown_key_names_file_line_key_and_the_closest_key(tmp_path: Path) -> None:
    path = tmp_path / "ackline.toml"
    path.write_text('# settings\ntopic = "t"\n\nbatch_max_event = 500\n', encoding="utf-8")
    err = _error(path)
    assert err.setting == "ACKLINE_CONFIG_FILE"
    text = str(err)
    assert f"{path} line 4" in text
    assert "batch_max_event " in text or "'batch_max_event'" in text
    assert "batch_max_events" in text  # the suggestion


def test_an_unknown_key_with_no_close_match_still_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "ackline.toml"
    path.write_text('topic = "t"\n"zzz qqq" = 1\n', encoding="utf-8")
    text = str(_error(path))
    assert f"{path} line 2" in text and "zzz qqq" in text


def test_a_table_is_not_a_setting(tmp_path: Path) -> None:
    path = tmp_path / "ackline.toml"
    path.write_text('topic = "t"\n[kafka]\nbootstrap = "h:9092"\n', encoding="utf-8")
    text = str(_error(path))
    assert f"{path} line 2" in text and "kafka" in text and "flat" in text


def test_a_bad_value_names_the_setting_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "ackline.toml"
    path.write_text('topic = "t"\nbatch_max_events = "many"\n', encoding="utf-8")
    err = _error(path)
    assert err.setting == "ACKLINE_BATCH_MAX_EVENTS"
    assert f"{path} line 2" in err.problem and "batch_max_events" in err.problem


@pytest.mark.parametrize(
    ("line", "setting"),
    [
        ("batch_max_events = true", "ACKLINE_BATCH_MAX_EVENTS"),
        ("metrics_port = false", "ACKLINE_METRICS_PORT"),
        ("db_connect_timeout_s = true", "ACKLINE_DB_CONNECT_TIMEOUT_S"),
        ("topic = true", "ACKLINE_TOPIC"),
    ],
)
def test_a_toml_boolean_is_not_a_number(tmp_path: Path, line: str, setting: str) -> None:
    """An operator's probe: `batch_max_events = true` ran with 1, `metrics_port = false`
    turned the metrics off (0), where the same words from the environment are refused.
    A TOML boolean is a setting's value only where the setting is a yes or no."""
    path = tmp_path / "ackline.toml"
    path.write_text(f"# settings\n{line}\n", encoding="utf-8")
    err = _error(path)
    assert err.setting == setting
    assert f"{path} line 2" in err.problem and "boolean" in err.problem, err.problem
