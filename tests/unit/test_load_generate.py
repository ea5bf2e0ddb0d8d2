"""The load generator, the manifest and the expected outcome of verify, without services."""

from __future__ import annotations

import itertools
import json
import math
import random
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

import pytest

from ackline.load.errors import LoadError
from ackline.load.generate import (
    MAX_EVENT_BYTES,
    POISON_KINDS,
    Knobs,
    Send,
    generate,
    make_poison,
)
from ackline.load.manifest import (
    ManifestHeader,
    ManifestRecord,
    ManifestWriter,
    iter_manifest,
    read_manifest,
)
from ackline.load.verify import Verdict, expected_outcome, is_drained, render_summary
from ackline.schemas.decode import REASONS, Limits, Rejection, Row, decode
from ackline.schemas.envelope import EVENT_TYPES, Envelope, new_envelope

EVENTS = 12_000
KNOBS = Knobs(
    redeliver=0.05,
    retry=0.04,
    conflict_ledger=0.01,
    conflict_pk=0.01,
    poison=0.01,
    abort=0.2,
    too_large_share=0.1,
    oversize_bytes=16_384,
)
SMALL_LIMITS = Limits(max_bytes=KNOBS.oversize_bytes - 1)


@pytest.fixture(scope="module")
def plan() -> list[Send]:
    return list(generate(EVENTS, KNOBS, seed=42, txn_size=100))


def committed(sends: Iterable[Send]) -> list[Send]:
    return [s for s in sends if not s.aborted]


def simulate_kafka(sends: Iterable[Send], partitions: int = 3) -> list[ManifestRecord]:
    """Offsets as a broker gives them: per partition, aborted records and transaction
    markers take offsets too."""
    next_offset: defaultdict[int, int] = defaultdict(int)
    records: list[ManifestRecord] = []
    for _, group in itertools.groupby(sends, key=lambda s: s.transaction):
        touched: set[int] = set()
        for s in group:
            p = zlib.crc32(s.key) % partitions
            records.append(ManifestRecord.from_send(s, p, next_offset[p]))
            next_offset[p] += 1
            touched.add(p)
        for p in touched:
            next_offset[p] += 1  # commit or abort marker
    return records


# --- determinism ------------------------------------------------------------------------


def test_same_seed_same_plan_byte_for_byte() -> None:
    a = list(generate(1500, KNOBS, seed=7, txn_size=100))
    b = list(generate(1500, KNOBS, seed=7, txn_size=100))
    assert a == b
    assert [s.value for s in a] == [s.value for s in b]


def test_other_seed_or_namespace_shares_no_ids() -> None:
    base = {s.event_id for s in generate(800, KNOBS, seed=7) if s.event_id}
    other_seed = {s.event_id for s in generate(800, KNOBS, seed=8) if s.event_id}
    other_ns = {s.event_id for s in generate(800, KNOBS, seed=7, namespace="run-2") if s.event_id}
    assert base and not base & other_seed and not base & other_ns
    txns = {s.txn_id for s in generate(800, KNOBS, seed=7, namespace="run-2") if s.txn_id}
    assert not txns & {s.txn_id for s in generate(800, KNOBS, seed=7) if s.txn_id}


def test_zero_events_and_bad_arguments() -> None:
    assert list(generate(0, KNOBS)) == []
    with pytest.raises(LoadError):
        list(generate(-1))
    with pytest.raises(LoadError):
        list(generate(10, txn_size=0))
    with pytest.raises(LoadError):
        Knobs(retry=1.5)
    with pytest.raises(LoadError):
        Knobs(oversize_bytes=100)
    with pytest.raises(LoadError):
        Knobs(immediate=0.7, far=0.5)


# --- the mix ----------------------------------------------------------------------------


def test_exact_number_of_originals(plan: list[Send]) -> None:
    kinds = Counter(s.kind for s in committed(plan))
    assert kinds["original"] == EVENTS


@pytest.mark.parametrize(
    ("kind", "rate"),
    [
        ("redelivery", KNOBS.redeliver),
        ("retry", KNOBS.retry),
        ("conflict_ledger", KNOBS.conflict_ledger),
        ("conflict_pk", KNOBS.conflict_pk),
        ("poison", KNOBS.poison),
    ],
)
def test_fault_rates_match_the_knobs(plan: list[Send], kind: str, rate: float) -> None:
    count = sum(1 for s in committed(plan) if s.kind == kind)
    mean = EVENTS * rate
    assert abs(count - mean) <= 5 * math.sqrt(mean * (1 - rate)) + 1, (kind, count, mean)


def test_abort_rate_and_shape(plan: list[Send]) -> None:
    by_txn: dict[int, list[Send]] = defaultdict(list)
    for s in plan:
        by_txn[s.transaction].append(s)
    aborted = [t for t, sends in by_txn.items() if sends[0].aborted]
    planned = len(by_txn) - len(aborted)
    assert all(len({s.aborted for s in sends}) == 1 for sends in by_txn.values())
    assert abs(len(aborted) / planned - KNOBS.abort) < 0.12
    for t in aborted:
        # the aborted attempt is a prefix of the next, committed, transaction: same bytes
        attempt, retry = by_txn[t], by_txn[t + 1]
        assert not retry[0].aborted
        assert [(s.seq, s.key, s.value) for s in attempt] == [
            (s.seq, s.key, s.value) for s in retry[: len(attempt)]
        ]
    # the committed records alone are the plan: every seq once, in order
    assert [s.seq for s in committed(plan)] == list(range(len(committed(plan))))


def test_no_plan_with_rates_zero_has_faults() -> None:
    quiet = Knobs(redeliver=0, retry=0, conflict_ledger=0, conflict_pk=0, poison=0, abort=0)
    sends = list(generate(2000, quiet, seed=3))
    assert {s.kind for s in sends} == {"original"}
    assert not any(s.aborted for s in sends)


# --- variants ---------------------------------------------------------------------------


def test_every_variant_follows_its_original_with_the_same_key(plan: list[Send]) -> None:
    by_seq = {s.seq: s for s in committed(plan)}
    gaps: list[int] = []
    for s in committed(plan):
        if s.kind in ("original", "poison"):
            assert s.original_index is None
            continue
        assert s.original_index is not None
        original = by_seq[s.original_index]
        assert original.kind == "original"
        assert s.seq > original.seq
        assert s.key == original.key
        gaps.append(s.seq - original.seq)
    assert min(gaps) == 1  # some right after the original: the same consumer batch
    assert sum(g <= 3 for g in gaps) > len(gaps) / 4
    assert sum(g >= 200 for g in gaps) > len(gaps) / 10  # some much later


def _decoded(value: bytes) -> Row:
    row = decode(value, SMALL_LIMITS)
    assert isinstance(row, Row), row
    return row


def test_variants_hash_like_the_sink_says(plan: list[Send]) -> None:
    by_seq = {s.seq: s for s in committed(plan)}
    seen: Counter[str] = Counter()
    for s in committed(plan):
        if s.kind in ("original", "poison"):
            continue
        assert s.original_index is not None
        original = by_seq[s.original_index]
        row, orig = _decoded(s.value), _decoded(original.value)
        assert row.body_hash.hex() == s.body_hash_hex  # the sink's hash is the plan's hash
        seen[s.kind] += 1
        if s.kind == "redelivery":
            assert s.value == original.value
        elif s.kind == "retry":
            assert row.txn_id == orig.txn_id and row.event_id != orig.event_id
            assert s.body_hash_hex == original.body_hash_hex
        elif s.kind == "conflict_ledger":
            assert row.txn_id == orig.txn_id and row.event_id != orig.event_id
            assert s.body_hash_hex != original.body_hash_hex
        else:
            assert s.kind == "conflict_pk"
            assert row.event_id == orig.event_id and row.txn_id != orig.txn_id
            assert s.body_hash_hex != original.body_hash_hex
    assert set(seen) == {"redelivery", "retry", "conflict_ledger", "conflict_pk"}


# --- poison -----------------------------------------------------------------------------


def _sample_envelope(event_type: str) -> Envelope:
    sends = generate(
        400,
        Knobs(redeliver=0, retry=0, conflict_ledger=0, conflict_pk=0, poison=0, abort=0),
        seed=9,
    )
    for s in sends:
        row = _decoded(s.value)
        if row.type == event_type:
            return new_envelope(
                row.type,
                row.txn_id,
                row.agent_id,
                row.request_id,
                json.loads(row.payload_json),
                occurred_at=row.occurred_at,
                event_id=row.event_id,
            )
    raise AssertionError(f"no {event_type} in the sample")


@pytest.mark.parametrize("kind", sorted(POISON_KINDS))
@pytest.mark.parametrize("event_type", ["agent.requested", "agent.step", "tool.result"])
def test_each_poison_kind_decodes_to_its_reason_with_default_limits(
    kind: str, event_type: str
) -> None:
    env = _sample_envelope(event_type)
    rng = random.Random(kind)
    for _ in range(3):
        value = make_poison(kind, rng, env, Knobs())
        result = decode(value, Limits())
        assert isinstance(result, Rejection), (kind, value[:200])
        assert result.reason == POISON_KINDS[kind], (kind, result, value[:300])


def test_the_poison_kinds_cover_every_rejection_reason() -> None:
    assert set(POISON_KINDS.values()) == set(REASONS)


def test_oversize_is_configurable_and_just_over_the_limit() -> None:
    env = _sample_envelope("agent.step")
    value = make_poison("too_large", random.Random(1), env, Knobs())
    assert len(value) == Limits().max_bytes + 1
    small = make_poison("too_large", random.Random(1), env, KNOBS)
    assert len(small) == KNOBS.oversize_bytes
    assert not isinstance(decode(small, Limits()), Rejection)  # valid under the 1 MiB limit


def test_poison_in_the_plan_decodes_to_its_declared_reason(plan: list[Send]) -> None:
    poison = [s for s in plan if s.kind == "poison"]
    assert {s.poison_kind for s in poison} == set(POISON_KINDS)
    for s in poison:
        assert s.event_id is None and s.txn_id is None and s.body_hash_hex is None
        result = decode(s.value, SMALL_LIMITS)
        assert isinstance(result, Rejection), s
        assert result.reason == s.poison_reason == POISON_KINDS[str(s.poison_kind)]
    share = sum(s.poison_kind == "too_large" for s in poison) / len(poison)
    assert share < 0.3  # oversize records stay rare


# --- realistic traffic ------------------------------------------------------------------


def test_every_event_is_valid_and_sizes_are_realistic(plan: list[Send]) -> None:
    originals = [s for s in committed(plan) if s.kind == "original"]
    sizes = [len(s.value) for s in originals]
    assert max(sizes) < MAX_EVENT_BYTES
    inside = sum(200 <= n <= 2048 for n in sizes)
    assert inside >= 0.97 * len(sizes)
    assert sum(n > 1000 for n in sizes) > len(sizes) / 20  # not all small
    for s in originals[:3000]:
        row = _decoded(s.value)
        assert s.key == row.agent_id.encode()
        assert s.txn_id == row.txn_id and s.event_id == str(row.event_id)
        assert dict(s.headers)["ackline.type"] == row.type.encode()
    types = Counter(_decoded(s.value).type for s in originals[:3000])
    assert set(types) == set(EVENT_TYPES)


def test_runs_are_whole_and_interleaved(plan: list[Send]) -> None:
    rows = [_decoded(s.value) for s in committed(plan) if s.kind == "original"]
    runs: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        runs[row.request_id].append(row)
    finished = 0
    for request_id, events in runs.items():
        assert events[0].type == "agent.requested"
        assert events[0].txn_id == f"req:{request_id}"
        assert len({e.agent_id for e in events}) == 1  # one request, one agent
        if len(events) > 1:
            assert events[1].type == "agent.started"
            assert events[1].txn_id == f"start:{request_id}"
        run_id = json.loads(events[1].payload_json)["run_id"] if len(events) > 1 else "-"
        for n, e in enumerate(events[2:], start=1):
            assert e.txn_id == f"{run_id}:{n}"
        assert [e.occurred_at for e in events] == sorted(e.occurred_at for e in events)
        if events[-1].type in ("agent.finished", "agent.failed"):
            finished += 1
        for a, b in itertools.pairwise(events):
            if a.type == "tool.called":
                assert b.type == "tool.result"
    assert finished >= 0.97 * len(runs)
    assert Counter(e.type for e in rows)["agent.failed"] > 0
    # an agent serves one run at a time; many agents are active at once
    current: dict[str, str] = {}
    done: set[str] = set()
    active_max, active = 0, set()
    for row in rows:
        if current.get(row.agent_id) != row.request_id:
            assert row.request_id not in done and row.type == "agent.requested"
            if row.agent_id in current:
                done.add(current[row.agent_id])
                active.discard(current[row.agent_id])
            current[row.agent_id] = row.request_id
            active.add(row.request_id)
        active_max = max(active_max, len(active))
    assert active_max >= KNOBS.agents // 2
    assert len(runs) > 100


def test_tool_calls_look_real(plan: list[Send]) -> None:
    tools: Counter[str] = Counter()
    for s in committed(plan):
        if s.kind == "original" and dict(s.headers)["ackline.type"] == b"tool.called":
            payload = json.loads(s.value)["payload"]
            tools[payload["tool"]] += 1
            assert isinstance(payload["arguments"], dict) and payload["arguments"]
    assert {"web.search", "code.exec", "sql.query", "file.read"} <= set(tools)


# --- the expected outcome of verify -----------------------------------------------------


def test_expected_outcome_of_a_generated_plan(plan: list[Send]) -> None:
    records = simulate_kafka(plan)
    exp = expected_outcome(records)
    kinds = Counter(s.kind for s in committed(plan))
    assert exp.inconsistent == 0
    assert exp.produced == len(plan)
    assert exp.aborted == sum(s.aborted for s in plan) > 0
    assert exp.unique_expected == kinds["original"] == EVENTS
    assert exp.duplicates_expected == kinds["redelivery"] + kinds["retry"]
    assert exp.conflicts_expected == kinds["conflict_ledger"] + kinds["conflict_pk"]
    assert Counter(exp.conflicts.values()) == {
        "ledger": kinds["conflict_ledger"],
        "primary_key": kinds["conflict_pk"],
    }
    assert exp.rejects_expected == kinds["poison"]
    # every winner is the committed copy, never the aborted one
    aborted_coords = {(r.partition, r.offset) for r in records if not r.committed}
    assert not {(w.partition, w.offset) for w in exp.winners.values()} & aborted_coords
    assert exp.max_offsets == {
        p: max(r.offset for r in records if r.partition == p and r.committed)
        for p in {r.partition for r in records}
    }


def rec(
    offset: int,
    kind: str = "original",
    *,
    committed: bool = True,
    event_id: str = "e1",
    txn_id: str = "t1",
    body_hash: str = "aa",
    partition: int = 0,
    poison: str | None = None,
) -> ManifestRecord:
    if kind == "poison":
        return ManifestRecord(offset, kind, partition, offset, committed, poison=poison)
    return ManifestRecord(
        offset,
        kind,
        partition,
        offset,
        committed,
        event_id=event_id,
        txn_id=txn_id,
        body_hash=body_hash,
    )


def test_aborted_then_resent_the_committed_copy_wins() -> None:
    records = [
        rec(0, committed=False),  # aborted: invisible
        rec(1, "retry", committed=False, event_id="e9"),
        rec(3),  # the re-send, committed: the winner
        rec(4, "retry", event_id="e9"),  # a duplicate of the committed copy
        rec(5, committed=False, event_id="e2", txn_id="t2"),  # aborted-only: must not exist
    ]
    exp = expected_outcome(records)
    assert exp.produced == 5 and exp.aborted == 3
    assert set(exp.winners) == {"e1"}
    assert (exp.winners["e1"].partition, exp.winners["e1"].offset) == (0, 3)
    assert exp.duplicates_expected == 1 and exp.duplicates == {"ledger": 1}
    assert exp.conflicts_expected == 0 and exp.rejects_expected == 0
    assert "e2" in exp.event_ids and "t2" in exp.txn_ids  # an activity row would be duplicated
    assert exp.max_offsets == {0: 4}
    assert exp.inconsistent == 0


def test_first_committed_copy_wins_by_offset_not_by_manifest_order() -> None:
    records = [
        rec(7, "conflict_ledger", event_id="e2", body_hash="bb"),
        rec(2),
        rec(9, "conflict_pk", txn_id="t3", body_hash="cc"),
        rec(8, "redelivery"),
        rec(4, "poison", poison="invalid_json"),
        rec(0, partition=1, event_id="e5", txn_id="t5"),
    ]
    exp = expected_outcome(records)
    assert set(exp.winners) == {"e1", "e5"}
    assert exp.conflicts == {(0, 7): "ledger", (0, 9): "primary_key"}
    assert exp.rejects == {(0, 4): "invalid_json"}
    assert exp.duplicates == {"ledger": 1}
    assert exp.max_offsets == {0: 9, 1: 0}
    assert exp.inconsistent == 0


def test_mislabeled_kinds_are_counted_not_trusted() -> None:
    exp = expected_outcome([rec(0, "retry"), rec(1, "original")])
    assert set(exp.winners) == {"e1"} and exp.duplicates_expected == 1
    assert exp.inconsistent == 2


def test_committed_record_without_offset_is_an_error() -> None:
    with pytest.raises(LoadError):
        expected_outcome([rec(-1)])


def test_is_drained() -> None:
    assert is_drained({0: 9, 1: 4}, {0: 10, 1: 5})
    assert not is_drained({0: 9, 1: 4}, {0: 10, 1: 4})
    assert not is_drained({0: 9, 1: 4}, {0: 10})
    assert not is_drained({0: 9}, {0: None})
    assert is_drained({}, {})


def test_verdict_json_and_summary() -> None:
    v = Verdict(
        run_id="r",
        topic="t",
        group_id="g",
        produced=110,
        aborted=5,
        unique_expected=90,
        ingested=90,
        lost=0,
        duplicated=0,
        duplicates_expected=8,
        duplicates_dropped=8,
        conflicts_expected=2,
        conflicts_quarantined=2,
        conflicts_unexpected=0,
        conflict_layer_mismatch=0,
        rejects_expected=3,
        rejected=3,
        rejects_unexpected=0,
        reject_reason_mismatch=0,
        drained=True,
    )
    j = v.to_json()
    for key in (
        "produced",
        "unique_expected",
        "ingested",
        "duplicates_expected",
        "duplicates_dropped",
        "conflicts_expected",
        "conflicts_quarantined",
        "rejects_expected",
        "rejected",
        "lost",
        "duplicated",
        "ok",
    ):
        assert key in j
    assert j["ok"] is True
    assert "OK" in render_summary(v)
    bad = Verdict(**{**{k: j[k] for k in j if k != "ok"}, "duplicates_dropped": 7})
    assert not bad.ok and "MISMATCH" in render_summary(bad)
    assert not Verdict(**{**{k: j[k] for k in j if k != "ok"}, "reject_reason_mismatch": 1}).ok


# --- the manifest file ------------------------------------------------------------------


def _header() -> ManifestHeader:
    return ManifestHeader(
        run_id="r1",
        topic="t",
        seed=1,
        partitions=3,
        events=10,
        txn_size=5,
        knobs=KNOBS.as_dict(),
        created_at="2024-05-01T00:00:00Z",
        namespace="r1",
    )


@pytest.mark.parametrize("name", ["m.jsonl", "m.jsonl.gz"])
def test_manifest_round_trip(tmp_path: Path, name: str, plan: list[Send]) -> None:
    records = simulate_kafka(plan[:300])
    path = tmp_path / name
    with ManifestWriter(path, _header()) as writer:
        for r in records:
            writer.write(r)
    got = read_manifest(path)
    assert got.header == _header()
    assert got.records == records
    assert not (tmp_path / f"{name}.partial").exists()


def test_incomplete_manifest_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    with pytest.raises(RuntimeError), ManifestWriter(path, _header()) as writer:
        writer.write(rec(0))
        raise RuntimeError("produce crashed")
    with pytest.raises(LoadError, match="incomplete"):
        read_manifest(path)
    partial = tmp_path / "m.jsonl.partial"
    path.write_bytes(partial.read_bytes())  # no trailer line
    header, records = iter_manifest(path)
    assert header.run_id == "r1"
    with pytest.raises(LoadError, match="truncated"):
        list(records)
