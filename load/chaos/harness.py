"""`make chaos`: the guarantees under crashes, restarts and zombies, in one run.

The run owns a local stack in a state directory of its own (default ``.ackline/chaos``),
started and stopped here, never the shared one (it restarts the broker and PostgreSQL).

1. A fresh database and a topic of ``partitions`` partitions; ``events`` events with the
   full fault mix (redeliveries, producer retries, conflicts on both layers, poison,
   aborted upstream transactions) are produced by a child process (:mod:`ackline.load.produce`)
   while ``workers`` ``ackline run`` processes of one group consume them. Production is
   held open until the schedule's faults are done: past its plan it goes on at a trickle
   (:mod:`ackline.load.chaos.topup`, in the same manifest), so late faults find work.
2. The seeded schedule of :mod:`ackline.load.chaos.plan` is executed as ingest progresses:
   SIGKILLs (some by restarting a worker armed to kill itself at an injection point);
   zombies (a worker stalled with a batch in hand is SIGSTOPped past its session
   timeout until others own its partitions, then SIGCONTed: its batch must be fenced);
   broker and PostgreSQL restarts; terminations of a writer's backend while its COMMIT
   is in flight (held by a synchronous standby that never answers) or stalled before it;
   a retention drop of the partition the workers are writing (their next COPY finds it
   missing: they make it again and retry) and an erasure of the agent with the most
   stored events (docs/retention.md). All along, Kafka's committed offsets are sampled
   against the DB offsets.
3. Drain, verify against the manifest (:mod:`ackline.load.verify`: the winners whose rows
   the retention drop or the erasure took are counted apart, their keys still in place),
   print a table and, as the last line, one JSON object. ``ok`` means: verify exact,
   every minimum count met, every zombie fenced, and Kafka never ahead of the DB.

Beside the workers, `ackline process runs` (the ``runs`` projection, a stream processor)
follows the changefeed; it is SIGKILLed on the schedule too, half the time restarted
armed to kill itself between its effects and its COMMIT. At the end it catches up and
every run's row is recomputed from ``activity`` and compared (``runs_mismatch``,
:mod:`ackline.load.chaos.runs_check`).

Every run prints its seed; the schedule derives from it (``--seed`` reproduces it).

Why this module is longer than the house's ~500 lines: one class, the run, owns the
stack, the producer child, the worker pool, the processor and the schedule's state, and
each fault is a short method that reads and changes that state; split across modules,
each would need the whole run passed in. The pure parts live beside it (plan, model,
probe, runs_check, workers).
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, TextIO, TypeVar

import asyncpg

from ackline.core.signals import raise_if_stop_lost, run_stoppable
from ackline.load.chaos import loss_logs
from ackline.load.chaos.model import ChaosConfig, ChaosReport, Counts
from ackline.load.chaos.pacing import Pacer
from ackline.load.chaos.plan import Fault, plan
from ackline.load.chaos.probe import OffsetWatch, Pg
from ackline.load.chaos.runs_check import RunsCheck, check_runs_at
from ackline.load.chaos.topup import held_open
from ackline.load.chaos.workers import (
    FENCED_LINE,
    Incarnation,
    WorkerPool,
    production_failed,
    wait_for,
)
from ackline.load.errors import LoadError
from ackline.load.generate import Knobs, Send
from ackline.load.manifest import read_manifest
from ackline.load.verify import LossWindow, expected_outcome, is_drained, verify

T = TypeVar("T")

PROCESSOR_READER = "runs"
"""The changefeed reader name of `ackline process runs` (its cursor row)."""

# The chaos run's own table: rows retention or erasure took that the runs processor had
# read (the runs check recomputes from activity and these).
RETIRED_TABLE = "CREATE TABLE chaos_retired (LIKE activity)"
_HOLD = "LOCK TABLE activity IN ACCESS EXCLUSIVE MODE"
_TOMORROW = """
SELECT (date_trunc('day', now() AT TIME ZONE 'UTC') + interval '1 day') AT TIME ZONE 'UTC'
"""
_ERASE_WAIT_S = 60.0
"""How long an erasure waits for a stored event to erase (a retention drop just before it
leaves none until the workers store more)."""
_BUSIEST_AGENT = "SELECT agent_id FROM activity GROUP BY 1 ORDER BY count(*) DESC, 1 LIMIT 1"
_READ_BY_PROCESSOR = """
FROM activity AS a
JOIN ingest_batches AS b ON b.batch_id = a.batch_id
JOIN feed_cursors AS c ON c.reader = $1
WHERE (b.commit_xid < c.position
       OR (b.commit_xid = c.position
           AND (c.within_batch IS NULL
                OR (a.batch_id, a.src_partition, a.src_offset, a.src_topic COLLATE "C")
                   <= (c.within_batch, c.within_partition, c.within_offset,
                       c.within_topic COLLATE "C"))))
"""
_RETIRE_BEFORE = (
    "INSERT INTO chaos_retired SELECT a.* "
    + _READ_BY_PROCESSOR
    + " AND a.ingested_on < ($2::timestamptz AT TIME ZONE 'UTC')::date"
)
_RETIRE_AGENT = (
    "INSERT INTO chaos_retired SELECT a.* " + _READ_BY_PROCESSOR + " AND a.agent_id = $2"
)

IN_COMMIT = "state = 'active' AND query ILIKE 'COMMIT%' AND wait_event = 'SyncRep'"
IDLE_IN_TRANSACTION = "state = 'idle in transaction'"
FAULT_SPACING_S = 0.5
ZOMBIE_STALL_S = 8.0
"""How long a zombie-to-be stalls after fetching: it is SIGSTOPped within this."""
STALL_BEFORE_COMMIT_S = 5.0
SHOWN_LOSSES = 2
"""The largest lost runs whose workers' logs are printed (each up to loss_logs.LIMIT lines)."""
HEAD_START = 0.1
"""The workers start once this share of the records is in the topic: the backlog lasts
(ingest runs about as fast as production), so late faults still meet work in flight."""


class ChaosError(LoadError):
    """The chaos run could not be carried out (not: the guarantees failed)."""


def run_chaos(cfg: ChaosConfig, out: TextIO = sys.stdout) -> ChaosReport:
    """One chaos run on its own stack (see the module docstring); prints as it goes."""
    from ackline.dev import stack

    seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(1, 1 << 31)
    state_dir = cfg.state_dir.absolute()
    print(f"chaos seed {seed} (reproduce: {cfg.command(seed)})", file=out, flush=True)
    print(f"== starting the chaos stack in {state_dir}", file=out, flush=True)
    info = stack.up(state_dir)
    try:
        run = _Run(cfg, seed, info.kafka_bootstrap, info.database_url, state_dir, out)
        try:
            report = run.execute()
        finally:
            run.close()
        if report.ok:
            run.discard()  # a failed run keeps its database, topic, manifest and logs
        return report
    finally:
        if not cfg.keep_stack:
            stack.down(state_dir)


class _Run:
    """One chaos run: its database, topic, producer child, workers and counts."""

    def __init__(
        self,
        cfg: ChaosConfig,
        seed: int,
        bootstrap: str,
        admin_dsn: str,
        state_dir: Path,
        out: TextIO,
    ) -> None:
        self.cfg = cfg
        self.seed = seed
        self.bootstrap = bootstrap
        self.state_dir = state_dir
        self.out = out
        self.started = time.monotonic()
        stamp = time.strftime("%Y%m%d%H%M%S")
        self.name = f"chaos-{seed}-{stamp}"
        self.run_dir = state_dir / "runs" / self.name
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.manifest = self.run_dir / "manifest.jsonl.gz"
        self.summary = self.run_dir / "produced.json"
        self.pause_file = self.run_dir / "produce.pause"
        self.paused_file = self.run_dir / "produce.paused"
        self.hold_file = self.run_dir / "produce.hold"
        self.admin = Pg(admin_dsn)
        self.dsn = admin_dsn.rsplit("/", 1)[0] + f"/chaos_{seed}_{stamp}"
        self.pg = Pg(self.dsn)
        self.counts = Counts()
        self.rng = random.Random(seed ^ 0x5EED)  # choices made while running (stall points)
        self.producer: subprocess.Popen[bytes] | None = None
        self._produce_log: IO[bytes] | None = None
        self.pool: WorkerPool | None = None
        self.processors: WorkerPool | None = None
        self.env: dict[str, str] = {}
        self.watch: OffsetWatch | None = None
        self._last_sample = self._last_scrape = 0.0
        self._expected: int | None = None

    # ---- lifecycle -------------------------------------------------------------------

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {text}", file=self.out, flush=True)

    def execute(self) -> ChaosReport:
        self._prepare()
        faults = plan(
            self.seed,
            workers=self.cfg.workers,
            kills=self.cfg.kills,
            stops=self.cfg.stops,
            broker_restarts=self.cfg.broker_restarts,
            pg_restarts=self.cfg.pg_restarts,
            commit_faults=self.cfg.commit_faults,
            processor_kills=self.cfg.processor_kills,
            retention_drops=self.cfg.retention_drops,
            erasures=self.cfg.erasures,
        )
        for n, fault in enumerate(faults, 1):
            self._wait_progress(fault.at)
            wait_for(lambda: False, FAULT_SPACING_S, self._tick)  # not all in one instant
            self.say(f"{self._progress():4.0%} fault {n}/{len(faults)}: {fault.describe()}")
            self._execute(fault)
        self._top_up_stops()
        self._top_up_commits()
        self.hold_file.unlink()  # the faults are done: production may end
        self._drain()
        return self._finish()

    def _broker(self, fault: Fault) -> None:
        """Restart the broker; while production runs, between two of its transactions.

        The producer child parks in its ``pace`` hook while the pause file exists and says
        so with the paused file: a transaction open across a broker crash would abort, and
        the manifest must record every record as committed or aborted for certain.
        """
        from ackline.dev import stack

        def parked() -> bool:
            return self.paused_file.exists() or self._produced()

        self.pause_file.touch()
        try:
            if not wait_for(parked, 600, self._tick):
                raise ChaosError("the producer did not pause for the broker restart")
            if self.watch is not None:
                self.watch.reset()  # no request of it may straddle the restart
            stack.restart_kafka(self.state_dir, hard=fault.hard)
        finally:
            self.pause_file.unlink(missing_ok=True)
        self.counts.broker_restarts += 1

    def _prepare(self) -> None:
        from ackline.sinks.admin.migrate import migrate
        from ackline.streams.admin import ensure_topic

        self.admin.set_ghost_standby(False)  # a previous run may have died with it set
        database = self.dsn.rsplit("/", 1)[1]
        self.admin.retry(f'CREATE DATABASE "{database}"')

        async def apply() -> None:
            conn = await asyncpg.connect(self.dsn)
            try:
                await migrate(conn)
                await conn.execute(RETIRED_TABLE)
            finally:
                await conn.close()

        run_stoppable(apply())
        topic_config = {"max.message.bytes": str(2 * 1_048_576)}
        ensure_topic(self.bootstrap, self.name, self.cfg.partitions, topic_config)
        self.say(f"topic {self.name} ({self.cfg.partitions} partitions), database {database}")
        self._produce_log = (self.run_dir / "produce.log").open("ab")
        self.hold_file.touch()  # production goes on until the faults are done (execute)
        self.producer = subprocess.Popen(
            [sys.executable, "-m", "ackline.load.chaos.harness", json.dumps(self._child_args())],
            stdin=subprocess.DEVNULL,
            stdout=self._produce_log,
            stderr=subprocess.STDOUT,
        )
        self.say(f"producing {self.cfg.events:,} events (child pid {self.producer.pid})")
        head = HEAD_START * self._estimate()
        if not wait_for(lambda: self._in_topic() >= head or self._produced(), 900):
            raise ChaosError("production did not get going")
        env = {
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
        }
        self.env = env
        wc = self.cfg.writer_connections
        self.pool = WorkerPool(
            self.run_dir,
            env,
            self.cfg.workers,
            slot_env={
                s: {"ACKLINE_WRITER_CONNECTIONS": str(wc[s % len(wc)])}
                for s in range(self.cfg.workers)
            }
            if wc
            else {},
        )
        for slot in range(self.cfg.workers):
            self.pool.start(slot)
        self.watch = OffsetWatch(self.bootstrap, self.name, self.name, self.cfg.partitions)
        self.say(f"{self.cfg.workers} workers started in group {self.name}")
        if self.cfg.processor_kills > 0:
            self.processors = WorkerPool(
                self.run_dir, env, 1, command=("process", "runs"), prefix="p"
            )
            self.processors.start(0)
            self.say("the runs processor started beside them")

    def _child_args(self) -> dict[str, Any]:
        return {
            "bootstrap": self.bootstrap,
            "topic": self.name,
            "partitions": self.cfg.partitions,
            "events": self.cfg.events,
            "knobs": self.cfg.knobs().as_dict(),
            "seed": self.seed,
            "manifest": str(self.manifest),
            "summary": str(self.summary),
            "rate": self.cfg.produce_rate,
            "pause": str(self.pause_file),
            "paused": str(self.paused_file),
            "hold": str(self.hold_file),
        }

    def close(self) -> None:
        if self.watch is not None:
            self.watch.reset()
        if self.pool is not None:
            self.pool.shutdown()
        if self.processors is not None:
            self.processors.shutdown()
        if self.producer is not None and self.producer.poll() is None:
            self.producer.kill()
            self.producer.wait(30)
        if self._produce_log is not None:
            self._produce_log.close()
        try:
            self.admin.set_ghost_standby(False)
        finally:
            self.admin.close()
            self.pg.close()

    def discard(self) -> None:
        """Drop the run's database and topics and delete its directory (after an ok run:
        the chaos stack would otherwise grow by a million rows a run)."""
        from ackline.streams.admin import delete_topic
        from ackline.streams.errors import TopicError

        admin_dsn, database = self._run_database()
        admin = Pg(admin_dsn)
        try:
            admin.retry(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            admin.close()
        for topic in (self.name, f"{self.name}.dlq"):
            try:
                delete_topic(self.bootstrap, topic)
            except TopicError as exc:
                self.say(f"could not delete topic {topic}: {exc}")
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _run_database(self) -> tuple[str, str]:
        """(an administrator's DSN, the run's database name), for :meth:`discard`."""
        return self.admin.dsn, self.dsn.rsplit("/", 1)[1]

    # ---- waiting -----------------------------------------------------------------------

    def _tick(self) -> None:
        """Between polls: restart workers that ended by themselves, sample the offsets,
        scrape the fenced counters, and fail fast if production failed; raise the stop
        again if a library dropped the SIGTERM's (ackline.core.signals)."""
        raise_if_stop_lost()
        pool = self._pool()
        for ended in pool.reap():
            inc = ended.incarnation
            if ended.armed_kill:
                self.counts.kills += 1
                self.counts.armed_kills += 1
                self.say(f"{inc.worker_id} killed itself at its armed point ({inc.arm})")
            else:
                self.counts.unexpected_exits += 1
                tail = "\n".join(inc.log().splitlines()[-5:])
                self.say(f"{inc.worker_id} exited {ended.returncode} by itself:\n{tail}")
            pool.start(inc.slot)
        self._reap_processors()
        now = time.monotonic()
        if now - self._last_sample >= 1.0 and self.watch is not None:
            self._last_sample = now
            self.watch.sample(self.pg)
        if now - self._last_scrape >= 3.0:
            self._last_scrape = now
            pool.scrape_all()
        if self.producer is not None and self.producer.poll() not in (None, 0):
            raise ChaosError(production_failed(self.run_dir / "produce.log"))

    def _reap_processors(self) -> None:
        """A processor that ended by itself is counted and restarted (unarmed)."""
        if self.processors is None:
            return
        for ended in self.processors.reap():
            inc = ended.incarnation
            if ended.armed_kill:
                self.counts.processor_kills += 1
                self.counts.processor_armed_kills += 1
                self.say(f"processor {inc.worker_id} killed itself at its armed point ({inc.arm})")
            else:
                self.counts.processor_exits += 1
                tail = "\n".join(inc.log().splitlines()[-5:])
                self.say(f"processor {inc.worker_id} exited {ended.returncode} by itself:\n{tail}")
            self.processors.start(inc.slot)

    def _kill_processor(self, fault: Fault) -> None:
        """SIGKILL the runs processor wherever it is; restart it (armed, if the plan says)."""
        procs = self.processors
        if procs is None:
            return
        self._reap_processors()
        victim = procs.current(0)
        if victim is not None:
            procs.kill(victim)
            self.counts.processor_kills += 1
        else:
            self.counts.skipped.append("a processor kill found no live processor")
        procs.start(0, arm=fault.arm)

    def _pool(self) -> WorkerPool:
        if self.pool is None:
            raise ChaosError("no workers")
        return self.pool

    def _produced(self) -> bool:
        return self.producer is not None and self.producer.poll() == 0

    def _progress(self) -> float:
        done = self.pg.ingested_records(self.name)
        if done is None:
            return 0.0
        if self._expected is None and self._produced():
            self._expected = int(json.loads(self.summary.read_text())["committed"])
        return done / max(self._expected or self._estimate(), 1)

    def _drained_now(self) -> bool:
        return self._produced() and self._progress() >= 0.999

    def _estimate(self) -> float:
        """The committed records production will write (known exactly once it is done)."""
        k = self.cfg.knobs()
        return self.cfg.events * (
            1 + k.redeliver + k.retry + k.conflict_ledger + k.conflict_pk + k.poison
        )

    def _in_topic(self) -> int:
        """Offsets taken in the topic so far (records, aborted ones, markers)."""
        from ackline.streams.errors import KafkaUnavailableError
        from ackline.streams.kafkainfo import topic_offsets

        if self.producer is not None and self.producer.poll() not in (None, 0):
            raise ChaosError(production_failed(self.run_dir / "produce.log"))
        try:
            found = topic_offsets(self.bootstrap, {}, self.name, self.name, timeout=5)
        except KafkaUnavailableError:
            return 0
        return sum(p.high for p in found or [])

    def _wait_progress(self, at: float) -> None:
        last, since = -1.0, time.monotonic()
        while True:
            self._tick()
            progress = self._progress()
            if progress >= at or (self._produced() and progress >= 0.999):
                return
            if progress > last:
                last, since = progress, time.monotonic()
            elif time.monotonic() - since > 600:
                raise ChaosError(f"ingest made no progress for 600 s (at {progress:.1%})")
            time.sleep(0.2)

    # ---- faults ------------------------------------------------------------------------

    def _execute(self, fault: Fault) -> None:
        if fault.kind == "kill":
            self._kill(fault)
        elif fault.kind == "stop":
            if not self._zombie(fault.slot):
                self.counts.skipped.append(f"a zombie in slot {fault.slot} was not fenced")
        elif fault.kind == "commit":
            self._commit_fault(fault)
        elif fault.kind == "broker":
            self._broker(fault)
        elif fault.kind == "processor":
            self._kill_processor(fault)
        elif fault.kind == "retention":
            self._retention()
        elif fault.kind == "erase":
            self._erase()
        else:
            from ackline.dev import stack

            stack.restart_postgres(self.state_dir, hard=fault.hard)
            self.counts.pg_restarts += 1

    def _retention(self) -> None:
        """Drop, by retention, every partition ingested before tomorrow (by the database's
        clock): today's, which the workers are writing. Forced (the runs processor is
        always a little behind) and without touching the retention policy. In the same
        transaction, under a lock that holds ingest and readers for a moment, the rows
        the processor had already read are kept aside in ``chaos_retired`` for the runs
        check (those it had not read it never sees)."""
        from ackline.sinks.admin.partitions import apply_retention

        async def drop(conn: asyncpg.Connection) -> list[str]:
            async with conn.transaction():
                await conn.execute(_HOLD)
                tomorrow = await conn.fetchval(_TOMORROW)
                await conn.execute(_RETIRE_BEFORE, PROCESSOR_READER, tomorrow)
                dropped = await apply_retention(
                    conn, timedelta(0), now=tomorrow, force=True, set_policy=False
                )
            return [d.name for d in dropped if d.dropped]

        names = self._with_retries("the retention drop", drop)
        if names:
            self.counts.retention_drops += 1
            self.say(f"retention dropped {', '.join(names)}")
        else:
            self.counts.skipped.append("the retention drop found no partition to drop")

    def _erase(self) -> None:
        """Erase the agent with the most stored events (its later events are ingested
        after the erasure; replays of the erased ones are duplicates or body-less
        conflicts). The rows the runs processor had read are kept aside first, as for
        the retention drop."""
        from ackline.sinks.admin.erase import erase

        async def run(conn: asyncpg.Connection) -> tuple[str, int]:
            async with conn.transaction():
                await conn.execute(_HOLD)
                agent = await conn.fetchval(_BUSIEST_AGENT)
                if agent is None:
                    return "", 0
                await conn.execute(_RETIRE_AGENT, PROCESSOR_READER, str(agent))
                done = await erase(conn, "agent", str(agent), reason="chaos")
            return str(agent), done.events

        # Nothing stored yet (a retention drop just took every stored event): wait for
        # the workers to store more, which they do while the run produces.
        deadline = time.monotonic() + _ERASE_WAIT_S
        while True:
            agent, events = self._with_retries("the erasure", run)
            if agent or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        if agent:
            self.counts.erasures += 1
            self.counts.erased_events += events
            self.say(f"erased agent {agent}: {events} events")
        else:
            self.counts.skipped.append("the erasure found no stored event")

    def _with_retries(self, what: str, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """Run ``work`` on a fresh connection as the superuser, again after a failure
        (a PostgreSQL restart, a lock that timed out) for up to two minutes."""
        from ackline.core.errors import AcklineError

        async def once() -> T:
            conn = await asyncpg.connect(self.dsn, timeout=10)
            try:
                return await work(conn)
            finally:
                await conn.close()

        deadline = time.monotonic() + 120
        while True:
            try:
                return run_stoppable(once())
            except (AcklineError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                if time.monotonic() > deadline:
                    raise ChaosError(f"{what} failed: {exc}") from exc
                self.say(f"{what} failed, retrying: {exc}")
                wait_for(lambda: False, 2.0, self._tick)

    def _kill(self, fault: Fault) -> None:
        pool = self._pool()
        victim = pool.pick(fault.slot)
        if victim is None:
            self.counts.skipped.append("a kill found no live worker")
            return
        pool.kill(victim)
        self.counts.kills += 1
        pool.start(victim.slot, arm=fault.arm)

    def _restart_armed(self, slot: int, arm: str, stall_s: float) -> Incarnation:
        pool = self._pool()
        old = pool.current(slot)
        if old is not None:
            pool.terminate(old)
        return pool.start(slot, arm=arm, stall_seconds=stall_s)

    def _zombie(self, slot: int) -> bool:
        """A worker stalled after fetching a batch is SIGSTOPped until every partition it
        owned is claimed by others, then SIGCONTed: its batch must be fenced."""
        pool = self._pool()
        if self._drained_now():
            self.say("nothing left to fetch: no zombie")
            return False
        z = self._restart_armed(slot, f"after_fetch=stall@{self.rng.randint(2, 3)}", ZOMBIE_STALL_S)
        stalled = wait_for(
            lambda: "fault point after_fetch fired" in z.log() or self._drained_now(),
            120,
            self._reap_only,
        )
        if not stalled or "fault point after_fetch fired" not in z.log():
            self.say(f"{z.worker_id} never stalled (no batch to fetch?)")
            return False
        pool.stop(z)
        self.counts.stops += 1
        owned = self.pg.owned_by(self.name, z.worker_id)
        self.say(f"{z.worker_id} stopped holding a batch; it owned partitions {sorted(owned)}")
        # Production parks while the partitions move (a session timeout, and up to the
        # statement bound when the zombie stopped inside a COPY): the faults planned after
        # this one still find production going.
        self.pause_file.touch()
        try:
            taken = wait_for(lambda: not self.pg.owned_by(self.name, z.worker_id), 180, self._tick)
        finally:
            self.pause_file.unlink(missing_ok=True)
        pool.cont(z)
        if not taken:
            self.say(f"{z.worker_id}: its partitions were not all re-claimed")
            return False
        fenced = wait_for(lambda: FENCED_LINE in z.log(), 120, self._tick)
        pool.scrape(z)
        if fenced:
            self.counts.stops_fenced += 1
            self.say(
                f"{z.worker_id} resumed and its batch was fenced (metric {z.fenced_scraped:.0f})"
            )
        return fenced

    def _top_up_stops(self) -> None:
        """Zombies that were not fenced (the stall ended before SIGSTOP) are tried again."""
        tries = 0
        while self.counts.stops_fenced < self.cfg.stops and tries < self.cfg.stops + 3:
            tries += 1
            self._zombie(self.rng.randrange(self.cfg.workers))

    def _top_up_commits(self) -> None:
        """COMMIT faults that found nothing to cut (the schedule ran late and the backlog
        was gone) are tried again, in a COMMIT, while production still goes on: it is
        held open until they are done (topup)."""
        tries = 0
        while (
            self.counts.commit_faults < self.cfg.commit_faults
            and tries < self.cfg.commit_faults + 3
            and not self._produced()
        ):
            tries += 1
            self.say(
                f"COMMIT faults {self.counts.commit_faults} of {self.cfg.commit_faults}: "
                "one more, in a COMMIT"
            )
            self._commit_fault(Fault(self._progress(), "commit", method="in_commit"))

    def _commit_fault(self, fault: Fault) -> None:
        if self._drained_now():
            self.counts.skipped.append("nothing left to commit: no COMMIT fault")
            return
        if fault.method == "before_commit":
            w = self._restart_armed(fault.slot, "before_commit=stall@2", STALL_BEFORE_COMMIT_S)
            stalled = wait_for(
                lambda: "fault point before_commit fired" in w.log() or self._drained_now(),
                120,
                self._reap_only,
            )
            if not stalled or "fault point before_commit fired" not in w.log():
                self.counts.skipped.append(f"{w.worker_id} never stalled before COMMIT")
                return
            pids = self.pg.writer_backends(IDLE_IN_TRANSACTION, w.worker_id)
            if pids and self.pg.terminate(pids[0]):
                self.counts.commit_faults += 1
            return
        for _ in range(20):
            if self._drained_now():
                break  # nothing commits any more
            if self._terminate_in_commit():
                self.counts.commit_faults += 1
                self.counts.commit_faults_in_commit += 1
                return
            wait_for(lambda: False, 2.0, self._tick)  # let claims and batches through
        self.counts.skipped.append("no COMMIT in flight to terminate")

    def _terminate_in_commit(self) -> bool:
        """Hold every COMMIT (ghost synchronous standby) for up to 3 s; terminate the
        first writer backend seen waiting in its COMMIT; release the rest. Claims wait
        too while it is on, hence the short window."""
        found: list[int] = []

        def in_commit() -> bool:
            found[:] = self.pg.writer_backends(IN_COMMIT)
            return bool(found)

        self.admin.set_ghost_standby(True)
        try:
            return wait_for(in_commit, 3.0) and self.pg.terminate(found[0])
        finally:
            self.admin.set_ghost_standby(False)

    def _reap_only(self) -> None:
        for ended in self._pool().reap():
            if ended.armed_kill:
                self.counts.kills += 1
                self.counts.armed_kills += 1
            else:
                self.counts.unexpected_exits += 1
            self._pool().start(ended.incarnation.slot)
        self._reap_processors()

    # ---- the end -----------------------------------------------------------------------

    def _drain(self) -> None:
        self.say("faults done; waiting for production and the drain")
        if not wait_for(self._produced, 3600, self._tick):
            raise ChaosError("production did not finish")
        loaded = read_manifest(self.manifest)
        last = expected_outcome(loaded.records).max_offsets
        del loaded

        def drained() -> bool:
            offsets = self.pg.next_offsets(self.name, self.name)
            return offsets is not None and is_drained(last, offsets)

        if not wait_for(drained, self.cfg.drain_timeout_s, self._tick):
            raise ChaosError(f"not drained after {self.cfg.drain_timeout_s:.0f} s")
        self.say("drained")

    def _finish(self) -> ChaosReport:
        pool = self._pool()
        pool.scrape_all()
        codes = pool.shutdown()
        if any(code != 0 for code in codes):
            self.say(f"worker exit statuses at shutdown: {codes}")
        fenced = sum(i.fenced() for i in pool.incarnations)
        logged = sum(i.fenced_lines() for i in pool.incarnations)
        runs = self._finish_runs()
        self.say("verifying against the manifest")
        verdict = run_stoppable(verify(self.dsn, self.manifest, self.name))
        self._show_loss_logs(pool, verdict.lost_windows)
        watch = self.watch
        return ChaosReport(
            seed=self.seed,
            config=self.cfg,
            counts=self.counts,
            verdict=verdict,
            fenced_batches=fenced,
            fenced_log_lines=logged,
            offset_samples=watch.samples if watch else 0,
            max_kafka_ahead_of_db=watch.max_ahead if watch else 0,
            duration_s=time.monotonic() - self.started,
            runs=runs,
        )

    def _show_loss_logs(self, pool: WorkerPool, windows: Sequence[LossWindow]) -> None:
        """Print what the workers logged around the largest lost runs (the verdict below
        names them): CI keeps this output and nothing else of a failed run."""
        for window in windows[:SHOWN_LOSSES]:
            self.say(
                f"what the workers logged around the loss on partition {window.partition} "
                f"(from {loss_logs.LEAD_S:g} s before the batches around it to "
                f"{loss_logs.TAIL_S:g} s after them)"
            )
            logs = ((i.worker_id, i.log().splitlines()) for i in pool.incarnations)
            for line in loss_logs.context(logs, window):
                print(f"    {line}", file=self.out)
        self.out.flush()

    def _finish_runs(self) -> RunsCheck | None:
        """Stop the following processor (SIGTERM), let one catch up to the drained feed,
        then recompute every run from activity and compare."""
        if self.processors is None:
            return None
        self._reap_processors()
        codes = self.processors.shutdown()
        if any(code != 0 for code in codes):
            self.say(f"processor exit statuses at shutdown: {codes}")
        self.say("the runs processor catches up")
        log_path = self.run_dir / "logs" / "p-final.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACKLINE_")}
        env.update(self.env)
        env.update({"ACKLINE_WORKER_ID": "p-final", "ACKLINE_LOG_FORMAT": "json"})
        with log_path.open("ab") as log:
            done = subprocess.run(
                [sys.executable, "-m", "ackline", "process", "runs", "--until-caught-up"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=self.cfg.drain_timeout_s,
                check=False,
            )
        if done.returncode != 0:
            self.counts.skipped.append(
                f"the final runs catch-up exited {done.returncode} (see {log_path})"
            )
        check = run_stoppable(check_runs_at(self.dsn, retired=True))
        self.say(f"runs projection: {check.runs:,} runs, {check.mismatches} mismatches")
        return check


def _produce_child(args: dict[str, Any]) -> None:
    """The production child process: produce, then record what was committed."""
    from ackline.load.produce import produce

    knobs, seed = Knobs(**args["knobs"]), int(args["seed"])
    namespace = f"chaos-{seed}"
    pace = Pacer(
        float(args["rate"]), Path(args["pause"]), Path(args["paused"]), planned=args["events"]
    )
    extend: Callable[[Iterable[Send]], Iterable[Send]] | None = None
    if "hold" in args:  # side by side never holds its production open
        hold = Path(args["hold"])
        extend = functools.partial(
            held_open, held=hold.exists, knobs=knobs, seed=seed, namespace=namespace
        )
    summary = produce(
        args["bootstrap"],
        args["topic"],
        partitions=args["partitions"],
        events=args["events"],
        knobs=knobs,
        seed=seed,
        manifest_path=Path(args["manifest"]),
        progress=False,
        namespace=namespace,
        run_id=namespace,
        out=sys.stdout,
        pace=pace,
        extend=extend,
    )
    Path(args["summary"]).write_text(
        json.dumps({"records": summary.records, "committed": summary.committed_records}),
        encoding="utf-8",
    )


def report_json(report: ChaosReport) -> str:
    return json.dumps(report.to_json())


__all__ = ["ChaosConfig", "ChaosError", "ChaosReport", "report_json", "run_chaos"]

if __name__ == "__main__":
    _produce_child(json.loads(sys.argv[1]))
