"""make_app builds without I/O, and its consumer cannot derive an offset from acks."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from aiokafka.errors import IllegalStateError
from faust.types import TP, Message

from ackline.core.errors import SettingsError
from ackline.runtime.faust_app import AGENT_NAME, METADATA_MAX_AGE_MS, FaustApp, make_app
from ackline.runtime.faust_worker import fetched_uncommitted
from ackline.runtime.wiring import build_ingest
from ackline.settings import load_settings
from ackline.sinks.ingest.batch import PartitionRange
from ackline.sinks.ingest.offsets import Claim
from ackline.streams.faust_runtime import risk
from ackline.streams.faust_runtime.transport import AcklineConsumer, handed_ends
from ackline.streams.lag import partition_lag

T = "events"


def _app(tmp_path: Path, **env: str) -> FaustApp:
    environ = {"ACKLINE_TOPIC": T, "ACKLINE_GROUP_ID": "g", "ACKLINE_STATE_DIR": str(tmp_path)}
    environ.update(env)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in environ.items():
            mp.setenv(key, value)
        settings = load_settings()
    return make_app(build_ingest(settings, "127.0.0.1:1", "postgresql://u@127.0.0.1:1/db"))


def test_importing_the_package_does_not_import_faust() -> None:
    code = "import sys, ackline.streams.faust_runtime; print('faust' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_faust_environment_cannot_change_the_settings_the_runtime_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAM_WAIT_EMPTY", "false")
    monkeypatch.setenv("BROKER_COMMIT_EVERY", "1")
    monkeypatch.setenv("WEB_ENABLED", "true")
    app = _app(tmp_path)
    assert app.conf.stream_wait_empty is True
    assert app.conf.web_enabled is False
    assert app.conf.broker_commit_every != 1
    assert app.conf.id == "g"  # the consumer group is ackline's group id
    assert app.agents[next(iter(app.agents))].name.endswith(AGENT_NAME)


def test_the_group_leader_refreshes_metadata_within_seconds(tmp_path: Path) -> None:
    """A leader that assigned with no partition metadata (right after a broker restart)
    left the whole group without partitions until aiokafka's 5-minute metadata refresh:
    the short faust chaos run stalled that way. The refresh is now seconds."""
    app = _app(tmp_path)
    assert app.conf.consumer_metadata_max_age_ms == METADATA_MAX_AGE_MS <= 10_000
    assert app.conf.consumer_auto_offset_reset == "earliest"  # resets only past retention


def test_only_plaintext_kafka(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="ACKLINE_KAFKA_SECURITY_PROTOCOL"):
        _app(
            tmp_path,
            ACKLINE_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
            ACKLINE_KAFKA_SASL_MECHANISM="PLAIN",
            ACKLINE_KAFKA_SASL_USERNAME="u",
            ACKLINE_KAFKA_SASL_PASSWORD="p",
        )


def _message(partition: int, offset: int) -> Message:
    return Message(T, partition, offset, 0.0, 0, [], b"k", b"v", None, tp=TP(T, partition))


def test_acks_never_make_an_offset_committable(tmp_path: Path) -> None:
    app = _app(tmp_path)

    async def go() -> None:
        consumer = app.consumer
        assert isinstance(consumer, AcklineConsumer)
        try:
            _check(consumer)
            await consumer._add_gap(TP(T, 0), 105, 110)
            assert not consumer._gap
        finally:
            consumer._thread.thread_loop.close()  # never started: the test owns its loop

    def _check(consumer: AcklineConsumer) -> None:
        app.ownership.ledger.claimed([Claim(T, 0, 100, epoch=5)], 1, replace=True)
        for offset in (100, 101, 103, 104):  # 102 in flight (faust #606's shape)
            msg = _message(0, offset)
            consumer.track_message(msg)
            assert consumer.ack(msg) is True
            assert consumer.ack(msg) is False  # once
        assert not consumer.unacked
        assert consumer._acked == {} or not any(consumer._acked.values())
        tps = list(consumer._filter_tps_with_pending_acks())
        assert consumer._filter_committable_offsets(tps) == {TP(T, 0): 100}  # the DB's
        app.ownership.ledger.committed([PartitionRange(T, 0, 100, 102, epoch=5)])
        assert consumer._filter_committable_offsets(tps) == {TP(T, 0): 102}
        assert consumer._read_offset[TP(T, 0)] is None  # faust never drops a record as read

    asyncio.run(go())


def test_a_revoke_after_the_last_claim_keeps_the_flow_stopped(tmp_path: Path) -> None:
    """faust's recovery resumes the flow a loop turn or two after the claim's seek
    returned; a revoke that began in between stopped the flow, and the resume ran it again
    through the next join (a review). The flow now resumes only after the claim that
    followed the last revoke."""
    app = _app(tmp_path)

    async def go() -> None:
        consumer = app.consumer
        assert isinstance(consumer, AcklineConsumer)
        try:
            consumer.stop_flow()
            consumer._revokes += 1  # what on_partitions_revoked counts first
            consumer.resume_flow()
            assert not consumer.flow_active
            consumer._claimed_at = consumer._revokes  # the next assignment's claim, sought
            consumer.resume_flow()
            assert consumer.flow_active
        finally:
            consumer._thread.thread_loop.close()

    asyncio.run(go())


def test_a_revoke_between_an_assignment_and_its_seek_voids_the_claim(tmp_path: Path) -> None:
    """faust's recovery sleeps (stream_recovery_delay) between taking an assignment and
    its seek; a revoke that began in that gap was not counted against the claim (the
    count was read when the seek started): the claim owned revoked partitions and the flow
    resumed through the next join (a review). The count is now the assignment's. The
    claim statement and the seek are stood in for (PostgreSQL and Kafka: the integration
    tests); what is tested is the order of the checks."""
    app = _app(tmp_path)
    own, ledger = app.ownership, app.ownership.ledger

    async def claim(parts: Any, number: int, marks: Any, start_from: str) -> None:
        ledger.claimed([Claim(t, p, 100, epoch=7) for t, p in parts], number, replace=True)

    async def nothing(*args: Any) -> Any:
        return {}

    async def go() -> None:
        consumer = app.consumer
        assert isinstance(consumer, AcklineConsumer)
        try:
            own.claim = claim  # type: ignore[method-assign]
            consumer._marks = nothing  # type: ignore[method-assign]
            consumer.seek_positions = nothing  # type: ignore[method-assign]
            consumer.assignment = lambda: {TP(T, 0)}  # type: ignore[method-assign]
            # the first join: its revoke (of nothing), assignment 1, claimed and resumed
            consumer._revokes += 1
            consumer._assigned_at = (1, consumer._revokes)  # what on_partitions_assigned notes
            app.consumer_generation_id = 1
            await consumer.seek_to_committed()
            consumer.resume_flow()
            assert consumer.flow_active and ledger.owned() == {(T, 0): 7}
            # a rebalance: its revoke, then assignment 2 taken on the main loop
            consumer._revokes += 1
            consumer.stop_flow()
            ledger.release(ledger.tracked())
            consumer._assigned_at = (2, consumer._revokes)
            app.consumer_generation_id = 2
            # the next rebalance's revoke begins before the recovery's seek of 2
            consumer._revokes += 1
            ledger.release(ledger.tracked())
            with pytest.raises(IllegalStateError):
                await consumer.seek_to_committed()
            assert ledger.owned() == {}
            consumer.resume_flow()
            assert not consumer.flow_active
            # an assignment numbered on the consumer thread, not yet taken here: no claim
            app.consumer_generation_id = 3
            with pytest.raises(IllegalStateError):
                await consumer.seek_to_committed()
            assert ledger.owned() == {}
        finally:
            consumer._thread.thread_loop.close()

    asyncio.run(go())


def test_stock_faust_commits_past_an_in_flight_message_ackline_does_not(tmp_path: Path) -> None:
    """faust #606, reproduced on the installed faust: offset 100 is still being processed,
    101-104 are acked, and faust's own arithmetic makes 105 committable (100 would be
    lost at the next restart). ackline's consumer, given the same acks, offers the DB's."""
    stock = faust.App("stock", broker="kafka://127.0.0.1:1", env={}, web_enabled=False)
    ours = _app(tmp_path)

    async def go() -> None:
        tp = TP(T, 0)
        for app in (stock, ours):
            app.topics._acking_topics.add(T)  # as faust does when the agent subscribes
            consumer = app.consumer
            try:
                consumer._committed_offset[tp] = 100
                for offset in (101, 102, 103, 104):
                    msg = _message(0, offset)
                    consumer.track_message(msg)
                    consumer.ack(msg)
            finally:
                consumer._thread.thread_loop.close()
        assert stock.consumer._filter_committable_offsets([tp]) == {tp: 105}  # past 100
        ours.ownership.ledger.claimed([Claim(T, 0, 100, epoch=1)], 1, replace=True)
        assert ours.consumer._filter_committable_offsets([tp]) == {tp: 100}

    asyncio.run(go())


def test_the_installed_faust_is_the_proven_one() -> None:
    from faust.transport.drivers import aiokafka as faust_aiokafka

    problems = risk.version_problems(
        faust.__version__,
        faust_aiokafka.Consumer,
        faust_aiokafka.AIOKafkaConsumerThread,
        faust.Stream,
        faust.App,
        faust_aiokafka.ConsumerRebalanceListener,
    )
    assert problems == []
    risk.check(problems, "")  # starts without accepting anything


def test_an_untested_faust_is_refused_unless_the_risk_is_accepted() -> None:
    class Bare:
        pass

    problems = risk.version_problems("0.16.0", Bare, Bare, Bare, Bare, Bare)
    assert any("0.16.0 is not 0.15.x" in p for p in problems)
    assert any("Bare.ack no longer exists" in p for p in problems)
    assert any("Bare._enable_passive no longer exists" in p for p in problems)
    assert any("Bare.FlowControlQueue no longer exists" in p for p in problems)
    assert any("Bare.RebalanceListener no longer exists" in p for p in problems)
    assert any("Bare.on_partitions_assigned no longer exists" in p for p in problems)
    with pytest.raises(SettingsError, match="ACKLINE_FAUST_ACCEPT_RISK"):
        risk.check(problems, "")
    risk.check(problems, "untested-faust-version")
    with pytest.raises(SettingsError, match="unknown risk"):
        risk.check([], "lose-everything")


def test_lag_counts_from_the_position_only_when_no_handed_record_is_uncommitted() -> None:
    """An idle transactional partition read to its end: the DB next offset is 3, the
    commit marker at 3 puts the last stable offset and the position at 4. Lag 0 once
    the records handed to faust are committed; 1 while record 3 is handed and not."""
    fetched = {TP(T, 0): [SimpleNamespace(offset=1), SimpleNamespace(offset=2)], TP(T, 1): []}
    assert handed_ends(fetched) == {(T, 0): 3}
    assert not fetched_uncommitted(None, 3)  # nothing handed out
    assert not fetched_uncommitted(3, 3)  # all of it committed
    assert fetched_uncommitted(4, 3)  # record 3 in flight
    assert fetched_uncommitted(1, None)  # nothing committed yet
    assert partition_lag(4, 3, 4, fetched_uncommitted(3, 3)) == 0
    assert partition_lag(5, 3, 4, fetched_uncommitted(4, 3)) == 2


def test_the_faust_worker_writes_no_terminal_control_to_its_stdout() -> None:
    """faust's start-up spinner ends by writing a backspace and 'show cursor' (ESC [?25h)
    to stdout whether or not it is a terminal: a `run --runtime faust > file` found them
    in the file, where the default runtime writes nothing."""
    import io

    import faust

    from ackline.runtime.faust_worker import _Worker

    out = io.StringIO()
    worker = _Worker(faust.App("t-spinner", broker="kafka://127.0.0.1:1"), quiet=True, stdout=out)
    worker._on_startup_end_spinner()  # what faust calls once the worker has started
    assert out.getvalue() == ""


def test_a_retention_gap_is_counted_once_however_often_it_is_claimed(tmp_path: Path) -> None:
    """A claim whose DB offset (100) is below the log start (400) counts the offsets
    retention deleted (aiokafka resets such a position to the log start). Counted at
    every claim, the gap grew at each rebalance until a batch committed there, and for
    ever on a partition retention emptied (a review): now once per process and DB
    offset. The claim statement is stood in for (PostgreSQL: the window 17 test)."""
    app = _app(tmp_path)
    sink = app.parts.sink
    stored = [100]

    async def claimed(parts: Any, starts: Any) -> list[Claim]:
        return [Claim(t, p, stored[0], epoch=7) for t, p in parts]

    def counted() -> float | None:
        return app.parts.ingest.metrics.registry.get_sample_value(
            "ackline_retention_skipped_offsets_total", {"topic": T, "partition": "0"}
        )

    async def go() -> None:
        sink._claim = claimed  # type: ignore[method-assign]
        for number in (1, 2, 3):  # three rebalances, nothing committed in between
            await sink.claim([(T, 0)], number, {(T, 0): (400, 900)}, "earliest")
        assert counted() == 300
        stored[0] = 400  # a batch committed at the log start: nothing more to count
        await sink.claim([(T, 0)], 4, {(T, 0): (400, 900)}, "earliest")
        stored[0] = 450  # retention passed the DB offset again: a new gap
        await sink.claim([(T, 0)], 5, {(T, 0): (500, 900)}, "earliest")
        assert counted() == 350

    asyncio.run(go())
