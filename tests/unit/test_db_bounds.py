"""The pure parts of bounding the worker's PostgreSQL waits (issue 11 item 4, issue 18):
derived TCP bounds and session settings, the transient rule, how an outage is logged
and shown to readiness, a stop before any I/O, the settings, and the netns naming rule."""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg
import pytest

from ackline.clients import feed_bounds
from ackline.core.errors import SettingsError
from ackline.dev.netns import stale_namespaces
from ackline.runtime.health import ReadyLimits, Snapshot, readiness
from ackline.settings import load_settings
from ackline.sinks.connection import (
    Bounds,
    Database,
    describe,
    is_transient,
    link_settings,
    session_settings,
)
from ackline.sinks.errors import TransientDatabaseError, WaitStoppedError

NOW = 1_000_000.0


pytestmark = pytest.mark.usefixtures("clean_env")


@pytest.mark.parametrize(
    ("statement_s", "keepalive", "user_timeout_ms"),
    [
        (30.0, (10, 3, 3), 30_000),  # the default: an idle dead connection found in ~19 s
        (3.0, (1, 1, 3), 3_000),
        (1.0, (1, 1, 3), 1_000),
        (3_600.0, (60, 20, 3), 3_600_000),
    ],
)
def test_tcp_bounds_follow_the_statement_timeout(
    statement_s: float, keepalive: tuple[int, int, int], user_timeout_ms: int
) -> None:
    bounds = Bounds(statement_s=statement_s)
    assert bounds.keepalive == keepalive
    assert bounds.user_timeout_ms == user_timeout_ms
    assert bounds.terminate_wait_ms < statement_s * 1000  # answered before command_timeout


def test_session_settings_make_the_server_end_a_vanished_clients_session() -> None:
    settings = session_settings(Bounds(idle_in_transaction_ms=15_000), "ackline:w1")
    assert settings == {
        "idle_in_transaction_session_timeout": "15000",
        "tcp_keepalives_idle": "10",
        "tcp_keepalives_interval": "3",
        "tcp_keepalives_count": "3",
        "tcp_user_timeout": "30000",
        "client_connection_check_interval": "3000",
        "application_name": "ackline:w1",
        "plan_cache_mode": "force_custom_plan",
    }


def test_the_feeds_connections_get_the_link_bounds_and_not_the_workers_plan_cache() -> None:
    """The changefeed's connections (connector) get the keepalives, TCP user timeout,
    check interval and idle-transaction bound of the worker's, sized by the same
    settings; the worker's own session settings are those plus its name and plan cache."""
    settings = load_settings(
        db_statement_timeout_s=3, db_connect_timeout_s=2, db_idle_in_transaction_timeout_ms=5_000
    )
    bounds = feed_bounds(settings)
    assert (bounds.connect_s, bounds.idle_in_transaction_ms) == (2, 5_000)
    assert link_settings(bounds) == {
        "idle_in_transaction_session_timeout": "5000",
        "tcp_keepalives_idle": "1",
        "tcp_keepalives_interval": "1",
        "tcp_keepalives_count": "3",
        "tcp_user_timeout": "3000",
        "client_connection_check_interval": "1000",
    }
    assert session_settings(bounds, "w") == {
        **link_settings(bounds),
        "application_name": "w",
        "plan_cache_mode": "force_custom_plan",
    }


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError(),
        OSError("no route"),
        asyncpg.exceptions.QueryCanceledError("canceling statement due to statement timeout"),
        asyncpg.exceptions.LockNotAvailableError("canceling statement due to lock timeout"),
        asyncpg.exceptions.ConnectionDoesNotExistError("closed in the middle of operation"),
    ],
)
def test_timeouts_and_lost_connections_are_transient(exc: BaseException) -> None:
    assert is_transient(exc)


def test_a_server_answer_is_not_transient() -> None:
    assert not is_transient(asyncpg.exceptions.UniqueViolationError("duplicate key"))


def test_describe_gives_every_error_a_readable_line() -> None:
    assert describe(TimeoutError()) == "TimeoutError (no answer in time)"
    assert describe(ConnectionRefusedError(111, "refused")) == (
        "ConnectionRefusedError: [Errno 111] refused"
    )
    assert describe(TransientDatabaseError("cannot connect")) == "cannot connect"


def _database(down_error_after: float, downs: list[float | None]) -> Database:
    # The constructor does no I/O; nothing here connects.
    return Database(
        "postgresql://ackline_ingest@127.0.0.1:1/none",
        down_error_after=down_error_after,
        on_down=downs.append,
    )


def test_an_outage_is_a_warning_then_one_error_then_info_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="ackline.sinks.connection")
    downs: list[float | None] = []
    database = _database(0.05, downs)
    database.failed("claim", TimeoutError(), 0.1)
    assert database.down_since is not None
    time.sleep(0.06)  # the outage is now older than its bound
    database.failed("claim", TimeoutError(), 0.1)
    database.failed("claim", TimeoutError(), 0.1)  # within the bound of the last ERROR
    database.succeeded()
    levels = [r.levelname for r in caplog.records]
    assert levels == ["WARNING", "ERROR", "DEBUG", "INFO"], caplog.text
    assert "ACKLINE_DB_DOWN_ERROR_AFTER_S=0.05" in caplog.records[1].getMessage()
    assert "answers again" in caplog.records[3].getMessage()
    assert len(downs) == 2 and downs[0] is not None and downs[1] is None
    assert database.down_since is None
    database.succeeded()  # no outage, nothing to say
    assert len(caplog.records) == 4 and len(downs) == 2


def test_retrying_stops_before_any_attempt_when_stopping() -> None:
    database = _database(60, [])

    async def never(conn: asyncpg.Connection) -> None:
        raise AssertionError("no attempt once stopping")

    with pytest.raises(WaitStoppedError, match="claim: stopping"):
        asyncio.run(database.retrying("claim", never, stopping=lambda: True))


def test_a_quiet_retry_logs_nothing_and_tells_each_failure_to_its_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`ackline run`'s wait before it joins its group says itself when it waits (a WARNING
    every 30 s, ackline.commands.core): the retry loop, quiet, logs none of its lines (with
    ``down_error_after`` 0 it would log an ERROR at every failure), still counts the
    outage, and hands each failure to ``on_retry``. Nothing listens on the port."""
    from ackline.dev.ports import pick_free_port

    caplog.set_level(logging.DEBUG, logger="ackline.sinks.connection")
    downs: list[float | None] = []
    database = Database(
        f"postgresql://ackline_ingest@127.0.0.1:{pick_free_port()}/none",
        down_error_after=0.0,
        on_down=downs.append,
    )
    told: list[BaseException] = []

    async def never(conn: asyncpg.Connection) -> None:
        raise AssertionError("no connection, no operation")

    with pytest.raises(WaitStoppedError):
        asyncio.run(
            database.retrying(
                "wait", never, on_retry=told.append, stopping=lambda: len(told) >= 2, quiet=True
            )
        )
    assert len(told) == 2, told
    assert all(isinstance(exc, TransientDatabaseError) for exc in told), told
    assert caplog.records == [], caplog.text
    assert database.down_since is not None and len(downs) == 1
    database.succeeded(quiet=True)
    assert caplog.records == [] and downs[-1] is None


def test_pause_ends_early_on_a_stop_request() -> None:
    database = _database(60, [])
    asked = time.monotonic() + 0.05
    with pytest.raises(WaitStoppedError):
        asyncio.run(database.pause(3600, lambda: time.monotonic() > asked, "backoff"))


def _snap(down_since: float) -> Snapshot:
    return Snapshot(3, 0.0, NOW - 10, NOW - 100, True, NOW - 1, db_down_since=down_since)


def test_readiness_fails_when_the_workers_own_operations_fail_past_the_bound() -> None:
    limits = ReadyLimits(max_commit_age_s=60, db_check_interval_s=5, db_down_error_after_s=60)
    assert readiness(_snap(0.0), NOW, limits) == []
    assert readiness(_snap(NOW - 59), NOW, limits) == []  # a short outage: retrying
    (reason,) = readiness(_snap(NOW - 61), NOW, limits)
    assert "failing for 61s" in reason and "db_down_error_after_s=60" in reason


def test_database_bounds_settings_have_sane_defaults() -> None:
    s = load_settings()
    assert (s.db_connect_timeout_s, s.db_statement_timeout_s, s.db_commit_timeout_s) == (
        10.0,
        30.0,
        30.0,
    )
    assert s.db_down_error_after_s == 60.0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("db_statement_timeout_s", "0"),
        ("db_statement_timeout_s", "0.5"),
        ("db_commit_timeout_s", "-1"),
        ("db_connect_timeout_s", "0"),
        ("db_down_error_after_s", "soon"),
    ],
)
def test_a_bad_database_bound_names_its_setting(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(**{name: value})
    assert info.value.setting == f"ACKLINE_{name.upper()}"


def test_stale_namespaces_are_only_ours_of_this_tag_whose_process_is_gone() -> None:
    names = [
        "ackline-vanish-100-s",
        "ackline-vanish-100-c",
        "ackline-vanish-200-s",  # its process lives
        "ackline-chaos-100-s",  # another tag
        "somebody-else-100-s",
        "ackline-vanish-x-s",
    ]
    alive = {200}.__contains__
    assert stale_namespaces("vanish", names, alive) == [
        "ackline-vanish-100-s",
        "ackline-vanish-100-c",
    ]
