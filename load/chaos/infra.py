"""`make chaos-infra`: the guarantees under network, cluster, failover and disk faults.

The run owns a stack of its own (:mod:`ackline.dev.infra`, default
``.ackline/chaos-infra``): three KRaft brokers (topics and the dead-letter topic with
replication factor 3 and ``min.insync.replicas=2``), a PostgreSQL primary with a streaming
standby (synchronous first), a tmpfs per node holding the tablespace of ``activity``, and
a Toxiproxy proxy in front of every link of every worker slot. Workers reach Kafka and
PostgreSQL only through their slot's proxies (a multi-host DSN with
``target_session_attrs=read-write``); the producer, the harness, the ``runs`` processor
and the dispatcher connect directly.

As in `make chaos` (:mod:`ackline.load.chaos.harness`, whose run this extends): a child
process produces ``events`` events with the full fault mix while ``workers`` workers
ingest them; the seeded schedule of :mod:`ackline.load.chaos.infra_plan` runs as ingest
progresses; then drain, verify against the manifest, check the projections, print a
table and the JSON verdict (:mod:`ackline.load.chaos.infra_model`). Production is parked
(between two of its transactions) while a broker is killed or restarted, so that the
manifest knows every transaction's outcome for certain; the workers are not.

Why this module is longer than the house's ~500 lines: like the harness it extends,
one run object owns the infra stack and the schedule's state, and each fault class is
a short method over them; its schedule and verdict are pure modules of their own
(infra_plan, infra_model).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

import asyncpg

from ackline.core.signals import run_stoppable
from ackline.load.chaos.harness import IN_COMMIT, RETIRED_TABLE, ChaosError, _Run
from ackline.load.chaos.infra_model import (
    LATENCY_MS,
    DispatchCheck,
    InfraConfig,
    InfraCounts,
    InfraReport,
)
from ackline.load.chaos.infra_plan import InfraFault, infra_plan
from ackline.load.chaos.probe import OffsetWatch, Pg
from ackline.load.chaos.workers import Incarnation, WorkerPool, scrape_metric, wait_for

if TYPE_CHECKING:  # the stack is imported when a run starts (ackline.dev is heavy)
    from ackline.dev.infra import Infra

GHOST = "ackline_chaos_ghost"
RECONCILED_LINE = "had committed; reconciled by reading"
RETRIED_LINE = "did not commit; retrying"
DOWN_SINCE = "ackline_database_down_since_timestamp_seconds"
_DISPATCH_CHECK = """
SELECT (SELECT count(DISTINCT request_id) FROM activity WHERE type = 'agent.requested')
           AS requests,
       (SELECT count(*) FROM activity WHERE type = 'agent.requested') AS requested_events,
       (SELECT count(*) FROM agent_runs) AS runs,
       (SELECT coalesce(sum(deliveries), 0) FROM agent_runs) AS deliveries
"""


def run_infra_chaos(cfg: InfraConfig, out: TextIO = sys.stdout) -> InfraReport:
    """One run on its own infrastructure stack; prints as it goes."""
    from ackline.dev import infra as stack

    seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(1, 1 << 31)
    state_dir = cfg.state_dir.absolute()
    print(f"chaos-infra seed {seed} (reproduce: {cfg.command(seed)})", file=out, flush=True)
    print(f"== starting the infrastructure stack in {state_dir}", file=out, flush=True)
    infra = stack.up(
        state_dir, slots=cfg.workers, mode="sync", disk="disk" in cfg.classes, timeout=600
    )
    try:
        run = _InfraRun(cfg, seed, infra, out)
        try:
            report = run.execute_infra()
        finally:
            run.close()
        if report.ok:
            run.discard()  # a failed run keeps its database, topics, manifest and logs
        return report
    finally:
        if not cfg.keep_stack:
            stack.down(state_dir)


class FailoverWatch(OffsetWatch):
    """:class:`OffsetWatch`, with Kafka ahead of the DB split in two: offsets at or below
    what the DB held on a primary an asynchronous failover then lost are *explained*
    (the workers committed them to Kafka after PostgreSQL acknowledged them); anything
    else is Kafka ahead of the DB (``max_ahead``, which must stay 0)."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int) -> None:
        super().__init__(bootstrap, group, topic, partitions)
        self.explained: dict[int, int] = {}
        self.max_after_failover = 0

    def explain(self, offsets: dict[int, int | None]) -> None:
        for partition, offset in offsets.items():
            if offset is not None:
                self.explained[partition] = max(self.explained.get(partition, 0), offset)

    def sample(self, pg: Pg) -> None:
        kafka = self.kafka_committed()
        if kafka is None:
            return
        db = pg.next_offsets(self._group, self._topic)
        if db is None:
            return
        self.samples += 1
        for partition, offset in kafka.items():
            ahead = offset - (db.get(partition) or 0)
            if ahead <= 0:
                continue
            if offset <= self.explained.get(partition, -1):
                self.max_after_failover = max(self.max_after_failover, ahead)
            elif ahead > self.max_ahead:
                self.max_ahead = ahead


class _InfraRun(_Run):
    """One infrastructure chaos run: `make chaos`'s run on the infrastructure stack."""

    def __init__(self, cfg: InfraConfig, seed: int, infra: Infra, out: TextIO) -> None:
        super().__init__(cfg.base(), seed, infra.bootstrap, infra.admin_dsn(), infra.state_dir, out)
        self.icfg = cfg
        self.infra = infra
        self.ic = InfraCounts()
        database = self.dsn.rsplit("/", 1)[1]
        self.database = database
        self.dsn = infra.admin_dsn(database)
        self.pg.close()
        self.pg = Pg(self.dsn)
        self.dispatchers: WorkerPool | None = None
        self.fwatch: FailoverWatch | None = None

    # ---- lifecycle -------------------------------------------------------------------

    def execute_infra(self) -> InfraReport:
        self._prepare_infra()
        faults = infra_plan(
            self.seed,
            workers=self.icfg.workers,
            classes=self.icfg.classes,
            minimums=self.icfg.minimums,
        )
        for n, fault in enumerate(faults, 1):
            self._wait_progress(fault.at)
            wait_for(lambda: False, 0.5, self._tick)
            self.say(f"{self._progress():4.0%} fault {n}/{len(faults)}: {fault.describe()}")
            self._infra_fault(fault)
        self._latency(False)  # a phase cut short by the end of the plan
        self._drain()
        return self._finish_infra()

    def _prepare_infra(self) -> None:
        from ackline.sinks.admin.migrate import migrate
        from ackline.streams.admin import ensure_topic
        from ackline.streams.errors import TopicError

        self.admin.retry(f'CREATE DATABASE "{self.database}"')

        async def apply() -> None:
            conn = await asyncpg.connect(self.dsn)
            try:
                await migrate(conn)
                await conn.execute(RETIRED_TABLE)  # the runs check reads it (empty here)
                if self.infra.layout.disk:
                    await conn.execute("SELECT ackline_activity_tablespace('ackline_ts')")
            finally:
                await conn.close()

        run_stoppable(apply())
        config = {"max.message.bytes": str(2 * 1_048_576), "min.insync.replicas": "2"}
        for topic in (self.name, f"{self.name}.dlq"):
            for attempt in range(15):  # a new topic reaches every broker's metadata late
                try:
                    ensure_topic(
                        self.bootstrap, topic, self.cfg.partitions, config, replication_factor=3
                    )
                    break
                except TopicError:
                    if attempt == 14:
                        raise
                    time.sleep(2.0)
        self.say(
            f"topic {self.name} and its dead-letter topic ({self.cfg.partitions} partitions, "
            f"RF 3, min.insync.replicas 2), database {self.database} (activity on a tmpfs)"
        )
        self._produce_log = (self.run_dir / "produce.log").open("ab")
        self.producer = subprocess.Popen(
            [sys.executable, "-m", "ackline.load.chaos.harness", _json(self._child_args())],
            stdin=subprocess.DEVNULL,
            stdout=self._produce_log,
            stderr=subprocess.STDOUT,
        )
        self.say(f"producing {self.cfg.events:,} events (child pid {self.producer.pid})")
        head = 0.1 * self._estimate()
        if not wait_for(lambda: self._in_topic() >= head or self._produced(), 900):
            raise ChaosError("production did not get going")
        self.env = {
            "ACKLINE_KAFKA_BOOTSTRAP": self.bootstrap,
            "ACKLINE_DATABASE_URL": self.dsn,
            "ACKLINE_TOPIC": self.name,
            "ACKLINE_GROUP_ID": self.name,
            "ACKLINE_DLQ_TOPIC": f"{self.name}.dlq",
            "ACKLINE_GROUP_PROTOCOL": self.cfg.group_protocol,
            "ACKLINE_RUNTIME": self.cfg.runtime,
            "ACKLINE_SESSION_TIMEOUT_MS": str(self.cfg.session_timeout_ms),
            "ACKLINE_BATCH_MAX_EVENTS": str(self.cfg.batch_max_events),
            "ACKLINE_BATCH_MAX_MS": "200",
            "ACKLINE_MAX_MESSAGE_BYTES": str(65_536),
            "ACKLINE_STATE_DIR": str(self.state_dir),
            "ACKLINE_DB_CONNECT_TIMEOUT_S": "4",
            "ACKLINE_DB_STATEMENT_TIMEOUT_S": f"{self.icfg.statement_timeout_s:g}",
            "ACKLINE_DB_COMMIT_TIMEOUT_S": f"{self.icfg.statement_timeout_s:g}",
            "ACKLINE_DB_DOWN_ERROR_AFTER_S": f"{self.icfg.down_error_after_s:g}",
        }
        slot_env = {
            slot: {
                "ACKLINE_KAFKA_BOOTSTRAP": self.infra.slot_bootstrap(slot),
                "ACKLINE_DATABASE_URL": self.infra.slot_dsn(slot, self.database),
            }
            for slot in range(self.cfg.workers)
        }
        self.pool = WorkerPool(self.run_dir, self.env, self.cfg.workers, slot_env=slot_env)
        for slot in range(self.cfg.workers):
            self.pool.start(slot)
        self.fwatch = FailoverWatch(self.bootstrap, self.name, self.name, self.cfg.partitions)
        self.watch = self.fwatch
        self.say(
            f"{self.cfg.workers} workers started in group {self.name}, each behind its proxies"
        )
        self.processors = WorkerPool(
            self.run_dir, self.env, 1, command=("process", "runs"), prefix="p"
        )
        self.processors.start(0)
        self.dispatchers = WorkerPool(
            self.run_dir, self.env, 1, command=("process", "dispatcher"), prefix="d"
        )
        self.dispatchers.start(0)
        self.say("the runs processor and the dispatcher follow the changefeed beside them")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._latency(False)
            self.infra.reset_proxies()
        if self.dispatchers is not None:
            self.dispatchers.shutdown()
        super().close()

    def _run_database(self) -> tuple[str, str]:
        """The current primary's administrator DSN (a failover may have moved it)."""
        return self.infra.admin_dsn(), self.database

    def _tick(self) -> None:
        super()._tick()
        pool = self.dispatchers
        if pool is None:
            return
        for ended in pool.reap():
            tail = "\n".join(ended.incarnation.log().splitlines()[-5:])
            self.ic.notes.append(f"the dispatcher exited {ended.returncode} by itself")
            self.say(f"dispatcher {ended.incarnation.worker_id} exited by itself:\n{tail}")
            pool.start(ended.incarnation.slot)

    # ---- the faults --------------------------------------------------------------------

    def _infra_fault(self, fault: InfraFault) -> None:
        kind = fault.kind
        if kind == "pg_hole":
            self._pg_hole(fault.slot, fault.in_commit)
        elif kind == "kafka_hole":
            self._kafka_hole(fault.slot)
        elif kind == "reset":
            self._reset(fault.slot, fault.target)
        elif kind in ("latency_on", "latency_off"):
            self._latency(kind == "latency_on")
        elif kind == "leader_kill":
            self._parked(self._leader_kill)
        elif kind == "roll":
            self._parked(self._roll)
        elif kind == "failover":
            self._failover(fault.sync)
        elif kind == "disk_full":
            self._disk_full()

    def _live(self, slot: int) -> Incarnation | None:
        inc = self._pool().current(slot)
        if inc is None:
            self.ic.notes.append(f"no live worker in slot {slot} for a network fault")
        return inc

    def _hold(self, seconds: float) -> None:
        wait_for(lambda: False, seconds, self._tick)

    def _batches_of(self, worker: str) -> int:
        rows = self.pg.try_fetch(
            "SELECT count(*) AS n FROM ingest_batches WHERE worker = $1", worker
        )
        return int(rows[0]["n"]) if rows else -1

    def _pg_hole(self, slot: int, in_commit: bool) -> None:
        """Black-hole both directions of the worker's PostgreSQL proxies for longer than
        its statement timeout, then heal; when ``in_commit``, start the hole while the
        worker's COMMIT is in flight (held by a synchronous standby that never answers,
        released once the hole is on: the server commits, the reply is lost)."""
        inc = self._live(slot)
        if inc is None or self._drained_now():
            return
        proxies = self.infra.pg_proxies(slot)
        started_in_commit = False
        if in_commit:
            started_in_commit = self._hole_in_commit(inc, proxies)
            if not started_in_commit:
                self.ic.notes.append(f"{inc.worker_id}: no COMMIT in flight seen; a plain hole")
        if not started_in_commit:
            for p in proxies:
                p.add_timeout("hole", 0, "both")
        before = self._batches_of(inc.worker_id)
        self._hold(self.icfg.pg_hole_s)
        for p in proxies:
            p.remove_toxic("hole")
        self.ic.pg_holes += 1
        self.ic.pg_holes_in_commit += started_in_commit
        recovered = wait_for(
            lambda: (
                self._batches_of(inc.worker_id) > before or self._drained_now() or not inc.alive()
            ),
            180,
            self._tick,
        )
        if recovered and inc.alive():
            self.ic.pg_holes_recovered += 1
            self.say(f"{inc.worker_id} commits again after the hole")
        else:
            self.say(f"{inc.worker_id} did not commit again within 180 s of the hole")

    def _hole_in_commit(self, inc: Incarnation, proxies: list[Any]) -> bool:
        found: list[int] = []

        def in_commit() -> bool:
            found[:] = self.pg.writer_backends(IN_COMMIT, inc.worker_id)
            return bool(found)

        for _ in range(30):
            if self._drained_now():
                return False
            self._ghost(True)
            try:
                if wait_for(in_commit, 3.0):
                    for p in proxies:
                        p.add_timeout("hole", 0, "both")
                    self.say(f"{inc.worker_id}'s COMMIT (backend {found[0]}) is in flight: hole on")
                    return True
            finally:
                self._ghost(False)
            self._hold(1.0)
        return False

    def _ghost(self, on: bool) -> None:
        """Every COMMIT waits for a synchronous standby that never comes (on); back to the
        pair's own replication mode (off)."""
        if on:
            self.admin.retry(f"ALTER SYSTEM SET synchronous_standby_names = '{GHOST}'")
            self.admin.retry("SELECT pg_reload_conf()")
        else:
            self.infra.pair.set_mode(self.infra.pair.mode)

    def _kafka_hole(self, slot: int) -> None:
        """Black-hole every Kafka link of the worker past its session timeout, until
        others own all its partitions; heal; it must own partitions again."""
        inc = self._live(slot)
        if inc is None or self._drained_now():
            return
        group = self.name
        owned = self.pg.owned_by(group, inc.worker_id)
        fenced_before = inc.fenced_lines()
        proxies = self.infra.kafka_proxies(slot)
        for p in proxies:
            p.add_timeout("hole", 0, "both")
        started = time.monotonic()
        lost = wait_for(
            lambda: (
                time.monotonic() - started >= self.icfg.kafka_hole_min_s
                and not self.pg.owned_by(group, inc.worker_id)
            ),
            self.icfg.kafka_hole_max_s,
            self._tick,
        )
        for p in proxies:
            p.remove_toxic("hole")
        self.ic.kafka_holes += 1
        held = time.monotonic() - started
        if lost:
            self.ic.kafka_holes_lost += 1
        self.say(
            f"{inc.worker_id}: Kafka black hole of {held:.0f} s; it owned {sorted(owned)}, "
            + ("all claimed by others" if lost else "NOT all claimed by others")
        )
        back = wait_for(
            lambda: bool(self.pg.owned_by(group, inc.worker_id)) or not inc.alive(), 180, self._tick
        )
        if back and inc.alive():
            self.ic.kafka_holes_back += 1
            self.say(f"{inc.worker_id} owns {sorted(self.pg.owned_by(group, inc.worker_id))} again")
        fenced = inc.fenced_lines() - fenced_before
        self.ic.kafka_holes_fenced += max(fenced, 0)

    def _reset(self, slot: int, target: str) -> None:
        """Reset the worker's connections of one kind (a peer that sends RST)."""
        if self._live(slot) is None:
            return
        proxies = (
            self.infra.kafka_proxies(slot) if target == "kafka" else self.infra.pg_proxies(slot)
        )
        for p in proxies:
            p.add_reset_peer("reset", 0, "both")
        self._hold(1.5)
        for p in proxies:
            p.remove_toxic("reset")
        self.ic.resets += 1

    def _latency(self, on: bool) -> None:
        """Latency with jitter on both directions of every worker link (on), or not."""
        low, high = LATENCY_MS
        latency, jitter = (low + high) // 2, (high - low) // 2
        for slot in range(self.cfg.workers):
            for p in [*self.infra.kafka_proxies(slot), *self.infra.pg_proxies(slot)]:
                present = {t.name for t in p.toxics()}
                if on and "latency_up" not in present:
                    p.add_latency("latency", latency, jitter, "both")
                elif not on and present & {"latency_up", "latency_down"}:
                    p.remove_toxic("latency")
        if on:
            self.ic.latency_phases += 1

    def _parked(self, fault: Callable[[], None]) -> None:
        """Run a broker fault while production is parked between two transactions."""

        def parked() -> bool:
            return self.paused_file.exists() or self._produced()

        self.pause_file.touch()
        try:
            if not wait_for(parked, 600, self._tick):
                raise ChaosError("the producer did not pause for a broker fault")
            if self.watch is not None:
                self.watch.reset()
            fault()
        finally:
            self.pause_file.unlink(missing_ok=True)

    def _busiest(self) -> int:
        """The partition with the most records not yet ingested."""
        from ackline.streams.kafkainfo import topic_offsets

        found = topic_offsets(self.bootstrap, {}, self.name, self.name, timeout=10) or []
        db = self.pg.next_offsets(self.name, self.name) or {}
        lag = {p.partition: p.high - (db.get(p.partition) or 0) for p in found}
        return max(lag, key=lambda p: lag[p]) if lag else 0

    def _leader_kill(self) -> None:
        cluster = self.infra.cluster
        partition = self._busiest()
        leader = cluster.leaders(self.name)[partition]
        started = time.monotonic()
        cluster.node(leader).kill()
        new = self._background(lambda: cluster.wait_leader(self.name, partition, leader, 120))
        took = time.monotonic() - started
        self.say(
            f"SIGKILLed broker {leader}, leader of {self.name}[{partition}]; "
            f"broker {new} leads it after {took:.1f} s"
        )
        self._background(lambda: cluster.node(leader).start(300))
        self._background(lambda: cluster.wait_full_isr(300))
        cluster.preferred_election([self.name, f"{self.name}.dlq"])
        self.ic.leader_kills += 1
        self.say(f"broker {leader} back, ISR full")

    def _roll(self) -> None:
        cluster = self.infra.cluster
        order = self._background(
            lambda: cluster.roll(lambda n: self.say(f"rolling broker {n.node_id}"))
        )
        cluster.preferred_election([self.name, f"{self.name}.dlq"])
        self.ic.broker_rolls += 1
        self.say(f"rolled brokers {order}, ISR full")

    def _background(self, work: Callable[[], Any]) -> Any:
        """Run blocking ``work`` in a thread while the run ticks; its result or error."""
        result: list[Any] = []
        error: list[BaseException] = []

        def target() -> None:
            try:
                result.append(work())
            except BaseException as exc:  # handed back to the caller below
                error.append(exc)

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        wait_for(lambda: not thread.is_alive(), 3600, self._tick)
        thread.join()
        if error:
            raise error[0]
        return result[0] if result else None

    def _failover(self, sync: bool) -> None:
        """Crash the primary and promote the standby; rebuild the old one as standby.

        Synchronous: the WAL sender is held 0.5 s first (commits wait unanswered), and no
        acknowledged batch may be missing afterwards. Asynchronous: the WAL sender is held
        ``async_lag_s`` while commits are acknowledged, then every further COMMIT is held
        (ghost synchronous standby) so that what the primary shows is exactly what was
        acknowledged; that many batches, minus what the new primary has, were rolled back.
        """
        pair = self.infra.pair
        if pair.mode != ("sync" if sync else "async"):
            pair.set_mode("sync" if sync else "async")
        old = pair.primary
        direct = Pg(old.dsn(self.database))
        try:
            pair.hold_wal_senders()
            self._hold(0.5 if sync else self.icfg.async_lag_s)
            if not sync:
                self._until_acknowledged_past_hold(direct)
            self._ghost_on_direct(direct)
            self._hold(0.3)
            row = direct.fetch("SELECT count(*) AS n, clock_timestamp() AS at FROM ingest_batches")[
                0
            ]
            before, crash_at = int(row["n"]), row["at"]
            offsets = {
                int(r["partition"]): r["next_offset"]
                for r in direct.fetch(
                    "SELECT partition, next_offset FROM consumer_offsets WHERE group_id = $1",
                    self.name,
                )
            }
        finally:
            direct.close()
        pair.crash()
        self.infra.set_node_reachable(old.name, False)
        promote_s = pair.promote()
        self.infra.record()
        if self.fwatch is not None:
            self.fwatch.explain(offsets)
        survived = self.pg.retry(
            "SELECT count(*) AS n FROM ingest_batches WHERE committed_at <= $1", crash_at
        )[0]["n"]
        lost = before - int(survived)
        if sync:
            self.ic.sync_lost_commits += lost
        else:
            self.ic.rolled_back_commits += lost
            self.ic.pg_failovers_async += 1
        self.ic.pg_failovers += 1
        self.say(
            f"{'synchronous' if sync else 'asynchronous'} failover: {old.name} crashed, "
            f"{pair.primary.name} promoted in {promote_s:.1f} s; {lost} acknowledged batches "
            f"of {before} rolled back; rebuilding {old.name}"
        )
        method = self._background(lambda: pair.rebuild("async"))
        self.infra.set_node_reachable(old.name, True)
        self.infra.record()
        self.ic.rebuilds.append(str(method))
        self.say(f"{old.name} rebuilt by {method} as the standby of {pair.primary.name}")

    def _until_acknowledged_past_hold(self, direct: Pg) -> None:
        """Wait (up to ``async_lag_wait_s``) until the held primary has acknowledged a
        batch its standby cannot have: a fixed lag alone lost nothing when every worker
        happened to be between commits (seed 777 once, right after a leader kill), and an
        asynchronous failover that takes nothing back proves nothing."""

        def batches() -> int:
            return int(direct.fetch("SELECT count(*) AS n FROM ingest_batches")[0]["n"])

        held = batches()
        grew = wait_for(
            lambda: batches() > held or self._drained_now(),
            self.icfg.async_lag_wait_s,
            self._tick,
        )
        if not grew:
            self.ic.notes.append(
                f"asynchronous failover: no batch committed in {self.icfg.async_lag_wait_s:.0f} s "
                "with the WAL sender held"
            )

    def _ghost_on_direct(self, direct: Pg) -> None:
        direct.fetch(f"ALTER SYSTEM SET synchronous_standby_names = '{GHOST}'")
        direct.fetch("SELECT pg_reload_conf()")

    def _disk_full(self) -> None:
        """Leave the activity tablespace's filesystem a MiB; wait for the workers to fail
        and alert (the down-since metric, then /readyz 503), then give room back; ingest
        must go on."""
        from ackline.dev.infra import TMPFS_SIZE

        if not self.infra.layout.disk or self._drained_now():
            return
        fs = self.infra.tmpfs[self.infra.pair.primary.name]
        pool = self._pool()
        fs.resize(fs.used() + (1 << 20))
        self.ic.disk_full_episodes += 1
        self.say(f"{fs.path}: {fs.used() >> 20} MiB used, 1 MiB left")
        failing = wait_for(
            lambda: (
                any((scrape_metric(i.metrics_port, DOWN_SINCE) or 0) > 0 for i in pool.live())
                or self._drained_now()
            ),
            180,
            self._tick,
        )
        alerted = failing and wait_for(
            lambda: any(readyz(i.metrics_port) == 503 for i in pool.live()),
            self.icfg.down_error_after_s + 60,
            self._tick,
        )
        if alerted:
            self.ic.disk_full_alerted += 1
        self.say(f"disk full: workers failing {failing}, /readyz 503 {alerted}; freeing space")
        self._hold(3.0)
        before = self.pg.ingested_records(self.name) or 0
        fs.resize(TMPFS_SIZE)
        drained = wait_for(
            lambda: (self.pg.ingested_records(self.name) or 0) > before or self._drained_now(),
            180,
            self._tick,
        )
        if drained:
            self.ic.disk_full_drained += 1
        self.say(f"space freed: ingest {'goes on' if drained else 'DID NOT RESUME'}")

    # ---- the end -----------------------------------------------------------------------

    def _finish_infra(self) -> InfraReport:
        dispatch = self._finish_dispatch()
        base = self._finish()
        logs = [i.log() for i in self._pool().incarnations]
        self.ic.commits_reconciled = sum(t.count(RECONCILED_LINE) for t in logs)
        self.ic.commits_retried = sum(t.count(RETRIED_LINE) for t in logs)
        runs = base.runs
        watch = self.fwatch
        return InfraReport(
            config=self.icfg,
            base=base,
            counts=self.ic,
            kafka_ahead_after_failover=watch.max_after_failover if watch else 0,
            runs=runs,
            dispatch=dispatch,
        )

    def _finish_dispatch(self) -> DispatchCheck | None:
        if self.dispatchers is None:
            return None
        self.dispatchers.shutdown()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACKLINE_")}
        env.update(self.env)
        env.update({"ACKLINE_WORKER_ID": "d-final", "ACKLINE_LOG_FORMAT": "json"})
        log_path = self.run_dir / "logs" / "d-final.log"
        with log_path.open("ab") as log:
            done = subprocess.run(
                [sys.executable, "-m", "ackline", "process", "dispatcher", "--until-caught-up"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=self.cfg.drain_timeout_s,
                check=False,
            )
        if done.returncode != 0:
            self.ic.notes.append(f"the final dispatcher catch-up exited {done.returncode}")
        row = self.pg.retry(_DISPATCH_CHECK)[0]
        check = DispatchCheck(
            requests=int(row["requests"]),
            runs=int(row["runs"]),
            deliveries=int(row["deliveries"]),
            requested_events=int(row["requested_events"]),
        )
        self.say(f"dispatcher: {check.runs:,} runs, {check.mismatches} mismatches")
        return check


def readyz(port: int, timeout: float = 3.0) -> int | None:
    """The HTTP status of a worker's /readyz (None when it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, http.client.HTTPException):  # HTTPException: a worker killed mid-answer
        return None


def _json(obj: dict[str, Any]) -> str:
    return json.dumps(obj)


__all__ = ["FailoverWatch", "readyz", "run_infra_chaos"]
