"""Poison that can never be dead-lettered (issue 11, item 6): the pure parts.

How a produce error is classified, how any record is made to fit the dead-letter topic,
how headers that are not clean text reach a dead letter and a reject row, which
dead-letter topics are unusable or weaker than their source. The runtime paths (both
consumers, the real broker) are in tests/integration/test_poison_dead_letters.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re

import pytest
from confluent_kafka import KafkaError

from ackline import doctor
from ackline.sinks.ingest.batch import Coord
from ackline.streams.dlq_rules import (
    MIB,
    OWN_HEADERS,
    RETRY_ALERT_S,
    Action,
    DeadLetter,
    bare,
    classify,
    dlq_problems,
    fit,
    kept,
    letter_headers,
    log_level,
    stub,
    weaker_than_source,
)
from ackline.streams.faust_runtime.headers import problems
from ackline.streams.headers import (
    BAD_KEY_PREFIX,
    LOST_KEY,
    UNDECODABLE_MARK,
    Headers,
    headers_for_produce,
    headers_json,
)
from ackline.streams.kafkainfo import TopicFacts

SHA = hashlib.sha256


@pytest.mark.parametrize(
    ("code", "action"),
    [
        (KafkaError.MSG_SIZE_TOO_LARGE, Action.SHRINK),  # over the topic's or producer's limit
        (KafkaError.RECORD_LIST_TOO_LARGE, Action.SHRINK),
        (KafkaError.INVALID_RECORD, Action.SHRINK),  # e.g. a null key to a compacted topic
        (KafkaError.INVALID_TIMESTAMP, Action.SHRINK),
        (KafkaError.POLICY_VIOLATION, Action.SHRINK),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, Action.OPERATOR),  # never a reject
        (KafkaError.UNKNOWN_TOPIC_OR_PART, Action.OPERATOR),
        (KafkaError._UNKNOWN_TOPIC, Action.OPERATOR),
        (KafkaError.CLUSTER_AUTHORIZATION_FAILED, Action.OPERATOR),
        (KafkaError._FATAL, Action.NEW_PRODUCER),
        (KafkaError._MSG_TIMED_OUT, Action.RETRY),
        (KafkaError._TRANSPORT, Action.RETRY),
        (KafkaError.REQUEST_TIMED_OUT, Action.RETRY),
        (KafkaError.NOT_LEADER_FOR_PARTITION, Action.RETRY),
        (KafkaError._PURGE_QUEUE, Action.RETRY),
    ],
)
def test_item_6_errors_are_classified_by_code(code: int, action: Action) -> None:
    """Delivery reports say retriable()/fatal() False whatever happened: only the code
    tells a record's own fault (shrink it) from the operator's (retry, never reject)."""
    err = KafkaError(code)
    assert not err.retriable() and not err.fatal()
    assert classify(err) is action


def test_item_6_a_fatal_error_needs_a_new_producer() -> None:
    """CLUSTER_AUTHORIZATION_FAILED raised by flush() is fatal: the instance is dead."""
    err = KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED, fatal=True)
    assert classify(err) is Action.NEW_PRODUCER


def _own(coord: Coord) -> list[tuple[str, bytes | None]]:
    values = [b"too_large", b"detail", coord.topic.encode(), b"1", str(coord.offset).encode()]
    return list(zip(OWN_HEADERS, values, strict=True))


COORD = Coord("events", 1, 4242)


def test_item_6_a_letter_that_fits_is_sent_whole() -> None:
    letter = DeadLetter(b"agent-1", b"{bad", [("trace", b"x"), *_own(COORD)])
    assert fit(letter, MIB, "-") is letter


def test_item_6_a_value_over_the_limit_becomes_a_stub_with_length_and_digest() -> None:
    value = os.urandom(2 * MIB)
    letter = DeadLetter(b"agent-1", value, [("trace", b"x"), *_own(COORD)])
    got = fit(letter, MIB, "MSG_SIZE_TOO_LARGE")
    headers = dict(got.headers)
    assert got.size <= MIB
    assert got.key == b"agent-1" and got.value == value[:65_536]
    assert headers["ackline.value-truncated"] == str(2 * MIB).encode()
    assert headers["ackline.truncated.value-sha256"] == SHA(value).hexdigest().encode()
    assert headers["ackline.stub"] == b"MSG_SIZE_TOO_LARGE"
    assert headers["trace"] == b"x" and headers["ackline.source.offset"] == b"4242"


def test_item_6_a_key_over_the_limit_is_replaced_by_its_digest() -> None:
    key = os.urandom(11 * MIB)
    got = fit(DeadLetter(key, b"not json", _own(COORD)), 10 * MIB, "over the producer's limit")
    headers = dict(got.headers)
    assert got.size <= 10 * MIB
    assert got.key == SHA(key).digest() and got.value == b"not json"
    assert headers["ackline.truncated.key-length"] == str(len(key)).encode()
    assert headers["ackline.truncated.key-sha256"] == SHA(key).hexdigest().encode()
    assert "ackline.value-truncated" not in headers  # the value was kept whole


def test_item_6_a_stub_drops_huge_headers_and_fits_a_small_limit() -> None:
    big = [(f"h{i}", os.urandom(8_000)) for i in range(200)]
    letter = DeadLetter(b"k", os.urandom(100_000), [*big, ("small", b"s"), *_own(COORD)])
    got = stub(letter, 20_000, "MSG_SIZE_TOO_LARGE")
    headers = dict(got.headers)
    assert got.size <= 20_000
    assert headers["ackline.truncated.headers-dropped"] == b"200"
    assert headers["small"] == b"s"
    assert got.value is not None and 0 < len(got.value) < 20_000


def test_a_stub_of_a_replayed_stub_says_what_it_left_out_once() -> None:
    """A stub reprocessed into the source topic and rejected again carries the first
    stub's notes among its original headers; stubbed again, each note is this stub's."""
    value, key = os.urandom(2 * MIB), os.urandom(5_000)
    first = stub(DeadLetter(key, value, _own(COORD)), MIB, "MSG_SIZE_TOO_LARGE")
    assert first.value is not None
    again = letter_headers(first.headers, "too_large", "again", Coord("events", 1, 99))
    second = stub(DeadLetter(first.key, first.value * 20, again), MIB, "once more")
    names = [name for name, _ in second.headers]
    assert sorted(set(names)) == sorted(names), names
    headers = dict(second.headers)
    assert headers["ackline.stub"] == b"once more"
    assert headers["ackline.value-truncated"] == str(20 * len(first.value)).encode()
    assert headers["ackline.source.offset"] == b"99"


def test_item_6_a_bare_letter_keeps_only_ackline_headers_keyed_by_coordinates() -> None:
    value = os.urandom(3000)
    letter = DeadLetter(b"k" * 5000, value, [("trace", b"x"), *_own(COORD)])
    got = bare(letter, COORD, "INVALID_RECORD")
    headers = dict(got.headers)
    assert got.key == b"events/1/4242" and got.value is None
    assert "trace" not in headers
    assert headers["ackline.source.partition"] == b"1"
    assert headers["ackline.value-truncated"] == b"3000"
    assert headers["ackline.truncated.key-sha256"] == SHA(b"k" * 5000).hexdigest().encode()
    assert got.size < 16_384


def test_a_dead_letter_carries_one_of_each_own_header_with_the_real_values() -> None:
    """A record replayed from the dead-letter topic (or forged) that carries ackline's own
    header names: its dead letter has exactly one of each, this rejection's, and keeps
    the other headers in order; a bare letter of it too. Before the fix both were kept,
    the stale ``ackline.source.offset: 999`` first (a reader taking the first de-duplicated
    on it)."""
    incoming = [
        ("trace", b"t1"),
        ("ackline.source.offset", b"999"),
        ("ackline.reason", b"forged"),
        ("ackline.source.topic", None),
        ("trace", b"t2"),
    ]
    headers = letter_headers(incoming, "invalid_json", "bad byte", COORD)
    real = [b"invalid_json", b"bad byte", b"events", b"1", b"4242"]
    assert headers == [("trace", b"t1"), ("trace", b"t2"), *zip(OWN_HEADERS, real, strict=True)]
    small = bare(DeadLetter(b"k", b"{bad", headers), COORD, "INVALID_RECORD")
    names = [name for name, _ in small.headers]
    assert all(names.count(name) == 1 for name in OWN_HEADERS), names
    assert dict(small.headers)["ackline.source.offset"] == b"4242"


def test_item_6_a_reject_row_keeps_the_record_up_to_the_batch_bound() -> None:
    data = os.urandom(5000)
    assert kept(data, 5000) == (data, "")
    assert kept(None, 0) == (None, "")
    cut, note = kept(data, 1000)
    assert cut == data[:1000]
    assert note == f"first 1000 of 5000 bytes, sha256 {SHA(data).hexdigest()}"


# Headers as the clients hand them: confluent-kafka's lost key (None), aiokafka's
# surrogate-escaped key, a key with a NUL, an empty key, a value that is not UTF-8.
HOSTILE: Headers = [
    ("ok", b"v"),
    (None, b"v0"),
    (b"\xff\xfek".decode("utf-8", "surrogateescape"), b"v1"),
    ("x\x00y", b"1"),
    ("", b"3"),
    ("bad-value", b"\xff\xfe\x00"),
    ("null-value", None),
    ("text-value", "caf\u00e9"),
]


def test_item_6_headers_json_is_jsonb_safe_and_keeps_the_bytes() -> None:
    got = headers_json(HOSTILE)
    dumped = json.dumps(got)
    # jsonb refuses \u0000 and lone surrogates in strings
    assert not re.search(r"\\u0000|\\ud[89a-f]", dumped), dumped
    assert got[0] == {"key": "ok", "value": "v", "b64": base64.b64encode(b"v").decode()}
    assert got[1]["key"] is None and got[1]["key_lost"] == "true" and got[1]["key_b64"] is None
    assert got[2]["key"] is None and got[2]["key_b64"] == base64.b64encode(b"\xff\xfek").decode()
    assert got[2]["key_lost"] is None
    assert got[3]["key"] is None and got[3]["key_b64"] == base64.b64encode(b"x\x00y").decode()
    assert got[4]["key"] == ""
    assert got[5] == {
        "key": "bad-value",
        "value": None,
        "b64": base64.b64encode(b"\xff\xfe\x00").decode(),
    }
    assert got[6] == {"key": "null-value", "value": None, "b64": None}
    assert got[7]["value"] == "caf\u00e9"


def test_item_6_headers_for_produce_only_hand_clean_keys_to_confluent_kafka() -> None:
    got = headers_for_produce(HOSTILE)
    keys = [k for k, _ in got]
    assert keys[0] == "ok"
    assert keys[1] == LOST_KEY
    assert keys[2] == BAD_KEY_PREFIX + base64.urlsafe_b64encode(b"\xff\xfek").decode()
    assert keys[3] == BAD_KEY_PREFIX + base64.urlsafe_b64encode(b"x\x00y").decode()
    assert keys[4] == ""
    assert got[-1] == (UNDECODABLE_MARK, b"3")
    for key, value in got:
        key.encode("utf-8")  # strict: no surrogate reaches the producer
        assert "\x00" not in key
        assert value is None or isinstance(value, bytes)
    assert dict(got)["text-value"] == "caf\u00e9".encode()


def test_item_6_unusable_dead_letter_topics() -> None:
    assert dlq_problems({"cleanup.policy": "delete", "max.message.bytes": str(10 * MIB)}) == (
        [],
        [],
    )
    problems_, warnings = dlq_problems({"cleanup.policy": "compact,delete"})
    assert problems_ and "cleanup.policy=compact,delete" in problems_[0]
    problems_, _ = dlq_problems({"max.message.bytes": "1000"})
    assert problems_ and "max.message.bytes=1000" in problems_[0]
    problems_, warnings = dlq_problems({"max.message.bytes": str(MIB)})
    assert not problems_ and "stub" in warnings[0]


def test_item_6_weaker_than_source() -> None:
    assert weaker_than_source(1, 1, 3, 2, 3) == [
        "replication factor 1 < 3 of the source topic",
        "min.insync.replicas 1 < 2 of the source topic",
    ]
    assert weaker_than_source(3, 2, 3, 2, 3) == []
    assert weaker_than_source(1, 1, 3, 2, 1) == []  # one broker: nothing stronger exists
    assert weaker_than_source(3, 1, 3, 2, 5) == ["min.insync.replicas 1 < 2 of the source topic"]


def test_item_6_doctor_flags_a_dead_letter_topic_weaker_than_its_source() -> None:
    source = TopicFacts("events", 6, 3, 3, {"min.insync.replicas": "2"})
    weak = TopicFacts("events.dlq", 3, 1, 3, {"min.insync.replicas": "1"})
    check = doctor.dlq_durability_check(weak, source)
    assert check.status == "warn"
    assert (
        "replication factor 1 < 3" in check.detail and "min.insync.replicas 1 < 2" in check.detail
    )
    strong = TopicFacts("events.dlq", 3, 3, 3, {"min.insync.replicas": "2"})
    assert doctor.dlq_durability_check(strong, source).status == "pass"


def test_item_6_the_installed_aiokafka_can_be_made_lenient() -> None:
    """The faust runtime patches aiokafka's private fetcher; a version without those
    parts must refuse to start rather than crash-loop on a non-UTF-8 header key."""
    assert problems() == []


def test_a_transient_dead_letter_failure_becomes_an_error_after_a_minute() -> None:
    """The worker's batches wait for their dead letters: a DLQ broker away for a minute is
    an ERROR (an operator's problem), not a WARNING repeated for ever."""
    assert log_level(Action.RETRY, 0.0) == logging.WARNING
    assert log_level(Action.RETRY, RETRY_ALERT_S - 0.1) == logging.WARNING
    assert log_level(Action.RETRY, RETRY_ALERT_S) == logging.ERROR
    assert log_level(Action.OPERATOR, 0.0) == logging.ERROR
    assert log_level(Action.NEW_PRODUCER, 0.0) == logging.ERROR
