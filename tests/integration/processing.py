"""Helpers of the processor tests: synthetic agent runs, ingest by COPY, the CLI.

:func:`synthetic_runs` makes whole agent runs fast (plain dicts, no validation: the
load generator validates every envelope and takes ~20 s per 100k events), interleaved
and jittered so a run's events arrive out of order, with some re-emitted under a new
``txn_id`` (semantic duplicates that reach ``activity`` as rows of their own).

:func:`copy_ingest` writes them the way the feed sees ingest: per chunk, one transaction
holding the ``activity`` rows (binary COPY) and their ``ingest_batches`` row, whose
``commit_xid`` default is that transaction's xid, and a ``pg_notify`` on the feed's
channel. It skips the transaction ledger and the Kafka offsets, which the feed never
reads.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "daily_tool_calls"
T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)

_COLUMNS = (
    "event_id",
    "txn_id",
    "type",
    "agent_id",
    "request_id",
    "occurred_at",
    "schema_version",
    "payload",
    "body_hash",
    "src_topic",
    "src_partition",
    "src_offset",
    "batch_id",
    "ingested_on",  # the partition key (docs/retention.md): the day of the transaction
)
_HASH = bytes(32)
_TODAY = "SELECT (now() AT TIME ZONE 'UTC')::date"
_BATCH = """
INSERT INTO ingest_batches (batch_id, group_id, worker, ranges, events, inserted,
    duplicates_ledger, duplicates_pk, conflicts_ledger, conflicts_pk, rejects)
VALUES ($1, 'copy', 'copy', '[]', $2, $2, 0, 0, 0, 0, 0)
"""


@dataclass
class Ev:
    type: str
    agent_id: str
    request_id: str
    occurred_at: datetime
    payload: dict[str, Any]
    txn_id: str
    event_id: uuid.UUID = field(default_factory=uuid.uuid4)

    def again(self, rng: random.Random, txn_id: str) -> Ev:
        """The same fact re-emitted as a new unit of work (new txn_id and event_id)."""
        return Ev(
            self.type,
            self.agent_id,
            self.request_id,
            self.occurred_at,
            self.payload,
            txn_id,
            _uuid(rng),
        )


def _uuid(rng: random.Random) -> uuid.UUID:
    return uuid.UUID(int=rng.getrandbits(128), version=4)


def _run(rng: random.Random, agent: str, start: datetime, n: int) -> list[Ev]:
    req, run = f"req-{n:07d}", f"run-{n:07d}"
    t = start
    out: list[Ev] = []

    def add(type_: str, payload: dict[str, Any], txn: str) -> None:
        nonlocal t
        t += timedelta(milliseconds=rng.randint(1, 900))
        out.append(Ev(type_, agent, req, t, payload, txn, _uuid(rng)))

    add(
        "agent.requested",
        {"prompt": "p", "requested_by": "u", "priority": 1, "tools": []},
        f"req:{req}",
    )
    add("agent.started", {"run_id": run, "model": rng.choice(["m-a", "m-b"])}, f"start:{req}")
    seq = 0
    steps = rng.randint(1, 6)
    for s in range(1, steps + 1):
        seq += 1
        add("agent.step", {"run_id": run, "step": s, "thought": "t"}, f"{run}:{seq}")
        if rng.random() < 0.6:
            call = f"call-{n}-{s}"
            seq += 1
            add(
                "tool.called",
                {
                    "run_id": run,
                    "call_id": call,
                    "tool": rng.choice(["search", "sql"]),
                    "arguments": {},
                },
                f"{run}:{seq}",
            )
            seq += 1
            ok = rng.random() < 0.85
            add(
                "tool.result",
                {"run_id": run, "call_id": call, "ok": ok, "output": "o", "duration_ms": 3},
                f"{run}:{seq}",
            )
        if rng.random() < 0.3:
            seq += 1
            add(
                "message.posted",
                {"run_id": run, "role": "assistant", "content": "c"},
                f"{run}:{seq}",
            )
    if rng.random() < 0.85:  # some runs never end: they stay "started"
        seq += 1
        if rng.random() < 0.1:
            add(
                "agent.failed",
                {"run_id": run, "error_kind": "timeout", "error": "e"},
                f"{run}:{seq}",
            )
        else:
            add(
                "agent.finished",
                {
                    "run_id": run,
                    "steps": steps,
                    "tokens_in": rng.randint(1, 9000),
                    "tokens_out": rng.randint(1, 900),
                    "summary": "s",
                },
                f"{run}:{seq}",
            )
    return out


def synthetic_runs(
    events: int, seed: int = 1, *, duplicates: float = 0.02, jitter: int = 40
) -> list[Ev]:
    """About ``events`` events of whole runs on 32 agents, each event moved up to
    ``jitter`` places from where its run put it (runs interleave, and a run's events
    swap), and a share ``duplicates`` of steps and tool calls re-emitted under a new
    txn_id and event_id further on."""
    rng = random.Random(seed)
    out: list[Ev] = []
    n = 0
    while len(out) < events:
        out.extend(_run(rng, f"agent-{n % 32:02d}", T0 + timedelta(seconds=n), n))
        n += 1
    del out[events:]
    keyed = [(i + rng.uniform(0, jitter), e) for i, e in enumerate(out)]
    for i, e in enumerate(out):
        if e.type in ("agent.step", "tool.called") and rng.random() < duplicates:
            keyed.append((i + rng.uniform(0, 10 * jitter), e.again(rng, f"again:{e.txn_id}:{i}")))
    keyed.sort(key=lambda k: k[0])
    return [e for _, e in keyed]


def _record(e: Ev, partition: int, offset: int, batch_id: int, day: date) -> tuple[Any, ...]:
    payload = json.dumps(e.payload, separators=(",", ":"))
    return (
        e.event_id,
        e.txn_id,
        e.type,
        e.agent_id,
        e.request_id,
        e.occurred_at,
        1,
        payload,
        _HASH,  # the feed never reads it
        "copy",
        partition,
        offset,
        batch_id,
        day,
    )


async def copy_ingest(conn: asyncpg.Connection, events: Sequence[Ev], chunk: int = 2000) -> int:
    """Write ``events`` as ingest batches of ``chunk`` (see the module docstring);
    returns the number of batches."""
    offsets: dict[int, int] = {}
    batches = 0
    for at in range(0, len(events), chunk):
        part = events[at : at + chunk]
        async with conn.transaction():
            batch_id = int(await conn.fetchval("SELECT nextval('ingest_batch_id_seq')"))
            day = await conn.fetchval(_TODAY)
            records = []
            for e in part:
                p = zlib.crc32(e.agent_id.encode()) % 4  # an agent stays on one partition
                offsets[p] = offsets.get(p, -1) + 1
                records.append(_record(e, p, offsets[p], batch_id, day))
            await conn.copy_records_to_table("activity", records=records, columns=_COLUMNS)
            await conn.execute(_BATCH, batch_id, len(part))
            await conn.execute("SELECT pg_notify('ackline_batches', $1)", str(batch_id))
        batches += 1
    return batches


def cli_env(dsn: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("ACKLINE_")}
    env.update(
        {
            "ACKLINE_DATABASE_URL": dsn,
            "ACKLINE_LOG_FORMAT": "text",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLE)]),
        }
    )
    env.update(extra)
    return env


@dataclass
class Done:
    code: int
    out: str
    err: str

    @property
    def summary(self) -> dict[str, Any]:
        """The last stdout line, a JSON object."""
        lines = self.out.strip().splitlines()
        assert lines, f"no output (exit {self.code}):\n{self.err[-3000:]}"
        found: dict[str, Any] = json.loads(lines[-1])
        return found

    def report(self, name: str) -> dict[str, Any]:
        for r in self.summary["processors"]:
            if r["processor"] == name:
                return dict(r)
        raise AssertionError(f"no report for {name} in {self.summary}")


def ackline(dsn: str, *args: str, timeout: float = 240, **env: str) -> Done:
    done = subprocess.run(
        [sys.executable, "-m", "ackline", *args],
        env=cli_env(dsn, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )
    return Done(done.returncode, done.stdout, done.stderr)


class Process:
    """A long-running `ackline process ...` (SIGTERM to stop); ``prefix`` goes before the
    command (``ip netns exec NS``: it runs in another network namespace)."""

    def __init__(
        self, dsn: str, tmp: Path, tag: str, *args: str, prefix: Sequence[str] = (), **env: str
    ) -> None:
        self.tag = tag
        self.out_path = tmp / f"{tag}.out"
        self.err_path = tmp / f"{tag}.err"
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "ackline", "process", *args],
                env=cli_env(dsn, **env),
                stdout=out,
                stderr=err,
                cwd=ROOT,
            )

    def log(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.tag} exited {self.proc.returncode}:\n{self.log()[-3000:]}"
                )
            if "following the feed" in self.log():
                return
            time.sleep(0.1)
        raise AssertionError(f"{self.tag} did not start:\n{self.log()[-3000:]}")

    def stop(self, timeout: float = 60) -> Done:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        return Done(code, self.out_path.read_text(), self.log())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def scrape(port: int) -> dict[str, float]:
    """The samples of the /metrics endpoint on ``port`` (of this host), by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            found[head] = float(value)
    return found
