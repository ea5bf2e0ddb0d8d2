"""Poison that could never be dead-lettered (issue 11, item 6), on both runtimes.

Every poison record must end in exactly one place — one reject row, keeping what could be
kept, pointing at one dead-letter record (or a stub that fits, carrying the original's
length and SHA-256) — and its partition must keep flowing, whatever its header keys,
header values, value size or key size. A dead-letter topic that cannot be written
(missing, not authorized) is the operator's to fix: the worker retries and says so at
ERROR, and never turns a valid record into a reject.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message, Producer

from ackline.load.manifest import ManifestRecord
from ackline.schemas import hash_envelope
from ackline.schemas.decode import Rejection, decode
from ackline.streams.admin import delete_topic, ensure_topic, partition_count
from ackline.streams.producer import serialize
from tests.integration.harness import Services, Worker, db, wait_until
from tests.integration.producing import set_max_message_bytes
from tests.integration.windows import (
    Item,
    Scenario,
    offset_rows,
    read_topic,
    step,
    verify_ok,
    wait_drained,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MIB = 1_048_576
STOP_BOUND_S = 30  # SIGTERM to exit: a worker still running after this ignores it


def _reason(value: bytes) -> str:
    result = decode(value)
    assert isinstance(result, Rejection), value[:40]
    return result.reason


def _hostile(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Records with any header bytes, through tests.integration.hostile_producer."""
    spec = json.dumps({"bootstrap": bootstrap, "topic": topic, "records": records})
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.hostile_producer"],
        input=spec,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [(int(p), int(o)) for p, o in json.loads(done.stdout)]


def _raw_record(
    partition: int, value: bytes, headers: list[tuple[bytes, bytes | None]], key: bytes = b"k"
) -> dict[str, Any]:
    return {
        "partition": partition,
        "key": key.hex(),
        "value": value.hex(),
        "headers": [[k.hex(), None if v is None else v.hex()] for k, v in headers],
    }


def _big(
    bootstrap: str, topic: str, items: list[tuple[int, bytes, bytes]]
) -> list[tuple[int, int]]:
    """(partition, key, value) records of several MiB, uncompressed, not transactional."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "message.max.bytes": 16 * MIB, "acks": "all"}
    )
    placed: list[tuple[int, int]] = [(-1, -1)] * len(items)
    errors: list[Any] = []

    def report(i: int) -> Any:
        def on_delivery(err: Any, msg: Message) -> None:
            if err is not None:
                errors.append(err)
            else:
                placed[i] = (msg.partition() or 0, msg.offset() or 0)

        return on_delivery

    for i, (partition, key, value) in enumerate(items):
        producer.produce(topic, value=value, key=key, partition=partition, on_delivery=report(i))
        producer.flush(60)
    assert not errors, errors
    return placed


def _add(sc: Scenario, placed: list[tuple[int, int]], kinds: list[dict[str, Any]]) -> None:
    """Manifest lines for records sent outside the scenario's producer."""
    for (partition, offset), kind in zip(placed, kinds, strict=True):
        sc.records.append(
            ManifestRecord(
                seq=len(sc.records),
                partition=partition,
                offset=offset,
                committed=True,
                transaction=10_000 + len(sc.records),
                **kind,
            )
        )


def _dlq_headers(msg: Message) -> dict[str, bytes | None]:
    return {str(k): (v.encode() if isinstance(v, str) else v) for k, v in msg.headers() or []}


def _error_lines(worker: Worker, logger: str) -> list[str]:
    out = []
    for line in worker.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(entry, dict)
            and entry.get("level") == "error"
            and entry.get("logger", "").startswith(logger)
        ):
            out.append(str(entry.get("msg")))
    return out


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_item_6_poison_that_could_not_be_dead_lettered_ends_in_one_place(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str
) -> None:
    """Header keys that are not UTF-8 (one on a valid event too), a header value that is
    not, a 2 MiB incompressible value over a dead-letter topic created with the usual
    1 MiB limit, and an 11 MiB key over the dead-letter producer's own limit, between
    valid events on every partition. Before the fix: the confluent worker died (SIGSEGV
    reading the NULL key confluent-kafka left, or a stray UnicodeDecodeError), the faust
    fetcher raised UnicodeDecodeError on every fetch, the 2 MiB value was retried forever
    and the 11 MiB key's KafkaException escaped the dead-letter producer."""
    bootstrap = services.bootstrap
    group = f"g-{topic}"
    dlq = f"{topic}.dlq"
    set_max_message_bytes(bootstrap, topic, 16 * MIB)
    ensure_topic(bootstrap, dlq, 3, {"max.message.bytes": str(MIB)})
    sc = Scenario(bootstrap, topic, tmp_path / "poison.jsonl.gz")
    try:
        sc.send([Item.event(step(i), partition=i % 3) for i in range(30)])
        # Ordinary poison first: it warms up the header-reading call site (CPython then
        # specializes it, which is when confluent-kafka's NULL key turned into a crash).
        sc.send([Item.bad(b"not json %d" % i, "invalid_json", partition=0) for i in range(20)])
        bad_keys = [
            # the third: as a record replayed from the dead-letter topic carries it
            [(b"ok-before", b"v"), (b"\xff\xfek", b"v0"), (b"ackline.source.offset", b"999")],
            [(b"\xc3\x28", b"\x80"), (b"null-value", None), (b"after", b"fine")],
            [(b"x\x00y", b"1"), (b"\xed\xa0\x80", b"2"), (b"", b"3"), (b"\xc0\x80", b"4")],
        ]
        poison_values = [b"{bad %d" % i for i in range(len(bad_keys))]
        bad_value = [(b"bad-value", b"\xff\xfe\x00")]
        valid_env = step(500, thought="a valid event with a header key that is not UTF-8")
        hostile = [
            *(_raw_record(0, v, h) for v, h in zip(poison_values, bad_keys, strict=True)),
            _raw_record(1, b"{also bad", bad_value),
            _raw_record(2, serialize(valid_env), [(b"\xfe\xfftrace", b"t")], b"agent-1"),
        ]
        placed = _hostile(bootstrap, topic, hostile)
        _add(
            sc,
            placed,
            [
                *(
                    {"kind": "poison", "poison": _reason(v), "size": len(v)}
                    for v in [*poison_values, b"{also bad"]
                ),
                {
                    "kind": "original",
                    "event_id": str(valid_env.event_id),
                    "txn_id": valid_env.txn_id,
                    "body_hash": hash_envelope(valid_env).hex(),
                },
            ],
        )
        huge_value = os.urandom(2 * MIB)  # lz4 cannot shrink it under the 1 MiB topic limit
        huge_key = os.urandom(11 * MIB)  # over the dead-letter producer's 10 MiB
        big = _big(bootstrap, topic, [(1, b"k", huge_value), (2, huge_key, b"not json")])
        _add(
            sc,
            big,
            [
                {"kind": "poison", "poison": _reason(huge_value), "size": len(huge_value)},
                {"kind": "poison", "poison": _reason(b"not json"), "size": 8},
            ],
        )
        sc.send([Item.event(step(100 + i), partition=i % 3) for i in range(30)])
        manifest = sc.write()
    finally:
        sc.close()
    w = Worker(services, dsn, topic, tmp_path, name="w", runtime=runtime, batch_max_events=100)
    wait_drained(dsn, manifest, group, [w], timeout=180)
    assert w.stop() == 0, w.log()[-3000:]
    verify_ok(dsn, manifest, group)

    rejects = {
        (int(r["src_partition"]), int(r["src_offset"])): r
        for r in db(
            dsn,
            "SELECT src_partition, src_offset, raw_key, raw_value, detail, "
            "headers::text AS headers, dlq_topic, dlq_partition, dlq_offset "
            "FROM rejects WHERE group_id = $1",
            group,
        )
    }
    assert len(rejects) == 20 + len(bad_keys) + 1 + 2
    # Each reject row points at a dead-letter record of the same source record.
    dead = read_topic(bootstrap, dlq, len(rejects))
    letters = {(m.partition(), m.offset()): _dlq_headers(m) for m in dead}
    names = {(m.partition(), m.offset()): [str(k) for k, _ in m.headers() or []] for m in dead}
    for where, row in rejects.items():
        assert row["dlq_topic"] == dlq
        h = letters[(int(row["dlq_partition"]), int(row["dlq_offset"]))]
        assert (h["ackline.source.partition"], h["ackline.source.offset"]) == (
            str(where[0]).encode(),
            str(where[1]).encode(),
        )
    # The 2 MiB value: whole in the reject row, a stub with its length and digest in Kafka.
    row = rejects[big[0]]
    assert bytes(row["raw_value"]) == huge_value
    stub = letters[(int(row["dlq_partition"]), int(row["dlq_offset"]))]
    assert stub["ackline.value-truncated"] == str(len(huge_value)).encode()
    assert stub["ackline.truncated.value-sha256"] == hashlib.sha256(huge_value).hexdigest().encode()
    # The 11 MiB key: over the batch byte bound (8 MiB by default), which also bounds what
    # a reject row keeps: the value whole, the key's first bytes, and the detail says how
    # long the key was and its digest; the dead letter carries the digest too.
    row = rejects[big[1]]
    assert bytes(row["raw_value"]) == b"not json"
    bound = 8 * MIB - len(b"not json")
    assert bytes(row["raw_key"]) == huge_key[:bound]
    digest = hashlib.sha256(huge_key).hexdigest()
    assert (
        f"raw key kept: first {bound} of {len(huge_key)} bytes, sha256 {digest}" in (row["detail"])
    ), row["detail"]
    stub = letters[(int(row["dlq_partition"]), int(row["dlq_offset"]))]
    assert stub["ackline.truncated.key-sha256"] == hashlib.sha256(huge_key).hexdigest().encode()
    # Header keys that are not UTF-8: kept as far as the client let us know them.
    first = json.loads(rejects[placed[0]]["headers"])
    assert first[0] == {"key": "ok-before", "value": "v", "b64": base64.b64encode(b"v").decode()}
    assert first[1]["key"] is None and first[1]["b64"] == base64.b64encode(b"v0").decode()
    if runtime == "faust":  # aiokafka, made lenient, keeps the exact key bytes
        assert first[1]["key_b64"] == base64.b64encode(b"\xff\xfek").decode()
    else:  # confluent-kafka frees them before anyone can read them
        assert first[1]["key_lost"] == "true"
    third = json.loads(rejects[placed[2]]["headers"])
    # confluent-kafka cuts "x\0y" to "x" before anyone sees it; aiokafka keeps the NUL,
    # which neither jsonb nor a confluent-kafka header key can hold: it goes as bytes.
    assert [e["key"] for e in third] == ["x" if runtime == "confluent" else None, None, "", None]
    letter = letters[
        (int(rejects[placed[0]]["dlq_partition"]), int(rejects[placed[0]]["dlq_offset"]))
    ]
    assert letter["ackline.headers-undecodable"] == b"1"
    assert letter["ok-before"] == b"v"
    # one ackline.source.offset, the real one: the record's own "999" is not copied
    where = (int(rejects[placed[0]]["dlq_partition"]), int(rejects[placed[0]]["dlq_offset"]))
    assert names[where].count("ackline.source.offset") == 1, names[where]
    assert letter["ackline.source.offset"] == str(placed[0][1]).encode()
    # The header value that is not UTF-8: its bytes in the row and in the dead letter.
    value_row = json.loads(rejects[placed[3]]["headers"])
    assert value_row == [
        {"key": "bad-value", "value": None, "b64": base64.b64encode(b"\xff\xfe\x00").decode()}
    ]
    letter = letters[
        (int(rejects[placed[3]]["dlq_partition"]), int(rejects[placed[3]]["dlq_offset"]))
    ]
    assert letter["bad-value"] == b"\xff\xfe\x00"


def _poison_behind_a_gone_dead_letter_topic(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str
) -> tuple[Worker, Path, int]:
    """A worker that drained 30 events, then the dead-letter topic deleted and a poison
    record sent between valid events on partition 0; returns once the worker says at
    ERROR that it cannot write the dead letter (it retries): the worker, the manifest and
    the poison record's offset."""
    bootstrap = services.bootstrap
    group = f"g-{topic}"
    dlq = f"{topic}.dlq"
    sc = Scenario(bootstrap, topic, tmp_path / "gone.jsonl.gz")
    try:
        sc.send([Item.event(step(i), partition=i % 3) for i in range(30)])
        first = sc.write()
        w = Worker(services, dsn, topic, tmp_path, name="w", runtime=runtime)
        wait_drained(dsn, first, group, [w])
        delete_topic(bootstrap, dlq)
        wait_until(lambda: partition_count(bootstrap, dlq) is None, 60, f"{dlq} to be deleted")
        sent = sc.send(
            [
                *(Item.event(step(100 + i), partition=0) for i in range(5)),
                Item.bad(b"{poison", "invalid_json", partition=0),
                *(Item.event(step(200 + i), partition=0) for i in range(5)),
            ]
        )
        manifest = sc.write()
    finally:
        sc.close()
    wait_until(
        lambda: bool(_error_lines(w, "ackline.streams.deadletter")),
        120,
        "an ERROR line about the dead-letter topic",
    )
    w.ensure_alive()
    return w, manifest, sent[5].offset


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_item_6_dead_letter_topic_gone_rejects_no_valid_record(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str
) -> None:
    """The dead-letter topic disappears (deleted; an ACL that denies writing is the same
    kind of fault, but the dev broker runs without an authorizer). The batch with poison
    waits, the worker says so at ERROR and retries; nothing is rejected, no valid record
    is lost or rejected, and once the topic is back everything drains exactly once.
    Before the fix the failure was a WARNING only, repeated forever."""
    group = f"g-{topic}"
    dlq = f"{topic}.dlq"
    w, manifest, _ = _poison_behind_a_gone_dead_letter_topic(
        services, dsn, topic, tmp_path, runtime
    )
    time.sleep(2)  # retries go on: still nothing rejected
    assert db(dsn, "SELECT count(*) AS n FROM rejects")[0]["n"] == 0
    assert any(dlq in line for line in _error_lines(w, "ackline.streams.deadletter"))
    ensure_topic(services.bootstrap, dlq, 3)
    wait_drained(dsn, manifest, group, [w], timeout=120)
    assert w.stop() == 0, w.log()[-3000:]
    verify_ok(dsn, manifest, group)
    assert db(dsn, "SELECT count(*) AS n FROM rejects")[0]["n"] == 1


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_item_6_a_worker_retrying_a_dead_letter_topic_gone_stops_on_sigterm(
    services: Services, dsn: str, topic: str, tmp_path: Path, runtime: str
) -> None:
    """SIGTERM while the dead-letter topic is gone and a batch with poison waits for it:
    the worker ends within STOP_BOUND_S, committing nothing of that batch, and the next
    owner reads those records again and writes them once the topic is back. Before the
    fix the faust worker never ended: its graceful stop waited for that batch's acks
    (``stream_wait_empty``), and the batch's dead-letter retries ran in an executor thread
    that nothing told to stop (and that Python waits for at exit). The default runtime
    then exited with status 2 and an ERROR line, as if the stop had failed, though it
    leaves that batch as it leaves every record not written: to be read again."""
    group = f"g-{topic}"
    w, manifest, poison_offset = _poison_behind_a_gone_dead_letter_topic(
        services, dsn, topic, tmp_path, runtime
    )
    w.signal(signal.SIGTERM)
    try:
        status = w.proc.wait(STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"still running {STOP_BOUND_S}s after SIGTERM:\n{w.log()[-3000:]}"
        ) from None
    finally:
        w.discard()
    # confluent: a clean stop (the batch is left to be read again, as a buffered record
    # is), not the exit status of an error; faust: crash-only, nothing acked
    assert status == {"confluent": 0, "faust": 70}[runtime], w.log()[-3000:]
    assert "dead-letter records unacknowledged" in w.log()
    assert db(dsn, "SELECT count(*) AS n FROM rejects")[0]["n"] == 0
    done = offset_rows(dsn, group)[0].next_offset  # the batch with the poison: not committed
    assert done is not None and done <= poison_offset, (done, poison_offset)
    ensure_topic(services.bootstrap, f"{topic}.dlq", 3)
    w2 = Worker(services, dsn, topic, tmp_path, name="w2", runtime=runtime)
    wait_drained(dsn, manifest, group, [w2], timeout=120)
    assert w2.stop() == 0, w2.log()[-3000:]
    verify_ok(dsn, manifest, group)
    assert db(dsn, "SELECT count(*) AS n FROM rejects")[0]["n"] == 1


def test_item_6_a_dead_letter_topic_that_cannot_keep_dead_letters_stops_the_start(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    """A compacted dead-letter topic deletes dead letters that share a key: the worker
    refuses to start, with one line naming the topic, the setting and the fix. Before the
    fix an existing dead-letter topic was never looked at."""
    ensure_topic(services.bootstrap, f"{topic}.dlq", 3, {"cleanup.policy": "compact"})
    w = Worker(services, dsn, topic, tmp_path, name="w")
    assert w.reap() == 2, w.log()[-3000:]
    lines = w.log().strip().splitlines()
    assert lines[-1].startswith(f"ackline: error: dead-letter topic {topic}.dlq cannot keep")
    assert "cleanup.policy=compact" in lines[-1] and "ACKLINE_DLQ_TOPIC" in lines[-1]
    assert "Traceback" not in w.log()
