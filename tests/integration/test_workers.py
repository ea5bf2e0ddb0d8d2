"""Worker processes under kills and rebalances, proven by verify.

The crash windows of docs/design.md (after commit, zombies, shutdown with a write in flight,
...) each have their own test in test_crash_windows.py.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from ackline.dev.netns import Forwarder
from ackline.dev.ports import pick_free_port
from ackline.load.verify import drained
from ackline.streams.kafkainfo import group_members
from tests.integration.harness import Services, Worker, db, run_async, wait_until
from tests.integration.windows import batches, produce_worker_mix, verify_mixed_ok, wait_drained


def test_sigkill_mid_stream_then_restart(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    manifest = produce_worker_mix(services, topic, tmp_path, 20_000, seed=11)
    group = f"g-{topic}"
    # the first writes over one connection, its heir over the default two
    first = Worker(
        services, dsn, topic, tmp_path, name="w1", batch_max_events=500, writer_connections=1
    )
    wait_until(lambda: batches(dsn) >= 3, 60, "three committed batches")
    first.kill()  # SIGKILL, mid-stream
    assert not run_async(drained(dsn, manifest, group))
    second = Worker(services, dsn, topic, tmp_path, name="w2", batch_max_events=500)
    wait_drained(dsn, manifest, group, [second], 120)
    assert second.stop() == 0
    verify_mixed_ok(dsn, manifest, group)


def test_a_partition_given_up_while_paused_is_fetched_when_it_comes_back(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Backpressure pauses a worker's partitions while a write is slow; one revoked in that
    state and assigned back later must be fetched again. librdkafka keeps the pause flag
    across unassign and assign (its issue #1849): found by the short chaos run, where one
    partition stopped being read for good while its worker idled."""
    manifest = produce_worker_mix(services, topic, tmp_path, 12_000, seed=14)
    group = f"g-{topic}"
    a = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="a",
        batch_max_events=200,
        faults="before_commit=stall@2",
        fault_stall_seconds=8,
    )
    wait_until(lambda: "paused [0, 1, 2]" in a.log(), 60, "worker a to pause behind its stall")
    # b takes some of a's paused partitions, commits once and dies: they go back to a.
    b = Worker(
        services, dsn, topic, tmp_path, name="b", batch_max_events=200, faults="after_commit=kill@1"
    )
    # b's join revokes a's partitions while they are paused, and the revoke waits for a's
    # stalled batch: from there on, the rest of the 8 s stall is padding.
    wait_until(lambda: "revoked" in a.log(), 60, "a's paused partitions revoked")
    a.release_stall()
    wait_until(lambda: b.proc.poll() is not None, 90, "worker b's armed kill after its commit")
    assert b.reap() == -signal.SIGKILL
    assert "revoked" in a.log()
    wait_drained(dsn, manifest, group, [a], 120)
    assert a.stop() == 0
    verify_mixed_ok(dsn, manifest, group)


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_two_workers_through_rebalances(
    services: Services, dsn: str, topic: str, tmp_path: Path, protocol: str
) -> None:
    manifest = produce_worker_mix(services, topic, tmp_path, 10_000, seed=13)
    group = f"g-{topic}"
    # a pauses 4 s after its third commit, so that records are left for b however fast
    # a drains (10k events take a worker about a second).
    a = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="a",
        batch_max_events=300,
        group_protocol=protocol,
        faults="after_commit=stall@3",
        fault_stall_seconds=4,
    )
    wait_until(lambda: batches(dsn, "a") >= 2, 60, "worker a to commit")
    b = Worker(
        services, dsn, topic, tmp_path, name="b", batch_max_events=300, group_protocol=protocol
    )
    wait_until(lambda: batches(dsn, "b") >= 1, 60, "worker b to get partitions and commit")
    a.release_stall()  # records were left for b: the rest of a's 4 s stall is padding
    assert a.stop() == 0  # a leaves: b takes everything
    wait_drained(dsn, manifest, group, [b], 120)
    assert b.stop() == 0
    verify_mixed_ok(dsn, manifest, group)
    epochs = db(dsn, "SELECT max(epoch) AS e FROM consumer_offsets WHERE group_id = $1", group)
    assert epochs[0]["e"] >= 2  # partitions changed hands and were re-claimed


def test_a_worker_writing_over_two_connections(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """ACKLINE_WRITER_CONNECTIONS=2 (the default, set here all the same): the worker opens
    two writer connections, every batch holds the partitions of one of them only (a
    partition's batches stay in order on one connection), both write, and the mix is
    ingested exactly once."""
    manifest = produce_worker_mix(services, topic, tmp_path, 20_000, seed=17)
    group = f"g-{topic}"
    w = Worker(services, dsn, topic, tmp_path, name="w", batch_max_events=200, writer_connections=2)
    wait_drained(dsn, manifest, group, [w], 120)
    writers = db(
        dsn,
        "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'ackline:w'",
    )
    assert writers[0]["n"] == 2
    assert w.stop() == 0
    verify_mixed_ok(dsn, manifest, group)
    # The worker took partitions 0, 1, 2 in one claim, each to the emptier connection.
    slot = {0: 0, 1: 1, 2: 0}
    slots = [
        {slot[int(key.rsplit(":", 1)[1])] for key in r["parts"]}
        for r in db(
            dsn, "SELECT array(SELECT jsonb_object_keys(ranges)) AS parts FROM ingest_batches"
        )
    ]
    assert all(len(s) == 1 for s in slots), slots  # one connection's partitions each
    assert set().union(*slots) == {0, 1}  # and both connections wrote


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_a_worker_started_while_postgresql_does_not_answer_waits_outside_the_group(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str
) -> None:
    """`ackline run` started while PostgreSQL did not answer joined the consumer group and
    held its partitions, idle, until its leave bound (90 s) gave them up; found by an
    operator's probe. It waits before joining now (after its topic checks): the group has
    no member while the database is away (the old code had joined within seconds); once
    the database answers, the worker joins and drains, exactly once. A second worker,
    stopped while it waits, exits 0 at once."""
    manifest = produce_worker_mix(services, topic, tmp_path, 2_000, seed=23)
    group = f"g-{topic}"
    parts = urlsplit(dsn)
    host, pg_port = parts.hostname or "127.0.0.1", parts.port or 5432
    port = pick_free_port()
    away = urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{pg_port}", f":{port}")))
    w = Worker(services, away, topic, tmp_path, name="w", runtime=runtime)
    quiet_until = time.monotonic() + 12  # the old code had joined within about 3 s
    while time.monotonic() < quiet_until:
        w.ensure_alive()
        assert group_members(services.bootstrap, {}, group) == [], w.log()[-2000:]
        time.sleep(0.5)
    assert "not joining the consumer group until it answers" in w.log()
    # its endpoints answer meanwhile: /healthz 200, so a liveness probe does not restart it
    with urllib.request.urlopen(f"http://127.0.0.1:{w.metrics_port}/healthz", timeout=5) as r:
        assert r.status == 200
    # and /readyz says what it waits for (it said "PostgreSQL not checked yet" while the
    # wait was checking it, and "no partitions assigned" while it stayed out on purpose)
    with pytest.raises(urllib.error.HTTPError) as unready:
        urllib.request.urlopen(f"http://127.0.0.1:{w.metrics_port}/readyz", timeout=5)
    with unready.value as answer:
        assert answer.code == 503
        reasons = json.loads(answer.read())["reasons"]
    assert len(reasons) == 1 and "waiting for PostgreSQL before joining" in reasons[0], reasons

    stopped = Worker(services, away, topic, tmp_path, name="s", runtime=runtime)
    wait_until(lambda: "not joining" in stopped.log(), 60, "the second worker to wait")
    began = time.monotonic()
    assert stopped.stop(timeout=30) == 0, stopped.log()[-2000:]
    assert time.monotonic() - began < 10, stopped.log()[-2000:]

    with Forwarder(("127.0.0.1", port), (host, pg_port)):
        wait_drained(dsn, manifest, group, [w], 120)
        assert w.stop() == 0
    assert "PostgreSQL answers after" in w.log()
    verify_mixed_ok(dsn, manifest, group)


def test_a_group_new_to_a_topic_others_ingest_is_warned_of_at_start(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """A mistyped ACKLINE_GROUP_ID re-read the whole topic and dead-lettered every poison
    record again, in silence (an operator's report): `status` and `doctor` named the
    groups that have offsets, `run`, which does the reading, said nothing. It warns at
    start now, naming them; a group that has offsets gets no such line."""
    db(
        dsn,
        "INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, epoch) "
        "VALUES ($1, $2, 0, 0, 1)",
        f"g-{topic}",
        topic,
    )
    typo = f"g-{topic}-typo"
    w = Worker(services, dsn, topic, tmp_path, name="t", group=typo)
    try:
        wait_until(lambda: "assigned" in w.log(), 60, "the worker to join")  # after the check
        assert f"no DB offsets for group {typo}" in w.log(), w.log()[-2000:]
        assert f"groups with offsets for it: g-{topic}" in w.log(), w.log()[-2000:]
    finally:
        assert w.stop() == 0, w.log()[-2000:]
    ok = Worker(services, dsn, topic, tmp_path, name="k")
    try:
        wait_until(lambda: "assigned" in ok.log(), 60, "the worker to join")
    finally:
        assert ok.stop() == 0, ok.log()[-2000:]
    assert "no DB offsets for group" not in ok.log(), ok.log()[-2000:]


def test_a_verdict_with_lost_events_says_where_they_were(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """A failed chaos run's stack is gone when CI's output is read, and the verdict said
    only how many events were lost (78, once, on the faust runtime). It now names each run
    of lost winners, whether their keys were stored, and the batches around it. Here 20
    neighbouring winners of partition 1 lose their rows and keys after a clean drain."""
    from ackline.load.chaos.loss_logs import context
    from ackline.load.manifest import read_manifest
    from ackline.load.verify import expected_outcome, verify

    manifest = produce_worker_mix(services, topic, tmp_path, 3_000, seed=29)
    group = f"g-{topic}"
    w = Worker(services, dsn, topic, tmp_path, name="w")
    wait_drained(dsn, manifest, group, [w], 120)
    assert w.stop() == 0
    exp = expected_outcome(read_manifest(manifest).records)
    ones = sorted((x.offset, x.event_id) for x in exp.winners.values() if x.partition == 1)
    gone = ones[100:120]
    ids = [event_id for _offset, event_id in gone]
    db(
        dsn,
        "WITH d AS (DELETE FROM activity WHERE event_id = ANY($1::uuid[]) RETURNING txn_id), "
        "k AS (DELETE FROM event_keys WHERE event_id = ANY($1::uuid[])) "
        "DELETE FROM txn_ledger WHERE txn_id IN (SELECT txn_id FROM d)",
        ids,
    )
    verdict = run_async(verify(dsn, manifest, group))
    assert verdict.lost == 20, verdict
    assert len(verdict.lost_at) == 1, verdict.lost_at
    line = verdict.lost_at[0]
    assert line.startswith(
        f"lost on partition 1: 20 winners at offsets {gone[0][0]}..{gone[-1][0]}, "
        "0 of them with their keys stored; before: "
    ), line
    assert "over it: batch " in line and " by w [" in line, line
    # the chaos harness prints what the workers logged then: here the batch over the run
    (window,) = verdict.lost_windows
    assert window.partition == 1 and window.since and window.until, window
    logged = context([("w", w.log().splitlines())], window)
    assert any(" w batch " in x and "committed on partition 1: [" in x for x in logged), logged


def test_a_worker_waiting_for_postgresql_past_the_down_bound_says_so_at_error(
    services: Services, topic: str, tmp_path: Path
) -> None:
    """`ackline run` waiting before it joins, PostgreSQL refusing it: WARNING lines only,
    for ever, where ACKLINE_DB_DOWN_ERROR_AFTER_S says a failure past it is an ERROR (an
    operator's probe: WARNING at 0, 35, 69 and 101 s, no ERROR). One ERROR line once the
    wait passes the bound."""
    away = f"postgresql://postgres@127.0.0.1:{pick_free_port()}/ackline"
    w = Worker(services, away, topic, tmp_path, name="w", db_down_error_after_s=2)

    def errors() -> list[str]:
        lines = (json.loads(ln) for ln in w.log().splitlines() if ln.startswith("{"))
        return [x["msg"] for x in lines if x.get("level") == "error"]

    try:
        wait_until(lambda: bool(errors()), 30, "an ERROR line past the down bound")
        time.sleep(3)  # one, not one per retry
        assert len(errors()) == 1, errors()
        assert "not joining the consumer group until it answers" in errors()[0], errors()
    finally:
        assert w.stop(timeout=30) == 0, w.log()[-2000:]


def test_a_second_live_worker_with_a_taken_worker_id_is_refused(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Two live workers named alike kept exactly once (the fence compares epochs, not
    names), but nothing told them apart and neither said so: the operator probe found
    both in the group as "twin", every offset row and batch row owned by "twin". The
    second is refused now; a predecessor killed a moment ago (still a member until its
    session times out) is not mistaken for a live namesake."""
    manifest = produce_worker_mix(services, topic, tmp_path, 10_000, seed=17)
    group = f"g-{topic}"
    dirs = [tmp_path / d for d in ("first", "second", "heir")]
    for d in dirs:
        d.mkdir()
    # the first pauses after its third commit, so that records are left to read while
    # the second tries to join
    first = Worker(
        services,
        dsn,
        topic,
        dirs[0],
        name="twin",
        batch_max_events=300,
        faults="after_commit=stall@3",
        fault_stall_seconds=30,
    )
    wait_until(lambda: batches(dsn, "twin") >= 2, 60, "the first 'twin' to commit")
    second = Worker(services, dsn, topic, dirs[1], name="twin", batch_max_events=300)
    wait_until(lambda: second.proc.poll() is not None, 60, "the second 'twin' to be refused")
    assert second.reap() == 2
    refusal = second.log()
    assert "ACKLINE_WORKER_ID" in refusal and group in refusal, refusal[-2000:]
    assert "assigned" not in refusal  # refused before it joined: it held nothing
    first.release_stall()
    wait_drained(dsn, manifest, group, [first], 120)
    first.kill()  # SIGKILL: its membership outlives it by the session timeout
    heir = Worker(services, dsn, topic, dirs[2], name="twin", batch_max_events=300)
    wait_until(lambda: "assigned" in heir.log(), 60, "the heir named 'twin' to join")
    assert heir.stop() == 0
    verify_mixed_ok(dsn, manifest, group)


def _progress_lines(w: Worker) -> list[str]:
    """The worker's progress lines so far (a last line still being written is skipped)."""
    msgs = []
    for line in w.log().splitlines():
        with contextlib.suppress(ValueError):
            msgs.append(json.loads(line)["msg"])
    return [m for m in msgs if m.startswith("progress: ")]


def _rows_said(lines: list[str]) -> int:
    lines = [line for line in lines if " rows in " in line]
    return sum(
        int(line.split(" rows in ", 1)[0].rsplit(" ", 1)[-1].replace(",", "")) for line in lines
    )


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_a_running_worker_says_what_it_committed(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str
) -> None:
    """An operator tailing a worker's log saw nothing between its start-up line and its
    stop while events flowed. Every ACKLINE_PROGRESS_LOG_S (1 s here) it logs what it
    committed since the last line; the rows those lines count add up to the rows in
    PostgreSQL, and an idle worker says so once, then stays quiet."""
    manifest = produce_worker_mix(services, topic, tmp_path, 5_000, seed=29)
    group = f"g-{topic}"
    w = Worker(
        services,
        dsn,
        topic,
        tmp_path,
        name="w",
        runtime=runtime,
        progress_log_s=1,
        batch_max_events=200,
        session_timeout_ms=30_000,  # a rebalance on a loaded host would move the lines
    )
    try:
        wait_drained(dsn, manifest, group, [w], 120)
        stored = db(dsn, "SELECT count(*) AS n FROM activity")[0]["n"]
        wait_until(lambda: _rows_said(_progress_lines(w)) == stored, 30, "the lines to add up")
        wait_until(
            lambda: re.match(r"progress: nothing committed .*; lag 0; ", _progress_lines(w)[-1]),
            30,
            "an idle line with the lag measured",
        )
        quiet = len(_progress_lines(w))
        time.sleep(4)  # four more seconds idle: nothing more to say
        lines = _progress_lines(w)
        assert len(lines) == quiet, lines[quiet - 1 :]
        assert any("duplicates dropped" in line for line in lines), lines
        assert "; 3 partitions owned" in lines[-1], lines[-1]
    finally:
        assert w.stop() == 0, w.log()[-3000:]
    verify_mixed_ok(dsn, manifest, group)


def test_a_worker_whose_join_kafka_keeps_refusing_says_why_and_exits(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Operators' hunts, six workers at once, each refused pair in its own group (each
    waits out the same grace, so they share it).

    A confluent worker started in a group a faust worker is in logged `consumer error:
    ... INCONSISTENT_GROUP_PROTOCOL` every 2 s for ever, never joining and never naming
    the group or the setting. The other way round, a faust worker in a group of
    confluent workers waited for ever, owning nothing and logging nothing: aiokafka holds
    the join's error for `getmany`, which faust never calls, and did not try to join
    again until it was taken. Both exit 2 with one line naming ACKLINE_GROUP_ID now.

    ACKLINE_SESSION_TIMEOUT_MS below the broker's group.min.session.timeout.ms (3000 on
    the local stack, 6000 by Kafka's default) is a setting only the broker can judge: the
    default runtime logged `INVALID_SESSION_TIMEOUT` every 2 s for ever; the faust one
    gave up after the grace without naming the setting. Both exit 2 with one line naming
    it and the broker's bounds now."""
    produce_worker_mix(services, topic, tmp_path, 200, seed=18)
    pairs = [("faust", "confluent"), ("confluent", "faust")]
    there: list[Worker] = []
    refused: list[tuple[Worker, str]] = []  # (worker, what its line must name)
    try:
        for first, _ in pairs:
            d = tmp_path / f"{first}-first"
            d.mkdir()
            group = f"g-{first}-{topic}"
            there.append(Worker(services, dsn, topic, d, name="w1", group=group, runtime=first))
        for runtime in ("confluent", "faust"):
            d = tmp_path / f"{runtime}-timeout"
            d.mkdir()
            short = Worker(
                services,
                dsn,
                topic,
                d,
                name=f"t-{runtime}",
                group=f"g-t-{runtime}-{topic}",
                runtime=runtime,
                session_timeout_ms=1000,
            )
            refused.append((short, "ACKLINE_SESSION_TIMEOUT_MS=1000"))
        for w, (first, _) in zip(there, pairs, strict=True):
            wait_until(lambda w=w: "assigned" in w.log(), 90, f"the {first} worker to join")
        for w, (first, second) in zip(there, pairs, strict=True):
            other = Worker(
                services,
                dsn,
                topic,
                w.log_path.parent,
                name="w2",
                group=f"g-{first}-{topic}",
                runtime=second,
            )
            refused.append((other, f"g-{first}-{topic}"))
        for w, named in refused:
            wait_until(lambda w=w: w.proc.poll() is not None, 90, f"{w.log_path} to exit")
            said = w.log()
            assert w.reap() == 2, (w.log_path, said[-3000:])
            # the last: the exit's line (faust's first is the grace's WARNING)
            lines = [x for x in said.splitlines() if "cannot join consumer group" in x]
            line = lines[-1] if lines else ""
            assert named in line, said[-3000:]
            if named.startswith("ACKLINE_SESSION"):
                assert "group.min.session.timeout.ms" in line, line
            else:
                assert "ACKLINE_GROUP_ID" in line, line
            assert "Traceback" not in said, said[-3000:]
    finally:
        for w, _ in refused:
            w.discard()
        for w in there:
            assert w.stop() == 0, w.log()[-3000:]


def test_a_worker_joining_after_a_crashed_faust_worker_waits_for_its_session_to_expire(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """Switching a group's runtime with its faust worker gone (killed, not stopped): the
    dead member stays in the group until its session times out, and a confluent worker
    started meanwhile met INCONSISTENT_GROUP_PROTOCOL and exited 2 at once (the old code:
    the test failed), where it joins once the session expired (6 s here)."""
    produce_worker_mix(services, topic, tmp_path, 200, seed=19)
    dirs = [tmp_path / d for d in ("faust", "confluent")]
    for d in dirs:
        d.mkdir()
    faust = Worker(services, dsn, topic, dirs[0], name="f1", runtime="faust")
    wait_until(lambda: "assigned" in faust.log(), 90, "the faust worker to join")
    faust.kill()
    other = Worker(services, dsn, topic, dirs[1], name="c1")
    try:
        wait_until(
            lambda: (
                other.proc.poll() is not None
                or db(dsn, "SELECT count(*) AS n FROM consumer_offsets WHERE owner = 'c1'")[0]["n"]
                == 3
            ),
            60,
            "the confluent worker to claim the partitions (or exit)",
        )
        said = other.log()
        assert other.proc.poll() is None, (other.proc.returncode, said[-3000:])
        assert "cannot join consumer group" not in said, said[-3000:]
    finally:
        assert other.stop() == 0, other.log()[-3000:]
