"""Settings an operator's probe found taken, or failing later with a traceback or a wait
that names nothing: each now stops every command at start, naming the setting. A
DATABASE_URL the driver cannot read is told without a byte of it (a password may be in
it): it failed in every command that connects, some tracebacks showing part of the
password."""

from __future__ import annotations

import pytest

from ackline.cli import main
from ackline.core.errors import SettingsError
from ackline.runtime.httpserver import HttpServer
from ackline.settings import bootstrap_problem, dsn_problem, load_settings, poll_interval_advice

pytestmark = pytest.mark.usefixtures("clean_env")


BAD = [
    "postgresql://u:se/cret@127.0.0.1:1/db",  # a '/' in the password: a "port" of 'se'
    "postgresql://u:se?cret@127.0.0.1:1/db",  # a '?': the rest is a query
    "postgresql://u:se#cret@127.0.0.1:1/db",  # a '#': the rest is a fragment
    "postgresql://u:se@cret@127.0.0.1:1/db",  # a second '@': asyncpg splits at the first
    "postgresql://u:secret@127.0.0.1:abc/db",
    "postgresql://u:secret@127.0.0.1:99999/db",
    "postgresql://u:secret@[::1/db",
    "postgresql://u:secret@127.0.0.1:1/db?sslmode=bogus",
    "mysql://u:secret@127.0.0.1:1/db",
]


@pytest.mark.parametrize("dsn", BAD)
def test_a_url_the_driver_cannot_read_is_refused_without_echoing_it(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACKLINE_DATABASE_URL", dsn)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    text = str(caught.value)
    assert "ACKLINE_DATABASE_URL" in text
    assert "cret" not in text and "secret" not in text


GOOD = [
    "postgresql://u:se%2Fcr%40et@127.0.0.1:5432/db",
    "postgres://127.0.0.1/db",
    "postgresql:///db?host=/run/postgresql",
    "postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write",
    "postgresql://u@[::1]:5432/db?sslmode=verify-full",
    "postgresql://u@[::1]/db",
    "postgresql://h/db?sslmode=",  # empty: the driver's default
]


@pytest.mark.parametrize("dsn", GOOD)
def test_urls_the_driver_reads_are_accepted(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert dsn_problem(dsn) is None
    monkeypatch.setenv("ACKLINE_DATABASE_URL", dsn)
    assert load_settings().database_url is not None


def test_a_command_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACKLINE_DATABASE_URL", "postgresql://u:se/cret@127.0.0.1:1/db")
    assert main(["migrate"]) == 2
    err = capsys.readouterr().err
    assert "setting ACKLINE_DATABASE_URL" in err and "port" in err, err
    assert "Traceback" not in err and "cret" not in err, err


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("ACKLINE_KAFKA_BOOTSTRAP", ",,,", "no empty entry"),
        ("ACKLINE_KAFKA_BOOTSTRAP", "127.0.0.1:abc", "port"),
        ("ACKLINE_KAFKA_BOOTSTRAP", "127.0.0.1:99999", "port"),
        ("ACKLINE_KAFKA_BOOTSTRAP", "[::1]x", "after ']'"),
        ("ACKLINE_DATABASE_URL", "postgresql://h1,,h2/db", "an empty host"),
        ("ACKLINE_TOPIC", ".", "'.' or '..'"),
        ("ACKLINE_TOPIC", "..", "'.' or '..'"),
        ("ACKLINE_WORKER_ID", "", "at least 1"),
        ("ACKLINE_RETENTION", "99999999999d", "a century"),
        ("ACKLINE_DB_CHECK_INTERVAL_S", "1e-9", "0.1"),
        ("ACKLINE_DB_CHECK_INTERVAL_S", "nan", "finite"),
        ("ACKLINE_PROGRESS_LOG_S", "1e-9", "at least 1"),
        ("ACKLINE_SHUTDOWN_WAIT_S", "inf", "finite"),
        ("ACKLINE_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", "99999999999999", "2147483647"),
        # checked only by `run`: `config show` and `status` took it (an operator's report)
        ("ACKLINE_FAULTS", "garbage", "point=action"),
    ],
)
def test_values_no_one_means_stop_at_start(
    name: str, value: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the operator's probe: each of these was taken (or failed later with a
    traceback, or a 10 s wait naming nothing)."""
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert name in str(caught.value) and says in str(caught.value), str(caught.value)


def test_a_poll_interval_below_the_session_timeout_stops_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """librdkafka refuses the pair when the consumer is built, after Kafka answered."""
    monkeypatch.setenv("ACKLINE_SESSION_TIMEOUT_MS", "300000")
    monkeypatch.setenv("ACKLINE_MAX_POLL_INTERVAL_MS", "1000")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "ACKLINE_MAX_POLL_INTERVAL_MS" in str(caught.value), str(caught.value)


def test_a_poll_interval_shorter_than_the_assign_claims_hold_is_warned_of(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default runtime's assign callback may hold the rebalance while its claim
    cannot reach PostgreSQL, up to the leave bound plus a statement timeout, a connect
    timeout and a retry's backoff (135 s with the defaults); past
    ACKLINE_MAX_POLL_INTERVAL_MS (the rebalance timeout) the broker goes on without the
    worker. It was documented, not checked; `run` now warns (a stall, not a loss: the
    interval is shortened on purpose in tests)."""
    assert poll_interval_advice(load_settings()) is None  # the defaults: 300 s > 135 s
    monkeypatch.setenv("ACKLINE_MAX_POLL_INTERVAL_MS", "120000")
    advice = poll_interval_advice(load_settings())
    assert advice is not None
    assert advice.startswith("ACKLINE_MAX_POLL_INTERVAL_MS (120 s)") and "135 s" in advice
    monkeypatch.setenv("ACKLINE_MAX_POLL_INTERVAL_MS", "136000")
    assert poll_interval_advice(load_settings()) is None
    monkeypatch.setenv("ACKLINE_MAX_POLL_INTERVAL_MS", "60000")
    monkeypatch.setenv("ACKLINE_DB_LEAVE_AFTER_S", "0")  # never leaves: documented apart
    assert poll_interval_advice(load_settings()) is None
    monkeypatch.setenv("ACKLINE_DB_LEAVE_AFTER_S", "90")
    monkeypatch.setenv("ACKLINE_RUNTIME", "faust")  # claims outside the rebalance callback
    assert poll_interval_advice(load_settings()) is None


@pytest.mark.parametrize(
    "servers",
    [
        "b1:9092,b2:9093",
        "PLAINTEXT://b1:9092",
        "localhost",
        "[::1]:9092",
        "::1",
        "[::1]",  # librdkafka's own port (a review: it was refused)
        "PLAINTEXT://[::1]",
        " b1:9092 , b2 ",
    ],
)
def test_bootstrap_lists_librdkafka_takes_are_taken(servers: str) -> None:
    assert bootstrap_problem(servers) is None


def test_a_metrics_host_that_is_not_here_is_named_not_the_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bad ACKLINE_METRICS_HOST was reported as the port ('setting ACKLINE_METRICS_PORT:
    cannot listen'), and with the default port as 'the default metrics port is in use'.
    (An IPv6 literal on the IPv4 server: refused locally, no packet sent.)"""
    monkeypatch.setenv("ACKLINE_METRICS_HOST", "::2")
    server = HttpServer(lambda path: (200, "text/plain", b""))
    with pytest.raises(SettingsError) as caught:
        server.serve(load_settings())
    assert caught.value.setting == "ACKLINE_METRICS_HOST", str(caught.value)
