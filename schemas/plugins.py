"""Payload versions loaded at start from ``ACKLINE_PAYLOAD_PLUGINS``.

The setting is a comma-separated list of ``module:attribute``; each attribute is a
mapping ``{(type, schema_version): PayloadModel}`` handed to
:func:`ackline.schemas.envelope.register_payloads`. This is how a worker learns a new payload
version during a rollout (docs/schema.md, "Evolving the schema"); the model moves into
:data:`ackline.schemas.envelope.PAYLOADS` in the next release.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from ackline.schemas.envelope import register_payloads
from ackline.schemas.errors import SchemaError


def parse_plugins(spec: str) -> list[tuple[str, str]]:
    """``"a.b:X, c:Y"`` -> ``[("a.b", "X"), ("c", "Y")]``. Pure; SchemaError if malformed."""
    found: list[tuple[str, str]] = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        module, sep, attr = item.partition(":")
        if not sep or not module or not attr:
            raise SchemaError(f"payload plugin {item!r} is not module:attribute")
        found.append((module, attr))
    return found


def load_plugins(spec: str) -> list[tuple[str, int]]:
    """Import every plugin of ``spec`` and register its payloads; return the keys added."""
    added: list[tuple[str, int]] = []
    for module_name, attr in parse_plugins(spec):
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise SchemaError(f"payload plugin {module_name}:{attr}: {exc}") from exc
        entries = getattr(module, attr, None)
        if not isinstance(entries, Mapping):
            raise SchemaError(f"payload plugin {module_name}:{attr} is not a mapping")
        added += register_payloads(entries)
    return added
