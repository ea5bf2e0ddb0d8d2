"""JSON Schema (draft 2020-12) export of the event envelope.

The schema is a ``oneOf`` with one variant per registered (type, schema_version); each
variant pins ``type`` and ``schema_version`` with ``const``, so exactly one matches.
It documents the wire format for producers in other languages. It cannot express every
rule the pydantic models enforce (no NUL or lone surrogate in strings, a UTC offset on
``occurred_at``, finite numbers); the models are the authority.

The committed export ``schemas/json/envelope.v1.schema.json`` is regenerated with::

    python -m ackline.schemas

and a unit test fails when it differs from :func:`render_json_schema`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

from pydantic.json_schema import models_json_schema

from ackline.schemas.envelope import ENVELOPES, SCHEMA_VERSION
from ackline.schemas.errors import SchemaError

JSON_SCHEMA_PATH: Final = Path(__file__).resolve().parent / "json" / "envelope.v1.schema.json"
"""Where the committed v1 export lives."""

_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"


def envelope_json_schema(schema_version: int | None = SCHEMA_VERSION) -> dict[str, Any]:
    """The envelope JSON Schema with a variant per (type, version).

    ``schema_version`` selects the variants of one version; ``None`` takes every
    registered (type, version).
    """
    models = [
        model
        for (_, version), model in ENVELOPES.items()
        if schema_version is None or version == schema_version
    ]
    if not models:
        raise SchemaError(f"no event type has schema_version {schema_version!r}")
    refs, top = models_json_schema(
        [(model, "validation") for model in models], ref_template="#/$defs/{model}"
    )
    which = "all versions" if schema_version is None else f"schema_version {schema_version}"
    return {
        "$schema": _DIALECT,
        "title": "ackline event envelope",
        "description": (
            f"One agent-activity event ({which}). Generated from the pydantic models in "
            "schemas/envelope.py by schemas/jsonschema.py; do not edit."
        ),
        "oneOf": [refs[(model, "validation")] for model in models],
        "$defs": top["$defs"],
    }


def render_json_schema(schema_version: int | None = SCHEMA_VERSION) -> str:
    """The export's exact text: sorted keys, two-space indent, trailing newline."""
    schema = envelope_json_schema(schema_version)
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_json_schema(
    path: str | Path = JSON_SCHEMA_PATH, schema_version: int | None = SCHEMA_VERSION
) -> Path:
    """Write :func:`render_json_schema` to ``path`` (UTF-8) and return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_json_schema(schema_version), encoding="utf-8")
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m ackline.schemas [PATH]``: regenerate the committed export."""
    args = sys.argv[1:] if argv is None else argv
    written = write_json_schema(args[0] if args else JSON_SCHEMA_PATH)
    sys.stdout.write(f"wrote {written}\n")
    return 0
