"""Settings for production: precedence, the TOML file, security settings, redaction,
and a SettingsError that names the setting for every way a setting can be wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ackline.cli import main
from ackline.clients import database_dsn, kafka_client_config
from ackline.core.errors import SettingsError
from ackline.settings import Settings, load_settings, setting_sources
from ackline.streams.consumer_config import RuntimeConfig

pytestmark = pytest.mark.usefixtures("clean_env")


@pytest.fixture
def toml_file(tmp_path: Path) -> Path:
    path = tmp_path / "ackline.toml"
    path.write_text(
        'topic = "file-topic"\ngroup_id = "file-group"\nbatch_max_events = 50\n'
        'dlq_topic = "file-dlq"\n',
        encoding="utf-8",
    )
    return path


def test_precedence_cli_over_env_over_file_over_defaults(
    monkeypatch: pytest.MonkeyPatch, toml_file: Path
) -> None:
    monkeypatch.setenv("ACKLINE_CONFIG_FILE", str(toml_file))
    monkeypatch.setenv("ACKLINE_TOPIC", "env-topic")
    monkeypatch.setenv("ACKLINE_GROUP_ID", "env-group")
    s = load_settings(topic="cli-topic")
    assert s.topic == "cli-topic"  # cli beats env and file
    assert s.group_id == "env-group"  # env beats file
    assert s.batch_max_events == 50  # file beats default
    assert s.batch_max_ms == 200  # default
    sources = s.sources()
    assert sources["topic"] == "cli"
    assert sources["group_id"] == "env"
    assert sources["batch_max_events"] == "file"
    assert sources["batch_max_ms"] == "default"


def test_config_option_names_the_file(toml_file: Path) -> None:
    s = load_settings(config_file=str(toml_file))
    assert (s.topic, s.dlq_topic, s.config_file) == ("file-topic", "file-dlq", toml_file)
    assert s.sources()["config_file"] == "cli"


def test_no_file_means_no_file_layer() -> None:
    s = load_settings()
    assert s.topic == "agent-activity"
    assert set(s.sources().values()) == {"default"}


def test_sources_are_a_pure_function() -> None:
    found = setting_sources(
        {"topic": "x"}, {"ackline_group_id": "g", "OTHER": "1"}, {"dlq_topic": "d", "topic": "t"}
    )
    assert found["topic"] == "cli"
    assert found["group_id"] == "env"  # environment names are case-insensitive
    assert found["dlq_topic"] == "file"
    assert found["worker_id"] == "default"


def _error(**overrides: str) -> SettingsError:
    with pytest.raises(SettingsError) as info:
        load_settings(**overrides)
    return info.value


def test_missing_config_file_names_ackline_config_file(tmp_path: Path) -> None:
    err = _error(config_file=str(tmp_path / "absent.toml"))
    assert err.setting == "ACKLINE_CONFIG_FILE"
    assert "absent.toml" in err.problem


def test_unparseable_config_file_names_ackline_config_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("topic = \n", encoding="utf-8")
    err = _error(config_file=str(bad))
    assert err.setting == "ACKLINE_CONFIG_FILE"
    assert "not valid TOML" in err.problem


def test_a_config_file_that_is_not_utf8_names_ackline_config_file(tmp_path: Path) -> None:
    """It said "cannot read the file: 'utf-8' codec can't decode byte 0xff", naming neither
    the setting nor the file (an operator's report)."""
    bad = tmp_path / "latin.toml"
    bad.write_bytes(b"\xff\xfe\x00bad")
    err = _error(config_file=str(bad))
    assert err.setting == "ACKLINE_CONFIG_FILE"
    assert "latin.toml" in err.problem and "UTF-8" in err.problem, err.problem


def test_bad_value_in_the_file_names_the_setting_and_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('batch_max_events = "many"\n', encoding="utf-8")
    err = _error(config_file=str(bad))
    assert err.setting == "ACKLINE_BATCH_MAX_EVENTS"
    assert str(bad) in err.problem


def test_unknown_key_in_the_file_is_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('topik = "x"\n', encoding="utf-8")
    err = _error(config_file=str(bad))
    # the file, its line and the key, with the closest valid key (issue 18)
    assert err.setting == "ACKLINE_CONFIG_FILE"
    assert f"{bad} line 1" in err.problem and "topik" in err.problem and "topic" in err.problem


def test_unknown_environment_variable_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACKLINE_DATABSE_URL", "postgresql://h/db")
    err = _error()
    assert err.setting == "ACKLINE_DATABSE_URL"
    assert "ACKLINE_DATABASE_URL" in err.problem  # the suggestion


def test_bad_environment_value_says_where_it_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACKLINE_KAFKA_SECURITY_PROTOCOL", "TLS")
    err = _error()
    assert err.setting == "ACKLINE_KAFKA_SECURITY_PROTOCOL"
    assert "environment" in err.problem


@pytest.fixture
def cert_files(tmp_path: Path) -> dict[str, str]:
    names = {}
    for name in ("ca.pem", "cert.pem", "key.pem", "root.crt"):
        (tmp_path / name).write_text("x", encoding="utf-8")
        names[name.split(".")[0]] = str(tmp_path / name)
    return names


@pytest.mark.parametrize(
    ("env", "setting"),
    [
        ({"KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "ACKLINE_KAFKA_SASL_MECHANISM"),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "PLAIN"},
            "ACKLINE_KAFKA_SASL_USERNAME",
        ),
        (
            {
                "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                "KAFKA_SASL_USERNAME": "u",
            },
            "ACKLINE_KAFKA_SASL_PASSWORD",
        ),
        ({"KAFKA_SASL_MECHANISM": "PLAIN"}, "ACKLINE_KAFKA_SASL_MECHANISM"),
        ({"KAFKA_SASL_USERNAME": "u"}, "ACKLINE_KAFKA_SASL_USERNAME"),
        ({"KAFKA_SASL_MECHANISM": "KERBEROS"}, "ACKLINE_KAFKA_SASL_MECHANISM"),
        ({"KAFKA_SSL_CA_LOCATION": "{ca}"}, "ACKLINE_KAFKA_SSL_CA_LOCATION"),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CA_LOCATION": "/nowhere/ca.pem"},
            "ACKLINE_KAFKA_SSL_CA_LOCATION",
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CERTIFICATE_LOCATION": "{cert}"},
            "ACKLINE_KAFKA_SSL_KEY_LOCATION",
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_KEY_LOCATION": "{key}"},
            "ACKLINE_KAFKA_SSL_CERTIFICATE_LOCATION",
        ),
        ({"DATABASE_SSLMODE": "sometimes"}, "ACKLINE_DATABASE_SSLMODE"),
        ({"DATABASE_SSLROOTCERT": "{root}"}, "ACKLINE_DATABASE_SSLMODE"),
        (
            {"DATABASE_SSLMODE": "verify-full", "DATABASE_SSLROOTCERT": "/nowhere/root.crt"},
            "ACKLINE_DATABASE_SSLROOTCERT",
        ),
        ({"LOG_FORMAT": "xml"}, "ACKLINE_LOG_FORMAT"),
        ({"READY_MAX_COMMIT_AGE_S": "0"}, "ACKLINE_READY_MAX_COMMIT_AGE_S"),
        ({"METRICS_PORT": "70000"}, "ACKLINE_METRICS_PORT"),
    ],
)
def test_every_wrong_setting_is_named(
    monkeypatch: pytest.MonkeyPatch,
    cert_files: dict[str, str],
    env: dict[str, str],
    setting: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv("ACKLINE_" + name, value.format_map(cert_files))
    err = _error()
    assert err.setting == setting, str(err)
    assert setting in str(err)


def _secure(monkeypatch: pytest.MonkeyPatch, cert_files: dict[str, str]) -> Settings:
    env = {
        "ACKLINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "ACKLINE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
        "ACKLINE_KAFKA_SASL_USERNAME": "ingest",
        "ACKLINE_KAFKA_SASL_PASSWORD": "kafka-s3cret",
        "ACKLINE_KAFKA_SSL_CA_LOCATION": cert_files["ca"],
        "ACKLINE_KAFKA_SSL_CERTIFICATE_LOCATION": cert_files["cert"],
        "ACKLINE_KAFKA_SSL_KEY_LOCATION": cert_files["key"],
        "ACKLINE_KAFKA_SSL_KEY_PASSWORD": "key-s3cret",
        "ACKLINE_DATABASE_URL": "postgresql://u:pg-s3cret@db:5432/ackline?sslmode=disable",
        "ACKLINE_DATABASE_SSLMODE": "verify-full",
        "ACKLINE_DATABASE_SSLROOTCERT": cert_files["root"],
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return load_settings()


def test_kafka_client_config_carries_every_security_setting(
    monkeypatch: pytest.MonkeyPatch, cert_files: dict[str, str]
) -> None:
    conf = kafka_client_config(_secure(monkeypatch, cert_files))
    assert conf == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "ingest",
        "sasl.password": "kafka-s3cret",
        "ssl.ca.location": cert_files["ca"],
        "ssl.certificate.location": cert_files["cert"],
        "ssl.key.location": cert_files["key"],
        "ssl.key.password": "key-s3cret",
    }


def test_plaintext_kafka_needs_no_security_properties() -> None:
    assert kafka_client_config(Settings()) == {"security.protocol": "PLAINTEXT"}


def test_kafka_security_reaches_the_consumer_without_showing_in_repr(
    monkeypatch: pytest.MonkeyPatch, cert_files: dict[str, str]
) -> None:
    from ackline.runtime.confluent import runtime_config

    cfg: RuntimeConfig = runtime_config(_secure(monkeypatch, cert_files), "broker:9092")
    conf = cfg.consumer_conf()
    assert conf["sasl.password"] == "kafka-s3cret"
    assert conf["security.protocol"] == "SASL_SSL"
    assert "s3cret" not in repr(cfg)


def test_database_dsn_takes_the_tls_settings(
    monkeypatch: pytest.MonkeyPatch, cert_files: dict[str, str]
) -> None:
    s = _secure(monkeypatch, cert_files)
    assert s.database_url is not None
    dsn = database_dsn(s.database_url.get_secret_value(), s)
    assert dsn.startswith("postgresql://u:pg-s3cret@db:5432/ackline?")
    assert "sslmode=verify-full" in dsn
    assert "sslmode=disable" not in dsn  # the setting replaces the DSN's own
    assert "sslrootcert=" in dsn


def test_database_dsn_unchanged_without_tls_settings() -> None:
    plain = "postgresql://u@h/db?application_name=x"
    assert database_dsn(plain, Settings()) == plain


def test_redacted_hides_every_secret(
    monkeypatch: pytest.MonkeyPatch, cert_files: dict[str, str]
) -> None:
    s = _secure(monkeypatch, cert_files)
    text = json.dumps(s.redacted(), default=str) + repr(s) + str(s)
    assert "s3cret" not in text
    for name in ("kafka_sasl_password", "kafka_ssl_key_password"):
        assert s.redacted()[name] == "**********"
    # a DSN keeps everything but its password (issue 18)
    assert s.redacted()["database_url"] == (
        "postgresql://u:**********@db:5432/ackline?sslmode=disable"
    )


def test_config_show_redacts_and_names_sources(
    monkeypatch: pytest.MonkeyPatch,
    cert_files: dict[str, str],
    toml_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _secure(monkeypatch, cert_files)
    assert main(["--config", str(toml_file), "--topic", "t-cli", "config", "show", "--json"]) == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out
    shown = json.loads(out)
    assert shown["kafka_sasl_password"] == {"value": "**********", "source": "env"}
    assert shown["topic"] == {"value": "t-cli", "source": "cli"}
    assert shown["batch_max_events"] == {"value": 50, "source": "file"}
    assert main(["--config", str(toml_file), "config", "show"]) == 0
    table = capsys.readouterr().out
    assert "ACKLINE_KAFKA_SASL_PASSWORD" in table
    assert "s3cret" not in table


def test_cli_reports_a_bad_setting_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ACKLINE_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    assert main(["config", "show"]) == 2
    assert "ACKLINE_KAFKA_SASL_MECHANISM" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("env", "cli"),
    [
        ({"ACKLINE_DLQ_TOPIC": "agent-activity"}, {}),  # the default topic
        ({"ACKLINE_TOPIC": "orders", "ACKLINE_DLQ_TOPIC": "orders"}, {}),
        ({"ACKLINE_DLQ_TOPIC": "orders"}, {"topic": "orders"}),  # --topic
    ],
)
def test_dead_letter_topic_must_not_be_the_topic_read(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], cli: dict[str, str]
) -> None:
    # a poison record copied into the topic it is read from is read, rejected and
    # copied again, forever
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    err = _error(**cli)
    assert err.setting == "ACKLINE_DLQ_TOPIC", str(err)
    assert "ACKLINE_TOPIC" in err.problem


def test_dead_letter_topic_equal_to_the_topic_stops_the_cli_with_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ACKLINE_DLQ_TOPIC", "orders")
    # config show: a command that needs no services, so only the setting can stop it
    assert main(["--topic", "orders", "config", "show"]) == 2
    assert "ACKLINE_DLQ_TOPIC" in capsys.readouterr().err
