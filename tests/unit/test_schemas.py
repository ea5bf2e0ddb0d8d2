"""Event schema v1 models, new_envelope and the JSON Schema export."""

from __future__ import annotations

import enum
import json
import re
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ackline import schemas
from ackline.core.errors import AcklineError
from ackline.schemas import (
    ENVELOPES,
    EVENT_TYPES,
    PAYLOADS,
    Envelope,
    Payload,
    SchemaError,
    envelope_json_schema,
    envelope_model,
    new_envelope,
    write_json_schema,
)
from ackline.schemas.jsonschema import JSON_SCHEMA_PATH, render_json_schema

WHEN = datetime(2024, 5, 1, 12, 0, 0, 250_000, tzinfo=UTC)

EXAMPLES: dict[str, dict[str, Any]] = {
    "agent.requested": {
        "prompt": "Summarise the Kafka docs",
        "requested_by": "user-1",
        "priority": 5,
        "tools": ["web.search", "fs.read"],
    },
    "agent.started": {"run_id": "run-1", "model": "model-x"},
    "agent.step": {"run_id": "run-1", "step": 0, "thought": "look it up"},
    "tool.called": {
        "run_id": "run-1",
        "call_id": "call-1",
        "tool": "web.search",
        "arguments": {"q": "exactly once", "n": 3, "opts": {"lang": ["en"], "x": None}},
    },
    "tool.result": {
        "run_id": "run-1",
        "call_id": "call-1",
        "ok": True,
        "output": "3 results",
        "duration_ms": 120,
    },
    "message.posted": {"run_id": "run-1", "role": "assistant", "content": "Here you go."},
    "agent.finished": {
        "run_id": "run-1",
        "steps": 3,
        "tokens_in": 1200,
        "tokens_out": 300,
        "summary": "done",
    },
    "agent.failed": {"run_id": "run-1", "error_kind": "timeout", "error": "tool timed out"},
}


def make(event_type: str = "agent.started", **changes: Any) -> Envelope:
    payload = {**EXAMPLES[event_type], **changes.pop("payload", {})}
    fields: dict[str, Any] = {
        "txn_id": "txn-1",
        "agent_id": "agent-1",
        "request_id": "req-1",
        "occurred_at": WHEN,
        **changes,
    }
    return new_envelope(
        event_type,
        fields.pop("txn_id"),
        fields.pop("agent_id"),
        fields.pop("request_id"),
        payload,
        **fields,
    )


def wire(env: Envelope, **changes: Any) -> dict[str, Any]:
    data = env.model_dump(mode="json")
    data.update(changes)
    return data


def test_event_types_are_the_eight_v1_types() -> None:
    assert set(EVENT_TYPES) == set(EXAMPLES)
    assert len(EVENT_TYPES) == 8
    assert set(PAYLOADS) == {(t, 1) for t in EXAMPLES}
    assert set(ENVELOPES) == set(PAYLOADS)


@pytest.mark.parametrize("event_type", sorted(EXAMPLES))
def test_new_envelope_builds_the_concrete_model(event_type: str) -> None:
    env = make(event_type)
    assert type(env) is ENVELOPES[(event_type, 1)]
    assert isinstance(env, Envelope)
    assert type(env.payload) is PAYLOADS[(event_type, 1)]
    assert env.type == event_type
    assert env.schema_version == 1
    assert env.occurred_at == WHEN
    assert env.payload.model_dump() == EXAMPLES[event_type]


@pytest.mark.parametrize("event_type", sorted(EXAMPLES))
def test_envelope_model_validate_dispatches_and_round_trips(event_type: str) -> None:
    env = make(event_type)
    again = Envelope.model_validate(wire(env))
    assert type(again) is type(env)
    assert again == env
    assert Envelope.model_validate(json.loads(env.model_dump_json())) == env


def test_new_envelope_defaults() -> None:
    before = datetime.now(UTC)
    env = new_envelope("agent.started", "t", "a", "r", {"run_id": "x", "model": "m"})
    assert before <= env.occurred_at <= datetime.now(UTC)
    assert isinstance(env.event_id, uuid.UUID)
    other = new_envelope("agent.started", "t", "a", "r", {"run_id": "x", "model": "m"})
    assert other.event_id != env.event_id


def test_new_envelope_accepts_a_payload_model() -> None:
    payload = schemas.AgentStartedV1(run_id="run-1", model="model-x")
    env = new_envelope("agent.started", "t", "a", "r", payload, occurred_at=WHEN)
    assert env.payload == payload


def test_models_are_frozen() -> None:
    env = make()
    with pytest.raises(ValidationError):
        env.txn_id = "other"
    with pytest.raises(ValidationError):
        env.payload.run_id = "other"  # type: ignore[attr-defined]


def test_extra_fields_are_forbidden() -> None:
    env = make()
    with pytest.raises(ValidationError, match="extra"):
        Envelope.model_validate(wire(env, partition=3))
    with pytest.raises(SchemaError, match=r"payload\.colour"):
        make(payload={"colour": "red"})


def test_payload_must_match_the_type() -> None:
    with pytest.raises(SchemaError) as caught:
        new_envelope("agent.started", "t", "a", "r", EXAMPLES["agent.failed"])
    assert isinstance(caught.value.__cause__, ValidationError)
    assert isinstance(caught.value, AcklineError)


def test_unknown_type_and_version() -> None:
    with pytest.raises(SchemaError, match="unknown event type"):
        new_envelope("agent.exploded", "t", "a", "r", {})
    with pytest.raises(SchemaError, match="schema_version 2"):
        new_envelope("agent.started", "t", "a", "r", {}, schema_version=2)
    with pytest.raises(SchemaError):
        envelope_model("nope")
    assert envelope_model("agent.started") is ENVELOPES[("agent.started", 1)]
    env = make()
    with pytest.raises(ValidationError) as caught:
        Envelope.model_validate(wire(env, type="agent.exploded"))
    assert caught.value.errors()[0]["type"] == "unknown_type"
    with pytest.raises(ValidationError) as caught:
        Envelope.model_validate(wire(env, schema_version=7))
    assert caught.value.errors()[0]["type"] == "unsupported_version"


def test_naive_timestamps_are_invalid() -> None:
    with pytest.raises(SchemaError, match="occurred_at"):
        make(occurred_at=datetime(2024, 5, 1, 12, 0))
    env = make()
    with pytest.raises(ValidationError, match="timezone"):
        Envelope.model_validate(wire(env, occurred_at="2024-05-01T12:00:00"))


@pytest.mark.parametrize("value", [1714564800, 1714564800.5, "1714564800", "yesterday", None])
def test_timestamps_must_be_iso_strings(value: object) -> None:
    with pytest.raises(ValidationError, match="occurred_at"):
        Envelope.model_validate(wire(make(), occurred_at=value))


def test_timestamps_are_normalised_to_utc() -> None:
    plus2 = datetime(2024, 5, 1, 14, 0, 0, 250_000, tzinfo=timezone(timedelta(hours=2)))
    env = make(occurred_at=plus2)
    assert env.occurred_at == WHEN
    assert env.occurred_at.utcoffset() == timedelta(0)
    assert wire(env)["occurred_at"] == "2024-05-01T12:00:00.250000Z"
    for text in ("2024-05-01T12:00:00.25Z", "2024-05-01T12:00:00.250+00:00"):
        assert Envelope.model_validate(wire(env, occurred_at=text)).occurred_at == WHEN


def test_timestamp_out_of_range_in_utc_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="out of range"):
        Envelope.model_validate(wire(make(), occurred_at="0001-01-01T00:00:00+05:00"))


@pytest.mark.parametrize(
    ("changes", "where"),
    [
        ({"txn_id": "a\x00b"}, "txn_id"),
        ({"agent_id": "\ud800"}, "agent_id"),
        ({"payload": {"prompt": "hi\x00"}}, "payload.prompt"),
        ({"payload": {"prompt": "caf\udce9"}}, "payload.prompt"),
        ({"payload": {"tools": ["ok", "b\x00d"]}}, "payload.tools[1]"),
    ],
)
def test_nul_and_lone_surrogates_are_rejected(changes: dict[str, Any], where: str) -> None:
    with pytest.raises(SchemaError, match=re.escape(f"{where}: Value error, must not contain")):
        make("agent.requested", **changes)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"k\x00": 1}, "key must not contain NUL"),
        ({"a": {"b": ["x", "\ud800"]}}, r"a\.b\[1\]: string must not contain a lone surrogate"),
        ({"a": float("nan")}, "NaN and Infinity"),
        ({"a": [float("-inf")]}, "NaN and Infinity"),
        ({"a": (1, 2)}, "tuple is not a JSON value"),
        ({"a": {1, 2}}, "set is not a JSON value"),
        ({"a": {1: "x"}}, "object key 1 is not a string"),
        ({"a": b"bytes"}, "bytes is not a JSON value"),
    ],
)
def test_arguments_must_be_plain_json(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        make("tool.called", payload={"arguments": arguments})


def test_cyclic_arguments_are_rejected() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    with pytest.raises(SchemaError, match="nested too deeply"):
        make("tool.called", payload={"arguments": cyclic})


def test_arguments_are_copied_and_subclasses_normalised() -> None:
    class Level(enum.IntEnum):
        HIGH = 3

    class Name(str, enum.Enum):  # noqa: UP042 -- str() of this one is "Name.BOB"
        BOB = "bob"

    arguments: dict[str, Any] = {"level": Level.HIGH, "name": Name.BOB, "items": [1, 2.5]}
    env = make("tool.called", payload={"arguments": arguments})
    arguments["items"].append(3)
    got = env.payload.arguments  # type: ignore[attr-defined]
    assert got == {"level": 3, "name": "bob", "items": [1, 2.5]}
    assert type(got["level"]) is int
    assert type(got["name"]) is str


@pytest.mark.parametrize(
    ("event_type", "payload"),
    [
        ("agent.requested", {"priority": "5"}),
        ("agent.requested", {"priority": 5.0}),
        ("agent.requested", {"priority": 10}),
        ("agent.requested", {"priority": -1}),
        ("agent.requested", {"tools": "web.search"}),
        ("agent.requested", {"tools": [""]}),
        ("agent.step", {"step": -1}),
        ("agent.step", {"step": True}),
        ("tool.result", {"ok": 1}),
        ("tool.result", {"ok": "true"}),
        ("tool.result", {"duration_ms": 2**63}),
        ("message.posted", {"role": "robot"}),
        ("agent.started", {"run_id": ""}),
        ("agent.started", {"run_id": "x" * 201}),
        ("agent.started", {"model": 7}),
        ("tool.called", {"arguments": ["not", "an", "object"]}),
    ],
)
def test_payload_fields_are_strict(event_type: str, payload: dict[str, Any]) -> None:
    with pytest.raises(SchemaError):
        make(event_type, payload=payload)


def test_identifier_bounds() -> None:
    assert make(txn_id="x" * 200).txn_id == "x" * 200
    for bad in ("", "x" * 201):
        with pytest.raises(SchemaError, match="txn_id"):
            make(txn_id=bad)
    assert make("tool.result", payload={"duration_ms": 2**63 - 1})


def test_event_id_accepts_uuid_text_and_rejects_garbage() -> None:
    env = make()
    same = Envelope.model_validate(wire(env, event_id=str(env.event_id).upper()))
    assert same.event_id == env.event_id
    with pytest.raises(ValidationError, match="event_id"):
        Envelope.model_validate(wire(env, event_id="not-a-uuid"))


def test_schema_version_must_be_an_int() -> None:
    for bad in ("1", 1.0, True):
        with pytest.raises(ValidationError, match="schema_version"):
            Envelope.model_validate(wire(make(), schema_version=bad))


def test_payload_base_and_registry_types() -> None:
    for model in PAYLOADS.values():
        assert issubclass(model, Payload)
        assert model.model_config.get("frozen") is True
        assert model.model_config.get("extra") == "forbid"
        assert all(field.is_required() for field in model.model_fields.values())


# --- JSON Schema export -------------------------------------------------------------------


def test_committed_json_schema_is_current() -> None:
    committed = JSON_SCHEMA_PATH.read_text(encoding="utf-8")
    assert committed == render_json_schema(), (
        "schemas/json/envelope.v1.schema.json is stale: run `python -m ackline.schemas`"
    )


def test_json_schema_has_one_variant_per_type_and_version() -> None:
    schema = envelope_json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    variants = [schema["$defs"][ref["$ref"].rsplit("/", 1)[1]] for ref in schema["oneOf"]]
    pinned = {
        (v["properties"]["type"]["const"], v["properties"]["schema_version"]["const"])
        for v in variants
    }
    assert pinned == set(PAYLOADS)
    for variant in variants:
        assert variant["additionalProperties"] is False
        assert set(variant["required"]) == set(Envelope.model_fields)
        assert variant["properties"]["occurred_at"]["format"] == "date-time"
    everything = envelope_json_schema(None)  # only v1 exists so far
    assert (everything["oneOf"], everything["$defs"]) == (schema["oneOf"], schema["$defs"])
    with pytest.raises(SchemaError):
        envelope_json_schema(99)


def test_write_json_schema(tmp_path: Path) -> None:
    target = write_json_schema(tmp_path / "out" / "envelope.schema.json")
    assert target.read_text(encoding="utf-8") == render_json_schema()
    assert json.loads(target.read_text(encoding="utf-8")) == envelope_json_schema()


def test_public_api() -> None:
    for name in schemas.__all__:
        assert hasattr(schemas, name), name
