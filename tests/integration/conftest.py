"""Real services for integration tests: the local stack, a fresh database per test.

Nothing here skips: when Kafka or PostgreSQL cannot start, the fixture raises and every
test that needs it fails with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from ackline.dev import stack
from ackline.sinks.admin.migrate import migrate
from tests.integration.chaos_runs import (  # noqa: F401 (fixtures)
    _chaos_runs_start_with_the_session,
    chaos_runs,
    is_chaos_short,
    selected_runtimes,
)
from tests.integration.harness import (
    LIVE_WORKERS,
    TEMPLATE_DB,
    Services,
    dsn_for,
    fresh_database,
    fresh_topic,
)

ROOT = Path(__file__).resolve().parents[2]


def _all_running(state_dir: Path) -> bool:
    return all(s["running"] for s in stack.status(state_dir).values())


async def _make_template(admin_dsn: str) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{TEMPLATE_DB}"')
    finally:
        await conn.close()
    conn = await asyncpg.connect(dsn_for(admin_dsn, TEMPLATE_DB))
    try:
        await migrate(conn)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    """The stack named by ACKLINE_* variables, or the project's local stack.

    A local stack this session started is stopped at the end; one that was already
    running (a developer's `make up`) is left running.
    """
    state_dir = _state_dir()
    info = stack.resolve(state_dir) if _env_stack() else None
    started = False
    if info is None:
        started = not _all_running(state_dir)
        info = stack.up(state_dir)
    asyncio.run(_make_template(info.database_url))
    try:
        yield Services(info.kafka_bootstrap, info.database_url, state_dir)
    finally:
        if started:
            stack.down(state_dir)


def _state_dir() -> Path:
    """The project's local stack; under pytest-xdist (`make test`), a stack of each worker's
    own (``.ackline/xdist-gw0``, ...), so that a test that freezes, restarts or fills its
    broker or database never meets another worker's tests."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return ROOT / ".ackline" if worker is None else ROOT / ".ackline" / f"xdist-{worker}"


def _env_stack() -> bool:
    return bool(
        os.environ.get("ACKLINE_KAFKA_BOOTSTRAP") and os.environ.get("ACKLINE_DATABASE_URL")
    )


_ONE_AT_A_TIME = {
    # machine-wide resources: network namespaces with fixed addresses, tmpfs mounts, a
    # PostgreSQL pair and a broker cluster of their own
    "test_vanished_database": "machine",
    "test_infra_faults": "machine",
    "test_dev_stack": "machine",
    "test_toxiproxy": "machine",
    # both runtimes' runs start together (one session fixture): one worker runs both, and
    # under xdist they start with the group's first test and are judged at its end, so the
    # worker runs the group's other tests while they run (their own group, it waited
    # ~150 s on them: the suite's longest wait)
    "test_chaos_short": "machine",
}
CHAOS_GROUP = _ONE_AT_A_TIME["test_chaos_short"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``--dist loadgroup``), the tests of a module that uses a
    machine-wide resource go to one worker, one after another. The short chaos tests go
    last: in one process their runs start with the first integration test, under xdist
    with the first test of their group, and overlap everything run meanwhile
    (chaos_runs).

    First (tryfirst): when this directory is named on the command line, this conftest is
    registered before xdist's worker plugin and its hook ran after the worker had read
    the ``xdist_group`` marks (under `make test` it already ran first). Every grouped
    test checks that it was grouped (:func:`_grouped_as_marked`)."""
    items.sort(key=is_chaos_short)  # stable: the others keep their order
    for item in items:
        group = _ONE_AT_A_TIME.get(item.module.__name__.rsplit(".", 1)[-1])  # type: ignore[attr-defined]
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _chaos_runs_start_with_their_group(request: pytest.FixtureRequest) -> None:
    """Under xdist, start the short chaos runs (a session fixture of the worker that runs
    their group) with the group's first test; their tests come last in it."""
    mark = request.node.get_closest_marker("xdist_group")
    if "PYTEST_XDIST_WORKER" not in os.environ or mark is None or not mark.args:
        return
    grouped = request.node.nodeid.endswith(f"@{CHAOS_GROUP}")  # else _grouped_as_marked fails
    if mark.args[0] == CHAOS_GROUP and grouped and selected_runtimes(request.session.items):
        request.getfixturevalue("chaos_runs")


@pytest.fixture(autouse=True)
def _grouped_as_marked(request: pytest.FixtureRequest) -> None:
    """A test given an ``xdist_group`` must have been scheduled with its group: xdist marks
    that in the test's id (``...@group``). The groups silently did nothing: pytest 9.2
    ignores the id xdist rewrites (pytest-xdist issue 1386; pytest is held below 9.2 in
    pyproject.toml), and with ``tests/integration`` named on the command line the marks
    also came after xdist had read them (see pytest_collection_modifyitems). Two workers
    then ran the two short chaos tests, and each started both runtimes' runs: four chaos
    stacks at once beside the suite."""
    mark = request.node.get_closest_marker("xdist_group")
    if not getattr(request.config.option, "loadgroup", False) or mark is None:
        return
    group = str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    if not request.node.nodeid.endswith(f"@{group}"):
        pytest.fail(
            f"pytest-xdist did not schedule {request.node.nodeid} with its group {group!r}: "
            "tests that share a machine-wide resource may be running at once"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing test shows the end of each live worker's log: CI keeps no temp dirs."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when != "call" or not report.failed:
        return
    for worker in LIVE_WORKERS:
        with contextlib.suppress(OSError):
            tail = worker.log().splitlines()[-80:]
            report.sections.append((f"worker {worker.name} log (last 80 lines)", "\n".join(tail)))


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test() -> Iterator[None]:
    """A failing test must not leave `ackline run` processes behind."""
    yield
    while LIVE_WORKERS:
        LIVE_WORKERS.pop().discard()


@pytest.fixture
def dsn(services: Services) -> Iterator[str]:
    """A fresh, migrated database for one test (a copy of the migrated template)."""
    with fresh_database(services) as url:
        yield url


@pytest.fixture
def topic(services: Services) -> Iterator[str]:
    """A fresh 3-partition topic for one test."""
    with fresh_topic(services) as name:
        yield name
