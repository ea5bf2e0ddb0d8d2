"""SIGTERM stops every process kind within its grace period (issue 18: under Docker or
Kubernetes the grace period runs out and the process is killed mid-whatever).

Each test sends a real SIGTERM to a real process at a moment where a naive stop would
hang or leave a mess: a changefeed read blocked on a lock (tail, dispatch), a capture
waiting on an open transaction (its partial file must go), a paced replay, and a chaos
run with its workers (none may outlive the harness). ``BOUND_S`` is a liveness bound,
not a timing claim: a process that has not ended by then does not honour SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from confluent_kafka import Producer

from ackline.dev.netns import Forwarder
from ackline.streams.admin import delete_topic, ensure_topic, partition_count
from ackline.streams.errors import TopicError
from ackline.streams.producer import ActivityProducer, prepare
from tests.integration.harness import Services, Worker, db, wait_until
from tests.integration.producing import ingested, send_in_one_transaction, unit_of_work
from tests.integration.test_aio_producer import frozen_broker
from tests.integration.windows import watermarks

SHUTDOWN_WAIT_S = 2
BOUND_S = 60


def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACKLINE_")}
    env.update(
        {"ACKLINE_LOG_FORMAT": "text", "ACKLINE_SHUTDOWN_WAIT_S": str(SHUTDOWN_WAIT_S), **values}
    )
    return env


def _spawn(
    argv: list[str], env: dict[str, str], log: Path, out: Path | None = None
) -> subprocess.Popen[bytes]:
    """``ackline argv``, its stderr into ``log``, its stdout too unless ``out`` is given."""
    with log.open("ab") as handle, contextlib.ExitStack() as files:
        target = handle if out is None else files.enter_context(out.open("ab"))
        return subprocess.Popen(
            [sys.executable, "-m", "ackline", *argv],
            env=env,
            stdout=target,
            stderr=subprocess.STDOUT if out is None else handle,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes], log: Path) -> int:
    """SIGTERM, then the exit status; a process still running after BOUND_S fails."""
    proc.send_signal(signal.SIGTERM)
    return _exited(proc, log, BOUND_S, f"still running {BOUND_S}s after SIGTERM")


def _exited(proc: subprocess.Popen[bytes], log: Path, timeout: float, what: str) -> int:
    """The exit status within ``timeout`` s; else the process is killed and ``what``
    fails the test, with the end of its log."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
        raise AssertionError(f"{what}:\n{log.read_text(errors='replace')[-3000:]}") from None


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Kill and reap ``proc`` if it still runs (a test's ``finally``)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def _stop_when(
    proc: subprocess.Popen[bytes], log: Path, ready: Callable[[], bool], timeout: float, what: str
) -> int:
    """Wait until ``ready()`` (at most ``timeout`` s), then :func:`_stop`; a process still
    running after that, or after a failed wait, is killed and reaped."""
    try:
        wait_until(ready, timeout, what)
        return _stop(proc, log)
    finally:
        _reap(proc)


@contextlib.contextmanager
def _locked_feed(dsn: str) -> Iterator[subprocess.Popen[bytes]]:
    """Another session holds ACCESS EXCLUSIVE on ingest_batches: every feed read waits."""
    script = (
        "import asyncio, asyncpg, sys\n"
        "async def main():\n"
        "    conn = await asyncpg.connect(sys.argv[1])\n"
        "    await conn.execute('BEGIN; LOCK TABLE ingest_batches IN ACCESS EXCLUSIVE MODE')\n"
        "    print('locked', flush=True)\n"
        "    await asyncio.sleep(600)\n"
        "asyncio.run(main())\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, dsn], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"locked"
        yield holder
    finally:
        holder.kill()
        holder.wait(30)
        if holder.stdout is not None:
            holder.stdout.close()


def _waiting_on_lock(dsn: str, application: str) -> bool:
    rows = db(
        dsn,
        "SELECT count(*) AS n FROM pg_stat_activity "
        "WHERE application_name LIKE $1 AND wait_event_type = 'Lock'",
        application + "%",
    )
    return int(rows[0]["n"]) > 0


@pytest.mark.parametrize(
    ("argv", "application"),
    [
        (["tail", "--from-start", "--follow"], "ackline-tail:"),
        (["dispatch", "--reader", "sigterm"], "ackline-dispatch:"),
    ],
    ids=["tail", "dispatch"],
)
def test_a_feed_reader_blocked_on_a_lock_stops(
    services: Services, dsn: str, tmp_path: Path, argv: list[str], application: str
) -> None:
    log = tmp_path / "reader.log"
    with _locked_feed(dsn):
        proc = _spawn(argv, _env(ACKLINE_DATABASE_URL=dsn), log)
        status = _stop_when(
            proc, log, lambda: _waiting_on_lock(dsn, application), 60, "the read to block"
        )
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert status == 0, text[-3000:]
    assert "cancelling" in text


@pytest.mark.parametrize(
    "argv",
    [
        ["tail", "--from-start", "--limit", "1"],
        ["dispatch", "--reader", "twice", "--once"],
        ["process", "runs", "--until-caught-up"],
    ],
    ids=["tail", "dispatch", "process"],
)
def test_a_second_sigint_cancels_a_blocked_feed_read_at_once(
    services: Services, dsn: str, tmp_path: Path, argv: list[str]
) -> None:
    """An operator's Ctrl-C on `tail`, `dispatch` or `process` blocked on a lock, then a
    second one: the second changed nothing, and the read was cancelled only when the
    grace period (ACKLINE_SHUTDOWN_WAIT_S, 30 s by default) ran out (30.1 s in the probe
    of `tail`; `process` still did after tail and dispatch were mended). A second SIGINT
    cancels it at once; a SIGTERM in between does not (docs/design.md: supervisors may
    send it more than once)."""
    log = tmp_path / "reader.log"
    env = _env(ACKLINE_DATABASE_URL=dsn, ACKLINE_SHUTDOWN_WAIT_S="60", ACKLINE_METRICS_PORT="0")
    with _locked_feed(dsn):
        proc = _spawn(argv, env, log)
        try:
            wait_until(lambda: _someone_waits_on_a_lock(dsn), 60, "the read to block")
            proc.send_signal(signal.SIGINT)
            time.sleep(1.0)
            proc.send_signal(signal.SIGTERM)  # the stop goes on
            time.sleep(1.0)
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            began = time.monotonic()
            proc.send_signal(signal.SIGINT)
            status = _exited(proc, log, 10, "still running 10 s after a second SIGINT")
        finally:
            _reap(proc)
    text = log.read_text(errors="replace")
    assert time.monotonic() - began < 10
    assert "Traceback" not in text, text[-3000:]
    assert status == 130, text[-3000:]
    assert "a second SIGINT: cancelling" in text, text[-3000:]


def _wchan(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "wchan").read_text()
    except OSError:
        return ""


def test_capture_stuck_writing_stops_and_removes_its_partial_file(
    services: Services, tmp_path: Path
) -> None:
    """The capture's partial file is a FIFO nobody reads (a disk or network mount that
    stopped draining): the capture blocks in a write. SIGTERM must still end it, with
    its partial file removed."""
    topic = f"t-{uuid.uuid4().hex[:12]}"
    ensure_topic(services.bootstrap, topic, partitions=1)
    producer = Producer({"bootstrap.servers": services.bootstrap})
    for _ in range(3000):
        producer.produce(topic, value=os.urandom(1000))  # incompressible: 3 MB to write
    producer.flush(30)
    out = tmp_path / "range.ackcap"
    partial = tmp_path / "range.ackcap.partial"
    os.mkfifo(partial)
    reader = os.open(partial, os.O_RDONLY | os.O_NONBLOCK)  # open, never read
    log = tmp_path / "capture.log"
    argv = ["capture", topic, str(out), "--quiet"]
    proc = _spawn(argv, _env(ACKLINE_KAFKA_BOOTSTRAP=services.bootstrap), log)
    try:
        status = _stop_when(
            proc, log, lambda: "pipe" in _wchan(proc.pid), 60, "the capture to block writing"
        )
    finally:
        os.close(reader)
        with contextlib.suppress(TopicError):
            delete_topic(services.bootstrap, topic)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert status == 143, text[-3000:]
    assert not partial.exists() and not out.exists()


def _capture_file(services: Services, tmp_path: Path, records: int) -> Path:
    source = f"t-{uuid.uuid4().hex[:12]}"
    ensure_topic(services.bootstrap, source, partitions=2)
    producer = Producer({"bootstrap.servers": services.bootstrap})
    for i in range(records):
        producer.produce(source, key=str(i).encode(), value=b"v" * 100)
    producer.flush(30)
    path = tmp_path / "source.ackcap"
    proc = subprocess.run(
        [sys.executable, "-m", "ackline", "capture", source, str(path), "--quiet"],
        env=_env(ACKLINE_KAFKA_BOOTSTRAP=services.bootstrap),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    delete_topic(services.bootstrap, source)
    return path


def test_a_paced_replay_stops(services: Services, tmp_path: Path) -> None:
    source = _capture_file(services, tmp_path, 200)
    target = f"t-{uuid.uuid4().hex[:12]}"
    ensure_topic(services.bootstrap, target, partitions=2)
    log = tmp_path / "replay.log"
    argv = ["replay", str(source), "--to", target, "--pace", "5/s", "--quiet"]
    proc = _spawn(argv, _env(ACKLINE_KAFKA_BOOTSTRAP=services.bootstrap), log)
    try:
        status = _stop_when(  # a few records out, some 40 s of pacing left
            proc,
            log,
            lambda: (
                sum(high for _, high in watermarks(services.bootstrap, target, 2).values()) >= 3
            ),
            30,
            "the replay's first records",
        )
    finally:
        with contextlib.suppress(TopicError):
            delete_topic(services.bootstrap, target)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert status == 143, text[-3000:]
    assert "stopped" in text and "records acknowledged" in text


def test_replay_creates_its_target_topic_when_asked(services: Services, tmp_path: Path) -> None:
    source = _capture_file(services, tmp_path, 20)
    target = f"t-{uuid.uuid4().hex[:12]}"
    base = [sys.executable, "-m", "ackline", "replay", str(source), "--to", target, "--quiet"]
    env = _env(ACKLINE_KAFKA_BOOTSTRAP=services.bootstrap)
    refused = subprocess.run(
        base, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert refused.returncode != 0 and "--create-topic" in refused.stderr, refused.stderr
    made = subprocess.run(
        [*base, "--create-topic"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    try:
        assert made.returncode == 0, made.stderr
        assert partition_count(services.bootstrap, target) == 2
    finally:
        with contextlib.suppress(TopicError):
            delete_topic(services.bootstrap, target)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == pid:
            found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def _forget_chaos_runs(services: Services, seed: int) -> None:
    """A stopped chaos run keeps its database, topics and directory (as a failed one
    does): drop them, the shared stack is not the chaos stack."""
    for run in (services.state_dir / "runs").glob(f"chaos-{seed}-*"):
        for topic in (run.name, f"{run.name}.dlq"):
            with contextlib.suppress(TopicError):
                delete_topic(services.bootstrap, topic)
        shutil.rmtree(run, ignore_errors=True)
    for row in db(
        services.database_url,
        "SELECT datname FROM pg_database WHERE datname LIKE $1",
        f"chaos_{seed}_%",
    ):
        db(services.database_url, f'DROP DATABASE IF EXISTS "{row["datname"]}" WITH (FORCE)')


def test_a_stopped_chaos_run_leaves_no_worker_behind(services: Services, tmp_path: Path) -> None:
    """SIGTERM to `ackline chaos` once its workers run: it stops them (SIGTERM, then
    SIGKILL after their shutdown wait) and its producer child before it exits."""
    log = tmp_path / "chaos.log"
    argv = [
        "chaos", "--events", "20000", "--workers", "2", "--partitions", "3", "--kills", "0",
        "--stops", "0", "--broker-restarts", "0", "--pg-restarts", "0", "--commit-faults", "0",
        "--produce-rate", "500", "--seed", "7", "--state-dir", str(services.state_dir), "--keep",
    ]  # fmt: skip
    proc = _spawn(argv, _env(), log)
    children: set[int] = set()
    left: list[int] = []
    try:

        def workers_running() -> bool:
            if proc.poll() is not None:
                raise AssertionError(log.read_text(errors="replace")[-3000:])
            kids = _children(proc.pid)
            children.update(kids)
            return sum("ackline run" in _cmdline(k) for k in kids) >= 2

        wait_until(workers_running, 300, "two chaos workers")
        status = _stop(proc, log)
        left = [pid for pid in children if _alive(pid)]  # before the cleanup below
    finally:
        for pid in children | set(_children(proc.pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        _forget_chaos_runs(services, seed=7)
    text = log.read_text(errors="replace")
    assert left == [], f"still running after the harness exited: {left}\n{text[-2000:]}"
    assert "Traceback" not in text, text[-3000:]
    assert status == 143, text[-3000:]


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_a_worker_claiming_through_a_database_outage_stops(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str
) -> None:
    """The operator's report: with PostgreSQL unreachable, `ackline run` retried its claim
    (in the assign callback, on the consumer thread) for 15 minutes and ignored SIGTERM
    and SIGINT; only SIGKILL ended it. The claim retry now gives up at a stop request.
    The database answers the worker's check before it joins the group (one connection)
    and then drops every new connection at once, so the claim is what retries."""
    parts = urlsplit(dsn)
    pg_port = parts.port or 5432
    log = tmp_path / f"run-{runtime}.log"
    with Forwarder(
        ("127.0.0.1", 0), (parts.hostname or "127.0.0.1", pg_port), max_connections=1
    ) as gate:
        netloc = parts.netloc.replace(f":{pg_port}", f":{gate.port}")
        env = _env(
            ACKLINE_KAFKA_BOOTSTRAP=services.bootstrap,
            ACKLINE_DATABASE_URL=urlunsplit(parts._replace(netloc=netloc)),
            ACKLINE_TOPIC=topic,
            ACKLINE_GROUP_ID=f"g-{topic}",
            ACKLINE_DLQ_TOPIC=f"{topic}.dlq",
            ACKLINE_METRICS_PORT="0",
            ACKLINE_RUNTIME=runtime,
        )
        proc = _spawn(["run"], env, log)
        status = _stop_when(
            proc,
            log,
            lambda: (
                "claim" in log.read_text(errors="replace")
                and "retrying" in log.read_text(errors="replace")
            ),
            90,
            "the worker to retry its claim against the closed port",
        )
    # the faust runtime stops with faust's own status; either way it stopped, not killed
    assert status >= 0, log.read_text(errors="replace")[-3000:]


def test_a_chaos_probe_cut_mid_query_by_a_stop_drops_its_connection(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """A stop request (SIGTERM raises Terminated in the main thread) that lands while the
    chaos harness's probe waits on PostgreSQL leaves that connection mid-protocol. Reused,
    it failed with "got result for unknown protocol state", and the abandoned query's task
    was logged as "Task exception was never retrieved" with a traceback, on a run the
    operator had stopped cleanly (tests above: no traceback after a stop)."""
    import gc
    import logging

    from ackline.load.chaos.probe import Pg

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    pg = Pg(services.database_url)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        assert pg.fetch("SELECT 1 AS one")[0]["one"] == 1
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with caplog.at_level(logging.ERROR, logger="asyncio"), pytest.raises(KeyboardInterrupt):
            pg.fetch("SELECT pg_sleep(3)")
        signal.setitimer(signal.ITIMER_REAL, 0)
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            assert pg.fetch("SELECT 2 AS two")[0]["two"] == 2  # a fresh connection
            pg.close()
            gc.collect()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text


def test_a_sigterm_handled_inside_an_asyncpg_write_still_stops_the_chaos_probe(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM handled just after asyncpg wrote a query raised Terminated inside its
    protocol, whose ``finally: return await waiter`` dropped it: the probe's fetch
    returned its rows and the harness, deaf from then on (the handler ignores the SIGTERMs
    after the first), ran a stopped chaos run to its verdict and exit 0. The SIGTERM is
    delivered for real, at that moment, by the transport's write."""
    from asyncio import selector_events

    from ackline.core.errors import Terminated
    from ackline.core.signals import terminate_as_exit
    from ackline.load.chaos.probe import Pg

    sql = "SELECT 1 AS one WHERE false"
    write = selector_events._SelectorSocketTransport.write

    def write_then_sigterm(self: selector_events._SelectorSocketTransport, data: bytes) -> None:
        write(self, data)
        signal.raise_signal(signal.SIGTERM)

    pg = Pg(services.database_url)
    try:
        assert pg.fetch(sql) == []  # connected, the statement prepared and cached
        with monkeypatch.context() as patch:
            patch.setattr(selector_events._SelectorSocketTransport, "write", write_then_sigterm)
            with terminate_as_exit(), pytest.raises(Terminated):
                pg.fetch(sql)
        assert pg.fetch("SELECT 2 AS two")[0]["two"] == 2  # a fresh connection
    finally:
        pg.close()


def test_a_stopped_demo_stops_instead_of_verifying_half_an_ingest(
    services: Services, dsn: str, tmp_path: Path
) -> None:
    """SIGTERM while the demo's worker ingests: the worker stops cleanly and so does the
    demo, exit 143, its cleanup run. It went on to verify half an ingest (exit 1), and the
    worker's loop left SIGTERM's default action behind (a second SIGTERM killed it before
    its ``finally``, which stops the local stack)."""
    log = tmp_path / "demo.log"
    env = _env(
        ACKLINE_KAFKA_BOOTSTRAP=services.bootstrap,
        ACKLINE_DATABASE_URL=dsn,
        ACKLINE_STATE_DIR=str(tmp_path / "state"),
    )
    proc = _spawn(["demo", "--events", "200000"], env, log)
    status = _stop_when(
        proc,
        log,
        lambda: proc.poll() is not None or "== ingesting" in log.read_text(errors="replace"),
        300,
        "the demo's ingest",
    )
    text = log.read_text(errors="replace")
    assert "== verifying" not in text, text[-3000:]
    assert status == 143, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


@pytest.mark.parametrize(
    "argv",
    [
        ["migrate"],
        ["conflicts", "list"],
        ["retention", "show"],
        ["roles", "show"],
        ["processors", "status"],
        ["tail", "--reader", "sigterm-reader", "--follow"],
        ["process", "runs", "--from-now"],
    ],
    ids="-".join,
)
def test_a_sigterm_asyncpg_dropped_still_stops_a_one_shot_command(
    services: Services, dsn: str, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chaos probe's drop (above) in the CLI's own one-shot commands: a SIGTERM handled
    just after asyncpg wrote a command's first statement was dropped there, and the command
    finished its work and exited 0 (migrate), or the next read crashed the interpreter with a
    segmentation fault (the others, exit 139); a follow would have followed on, deaf. Now
    their async steps defer a stop past the loop (run_stoppable), and the command stops with
    143 (0 for `process`, a service). The SIGTERM is real, delivered by the transport's
    write of the first Parse or Query message. A second SIGTERM after ``BOUND_S`` ends a
    command that went on."""
    from asyncio import selector_events

    from ackline.cli import EXIT_TERMINATED, SERVICES, main

    write = selector_events._SelectorSocketTransport.write
    sent: list[bool] = []

    def write_then_sigterm(self: selector_events._SelectorSocketTransport, data: bytes) -> None:
        write(self, data)
        if not sent and bytes(data[:1]) in (b"P", b"Q"):
            sent.append(True)
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setenv("ACKLINE_DATABASE_URL", dsn)
    monkeypatch.setenv("ACKLINE_LOG_FORMAT", "text")
    monkeypatch.setattr(selector_events._SelectorSocketTransport, "write", write_then_sigterm)
    before = signal.getsignal(signal.SIGTERM)
    bound = threading.Timer(BOUND_S, signal.raise_signal, (signal.SIGTERM,))
    bound.start()
    try:
        status = main(argv)
    finally:
        bound.cancel()
    assert sent, "no statement was written"
    # a service (`process`) stopped before it took the signals stops cleanly, as it does after
    assert status == (0 if argv[0] in SERVICES else EXIT_TERMINATED)
    assert signal.getsignal(signal.SIGTERM) == before  # the CLI's block put it back


def _worker_with_a_frozen_broker(
    services: Services, dsn: str, topic: str, tmp_path: Path, name: str, runtime: str = "confluent"
) -> tuple[subprocess.Popen[bytes], Path]:
    """A worker that has ingested a transaction of records (the broker is frozen by the
    caller: SIGSTOP, a host that vanished without closing its sockets)."""
    log = tmp_path / f"{name}.log"
    env = _env(
        ACKLINE_KAFKA_BOOTSTRAP=services.bootstrap,
        ACKLINE_DATABASE_URL=dsn,
        ACKLINE_TOPIC=topic,
        ACKLINE_GROUP_ID=f"g-{topic}",
        ACKLINE_DLQ_TOPIC=f"{topic}.dlq",
        ACKLINE_METRICS_PORT="0",
        ACKLINE_RUNTIME=runtime,
    )
    sent = [prepare(e) for e in unit_of_work(f"r{uuid.uuid4().hex[:6]}", "agent-s", 20)]
    send_in_one_transaction(services.bootstrap, topic, sent)
    proc = _spawn(["run"], env, log)
    try:
        # offsets to commit at the close: the commit is what waited for the broker
        wait_until(lambda: ingested(dsn).rows == len(sent), 90, "the records ingested")
    except BaseException:
        proc.kill()
        proc.wait(30)
        raise
    return proc, log


def _broker_back(services: Services, topic: str) -> None:
    """Wait until the broker, thawed, commits a transaction again: a freeze longer than
    KRaft's broker session fences it, and it takes a while to come back (a fresh-clone run
    saw the next topic deletion time out)."""

    def commits() -> bool:
        producer = ActivityProducer(services.bootstrap, topic, f"svc-{uuid.uuid4().hex[:8]}")
        try:
            producer.start()
            producer.send_transaction(
                [prepare(e) for e in unit_of_work("back", "agent-s", 1)], timeout=10
            )
        except Exception:
            return False
        finally:
            producer.close()
        return True

    wait_until(commits, 180, "the thawed broker to commit a transaction", interval=1)


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_a_worker_whose_broker_vanished_stops_at_sigterm(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str
) -> None:
    """From a hostile review: with the broker unreachable, librdkafka's consumer close
    (its LeaveGroup and offset commit) waited for the broker with no bound, and the
    worker stayed deaf to SIGTERM until the broker came back (670 s there); so did faust's
    graceful stop. The stop is now bounded by ACKLINE_SHUTDOWN_WAIT_S + 20 s on both."""
    proc, log = _worker_with_a_frozen_broker(services, dsn, topic, tmp_path, "vanished", runtime)
    try:
        with frozen_broker(services):
            time.sleep(1)
            proc.send_signal(signal.SIGTERM)
            bound = SHUTDOWN_WAIT_S + 30
            status = _exited(proc, log, bound, f"still running {bound} s after SIGTERM")
    finally:
        _reap(proc)
    _broker_back(services, topic)
    text = log.read_text(errors="replace")
    assert status == 1, text[-3000:]  # it could not leave its group: not a clean stop
    said = "did not close" if runtime == "confluent" else "did not stop within"
    assert said in text, text[-3000:]


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_a_second_sigint_ends_a_stopping_worker_at_once(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str
) -> None:
    """An operator who presses Ctrl-C twice means now: the second signal was ignored
    while the first stop waited (the broker away: minutes). The database decides what
    committed, so the worker exits at once (130). A second SIGTERM is not that: the
    stop it began goes on (supervisors may repeat it; the stop is bounded)."""
    proc, log = _worker_with_a_frozen_broker(services, dsn, topic, tmp_path, "twice", runtime)
    try:
        with frozen_broker(services):
            time.sleep(1)
            proc.send_signal(signal.SIGINT)
            time.sleep(1)
            proc.send_signal(signal.SIGTERM)  # goes on stopping
            time.sleep(1)
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            proc.send_signal(signal.SIGINT)
            status = _exited(proc, log, 10, "a second SIGINT did not end it")
    finally:
        _reap(proc)
    _broker_back(services, topic)
    assert status == 128 + signal.SIGINT, log.read_text(errors="replace")[-3000:]


def _someone_waits_on_a_lock(dsn: str) -> bool:
    """A session of this test's database waits on a lock (the feed's, held by
    :func:`_locked_feed`): whatever its application name."""
    rows = db(
        dsn,
        "SELECT count(*) AS n FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    return int(rows[0]["n"]) > 0


@pytest.mark.parametrize(
    ("argv", "sig", "summary"),
    [
        (["dispatch", "--reader", "cron", "--once"], signal.SIGTERM, True),
        (["dispatch", "--reader", "cron", "--once"], signal.SIGINT, True),
        (["process", "runs", "--until-caught-up"], signal.SIGTERM, True),
        (["process", "runs", "--until-caught-up"], signal.SIGINT, True),
        # before its loop: the start cursor's read of the feed head waits on the lock
        (["process", "runs", "--until-caught-up", "--from-now"], signal.SIGTERM, False),
        (["tail", "--from-start"], signal.SIGTERM, False),
    ],
    ids=[
        "dispatch-once-TERM",
        "dispatch-once-INT",
        "process-TERM",
        "process-INT",
        "process-start-TERM",
        "tail-TERM",
    ],
)
def test_a_run_to_catch_up_stopped_before_it_did_does_not_exit_0(
    services: Services,
    dsn: str,
    tmp_path: Path,
    argv: list[str],
    sig: signal.Signals,
    summary: bool,
) -> None:
    """A cron job's `dispatch --once` or `process --until-caught-up` stopped before it had
    caught up exited 0, as if it had, and `dispatch --once` then printed no summary at
    all (its read was cancelled): a script could not tell the two apart. Now a stop that
    cuts a run that ends by itself exits 128 + the signal, as `tail` does, and the
    summary line is still printed when there is one, saying what stopped it."""
    out, log = tmp_path / "out", tmp_path / "err"
    with _locked_feed(dsn):
        proc = _spawn(argv, _env(ACKLINE_DATABASE_URL=dsn, ACKLINE_METRICS_PORT="0"), log, out)
        try:
            wait_until(lambda: _someone_waits_on_a_lock(dsn), 60, "the read to block")
            proc.send_signal(sig)
            status = _exited(proc, log, BOUND_S, f"still running {BOUND_S}s after {sig.name}")
        finally:
            _reap(proc)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert status == 128 + sig, text[-3000:]
    lines = out.read_text().splitlines()
    if not summary:
        assert not any(line.startswith("{") for line in lines), lines
        return
    assert lines, f"no summary line:\n{text[-3000:]}"
    last = json.loads(lines[-1])
    assert last["stopped"] == sig.name, last


@pytest.mark.parametrize(
    "argv",
    [
        ["dispatch", "--reader", "cron", "--once"],
        ["process", "runs", "--until-caught-up"],
        ["tail", "--from-start"],
    ],
    ids=["dispatch-once", "process", "tail"],
)
def test_a_stop_during_the_read_that_catches_up_is_not_a_cut_run(
    services: Services, dsn: str, tmp_path: Path, argv: list[str]
) -> None:
    """SIGTERM lands while the read that finds the feed caught up waits on a lock; the
    lock goes within the shutdown wait, and the read answers: nothing left. The run did
    what it was for, yet it exited 143 and its summary said "stopped" (the outcome was
    taken from the stop flag, not from why the loop ended), so a script took a finished
    run for a cut one. It exits 0, its summary's "stopped" null."""
    out, log = tmp_path / "out", tmp_path / "err"
    env = _env(ACKLINE_DATABASE_URL=dsn, ACKLINE_METRICS_PORT="0", ACKLINE_SHUTDOWN_WAIT_S="30")
    with _locked_feed(dsn):
        proc = _spawn(argv, env, log, out)
        try:
            wait_until(lambda: _someone_waits_on_a_lock(dsn), 60, "the read to block")
            proc.send_signal(signal.SIGTERM)
            time.sleep(1.0)
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        except BaseException:
            _reap(proc)
            raise
    try:  # the lock is gone: the read answers, caught up
        status = _exited(proc, log, BOUND_S, "still running after the lock went")
    finally:
        _reap(proc)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert status == 0, text[-3000:]
    lines = [line for line in out.read_text().splitlines() if line.startswith("{")]
    if argv[0] != "tail":
        assert lines, f"no summary line:\n{text[-3000:]}"
        assert json.loads(lines[-1])["stopped"] is None, lines[-1]


def _signalled_after_summary(
    argv: list[str],
    dsn: str,
    signal_it: Callable[[subprocess.Popen[str]], None],
    stderr: int = subprocess.PIPE,
) -> tuple[dict[str, Any], int, str]:
    """Run `ackline *argv` against ``dsn``, read its summary line, then ``signal_it``;
    the summary, the exit status and what it wrote on stderr (none with ``stderr``
    DEVNULL: for a signal storm, whose log lines would fill an unread pipe and hold the
    process)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ackline", *argv],
        env=_env(ACKLINE_DATABASE_URL=dsn, ACKLINE_METRICS_PORT="0"),
        stdout=subprocess.PIPE,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        summary = json.loads(proc.stdout.readline())
        signal_it(proc)
        _, err = proc.communicate(timeout=BOUND_S)
    finally:
        _reap(proc)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return summary, proc.returncode, err or ""


@pytest.mark.parametrize(
    "argv",
    [["dispatch", "--reader", "cron", "--once"], ["process", "runs", "--until-caught-up"]],
    ids=["dispatch-once", "process"],
)
def test_a_stop_after_the_summary_leaves_the_status_alone(
    services: Services, dsn: str, argv: list[str]
) -> None:
    """A SIGTERM in the moments after a caught-up run printed its summary ("stopped":
    null) made it exit 143, or die of the signal while the interpreter exited (-15, 143 to
    a shell): a cron job took a finished run for a cut one (an operator's probe, 4 of 4
    runs). The work's status stands once it is decided."""
    statuses = []
    for delay in (0.0, 0.01, 0.03):

        def sigterm_after(proc: subprocess.Popen[str], delay: float = delay) -> None:
            time.sleep(delay)
            proc.send_signal(signal.SIGTERM)

        summary, status, err = _signalled_after_summary(argv, dsn, sigterm_after)
        assert summary["stopped"] is None, summary
        assert "Traceback" not in err, err[-3000:]
        statuses.append(status)
    assert statuses == [0, 0, 0], statuses


def test_sigterms_again_and_again_after_the_summary_leave_the_status_alone(
    services: Services, dsn: str
) -> None:
    """A supervisor that sends SIGTERM more than once (docs/design.md) while a caught-up
    run winds down: one landed while the command put back the handlers it found, after
    the loop's removal had set SIGTERM's default action, and killed it (-15, 143 to a
    shell; 5 of 75 runs of `dispatch --once` in a probe) though its summary said it had
    finished. Each run here is sent SIGTERM every 0.3 ms from its summary line on (50
    runs: this failed on the code before the mend; `process` shares the same block).
    The DSN names its host, as deployments do: asyncio resolves it on an executor thread,
    and a signal the main thread blocks goes to that thread instead, so blocking SIGTERM
    while the handlers changed did not close the gap; putting the previous handler back in
    one step does."""
    argv = ["dispatch", "--reader", "cron", "--once"]
    named = dsn.replace("@127.0.0.1:", "@localhost:")
    assert named != dsn, dsn
    statuses = []

    def sigterms_until_it_exits(proc: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + BOUND_S
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            time.sleep(0.0003)

    for _ in range(50):
        summary, status, _ = _signalled_after_summary(
            argv, named, sigterms_until_it_exits, stderr=subprocess.DEVNULL
        )
        assert summary["stopped"] is None, summary
        statuses.append(status)
    assert statuses == [0] * len(statuses), statuses


def test_until_drained_ends_soon_after_its_last_commit_sigterm_or_not(
    services: Services, dsn: str, tmp_path: Path
) -> None:
    """`run --until-drained` checks, at every idle turn, each partition's end. It asked the
    consumer (get_watermark_offsets), whose request waits on the broker's connection
    behind the consumer's own long-poll fetch: fetch.wait.max.ms (500 ms) a partition, one
    after another. The worker then ended 1.8 s after its last commit at 3 partitions and
    4.3 s at 8 (measured), and a SIGTERM (looked at between turns) waited for the whole
    check. Here, at 12 partitions, a SIGTERM is sent as the last row lands, while the
    check runs: the old code ended 6.5 s later. Now the check is one request and takes
    milliseconds, so the worker ends within 3 s, by the check or by the SIGTERM (which of
    the two wins is timing; either is a clean exit 0)."""
    topic = f"t-{uuid.uuid4().hex[:12]}"
    ensure_topic(services.bootstrap, topic, partitions=12)
    try:
        sent = []
        for i in range(12):
            sent += [prepare(e) for e in unit_of_work(f"r{i}{uuid.uuid4().hex[:6]}", f"a{i}", 3)]
        send_in_one_transaction(services.bootstrap, topic, sent)
        worker = Worker(services, dsn, topic, tmp_path, args=["--until-drained"])
        wait_until(lambda: ingested(dsn).rows >= len(sent), 60, "every row", interval=0.05)
        start = time.monotonic()
        worker.signal(signal.SIGTERM)
        status = _exited(worker.proc, worker.log_path, BOUND_S, "still running after SIGTERM")
        took = time.monotonic() - start
    finally:
        for t in (topic, f"{topic}.dlq"):
            with contextlib.suppress(TopicError):
                delete_topic(services.bootstrap, t)
    assert status == 0, worker.log()[-3000:]
    assert took < 3.0, f"exited {took:.2f} s after SIGTERM:\n{worker.log()[-3000:]}"
