"""Payload versions registered at start (ACKLINE_PAYLOAD_PLUGINS), and what the decoder
then accepts and marks as newer."""

from __future__ import annotations

import json

import pytest

from ackline.schemas import Rejection, Row, decode, new_envelope
from ackline.schemas.envelope import PAYLOADS, AgentStartedV1, newest_version
from ackline.schemas.errors import SchemaError
from ackline.schemas.plugins import load_plugins, parse_plugins
from tests.support.payloads_v2 import AgentStartedV2


def _v2_value() -> bytes:
    env = new_envelope("agent.started", "t-1", "a", "r", {"run_id": "r", "model": "m"})
    body = env.model_dump(mode="json")
    body["schema_version"] = 2
    body["payload"] = {"run_id": "r", "model": "m", "provider": "p", "max_tokens": 5}
    return json.dumps(body).encode()


def test_parse_plugins() -> None:
    assert parse_plugins(" a.b:X , c:Y,") == [("a.b", "X"), ("c", "Y")]
    assert parse_plugins("") == []
    for bad in ("a.b", ":X", "a:"):
        with pytest.raises(SchemaError):
            parse_plugins(bad)


def test_without_the_plugin_v2_is_a_newer_unsupported_version() -> None:
    got = decode(_v2_value())
    assert isinstance(got, Rejection)
    assert got.reason == "unsupported_version"
    assert got.newer == ("agent.started", 2)
    old = json.loads(_v2_value())
    old["schema_version"] = 0
    older = decode(json.dumps(old).encode())
    assert isinstance(older, Rejection) and older.reason == "unsupported_version"
    assert older.newer is None  # not newer: rejected at once, never held


def test_the_plugin_registers_v2_and_the_decoder_accepts_it(registry: None) -> None:
    assert load_plugins("tests.support.payloads_v2:PAYLOADS") == [("agent.started", 2)]
    assert newest_version("agent.started") == 2
    got = decode(_v2_value())
    assert isinstance(got, Row) and got.schema_version == 2
    assert json.loads(got.payload_json)["provider"] == "p"
    assert load_plugins("tests.support.payloads_v2:PAYLOADS") == []  # idempotent


def test_register_rules(registry: None) -> None:
    from ackline.schemas.envelope import register_payloads

    with pytest.raises(SchemaError, match="known event type"):
        register_payloads({("agent.teleported", 1): AgentStartedV2})
    with pytest.raises(SchemaError, match="positive int"):
        register_payloads({("agent.started", 0): AgentStartedV2})
    with pytest.raises(SchemaError, match="already registered"):
        register_payloads({("agent.started", 1): AgentStartedV2})
    assert PAYLOADS[("agent.started", 1)] is AgentStartedV1
    with pytest.raises(SchemaError, match="not a mapping"):
        load_plugins("tests.support.payloads_v2:AgentStartedV2")
    with pytest.raises(SchemaError, match="No module"):
        load_plugins("tests.support.nope:PAYLOADS")
