"""`ackline config [show]` and `ackline config reference`: the settings, as set and as documented.

``show`` (also ``config`` alone) gives Kafka and PostgreSQL as a command would use them:
the setting when given, else the local dev stack's endpoint (source ``dev stack
(<state_dir>)``), or that the stack is not running. A DSN shows everything but its
password.

``reference`` prints every setting of :class:`~ackline.settings.Settings` — its name, its
``ACKLINE_*`` variable, type, default and description — as a markdown table, generated
from the model so it cannot disagree with it. docs/operating.md holds the same table
between :data:`START` and :data:`END`; ``ackline config reference --into
docs/operating.md`` rewrites that block, and tests/unit/test_docs.py fails when it
differs from :func:`reference_block`. It lives here, beside ``config show``, rather than
in ackline/settings.py: it is presentation, which the shell does, and a worker that
imports the settings need not carry it.
"""

from __future__ import annotations

import argparse
import json
import types
from pathlib import Path
from typing import Any, Final, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ackline.commands import Subparsers, uses
from ackline.core.errors import AcklineError
from ackline.render import table
from ackline.settings import ENV_PREFIX, Settings, redact_dsn

START: Final = (
    "<!-- settings:start (generated from ackline.settings by `ackline config reference`) -->"
)
END: Final = "<!-- settings:end -->"
_FACTORY_DEFAULTS: Final = {"worker_id": "`<hostname>-<pid>`"}


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.endpoints import in_use

    if getattr(args, "action", None) == "reference":
        if args.into:
            update_reference(Path(args.into))
        else:
            print(reference_table())
        return 0
    values = settings.redacted()
    sources: dict[str, str] = dict(settings.sources())
    kafka, database = in_use(settings)
    if settings.kafka_bootstrap is None:
        values["kafka_bootstrap"], sources["kafka_bootstrap"] = kafka.value, kafka.source
    if settings.database_url is None:
        shown = None if database.value is None else redact_dsn(database.value)
        values["database_url"], sources["database_url"] = shown, database.source
    if getattr(args, "json", False):
        print(
            json.dumps(
                {name: {"value": v, "source": sources[name]} for name, v in values.items()},
                indent=2,
                default=str,
            )
        )
        return 0
    rows = [(ENV_PREFIX + name.upper(), v, sources[name]) for name, v in values.items()]
    print(table(("setting", "value", "source"), rows))
    return 0


def _type_name(annotation: Any) -> str:
    """A reader's name for a setting's type: ``int``, ``secret``, ``one of: a, b``. Pure."""
    origin = get_origin(annotation)
    if origin is Literal:
        return "one of: " + ", ".join(f"`{a}`" for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        return " or ".join(_type_name(a) for a in inner)
    if annotation is SecretStr:
        return "secret"
    if annotation is Path:
        return "path"
    return str(getattr(annotation, "__name__", annotation))


def _bounds(field: FieldInfo) -> str:
    """The field's numeric bounds, e.g. ``1 ≤ x ≤ 100,000``, or ''. Pure."""
    low = high = ""
    for m in field.metadata:
        if isinstance(m, annotated_types.Ge):
            low = f"{m.ge:,} ≤ "
        elif isinstance(m, annotated_types.Gt):
            low = f"{m.gt:,} < "
        elif isinstance(m, annotated_types.Le):
            high = f" ≤ {m.le:,}"
        elif isinstance(m, annotated_types.Lt):
            high = f" < {m.lt:,}"
    return f"{low}x{high}" if low or high else ""


def _default(name: str, field: FieldInfo) -> str:
    if name in _FACTORY_DEFAULTS:
        return _FACTORY_DEFAULTS[name]
    value = field.default
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "unset"
    if value == "":
        return "empty"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference_rows() -> list[tuple[str, str, str, str, str]]:
    """(name, variable, type, default, description) of every setting, in model order. Pure."""
    rows = []
    for name, field in Settings.model_fields.items():
        kind = _type_name(field.annotation)
        bounds = _bounds(field)
        rows.append(
            (
                f"`{name}`",
                f"`{ENV_PREFIX}{name.upper()}`",
                f"{kind}, {bounds}" if bounds else kind,
                _default(name, field),
                field.description or "",
            )
        )
    return rows


def reference_table() -> str:
    """Every setting as a markdown table (the TOML key, the variable, type, default, what)."""
    lines = [
        "| name (TOML key) | environment variable | type | default | description |",
        "|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in reference_rows()]
    return "\n".join(lines)


def reference_block() -> str:
    """The generated block of docs/operating.md, markers included."""
    return "\n".join([START, "", reference_table(), "", END])


def splice(text: str, generated: str) -> str:
    """``text`` with its block between the markers replaced by ``generated``."""
    at, end = text.find(START), text.find(END)
    if at < 0 or end < at:
        raise AcklineError(f"no settings block: expected the markers {START!r} … {END!r}")
    return text[:at] + generated + text[end + len(END) :]


def update_reference(page: Path) -> None:
    """Rewrite ``page``'s settings block from the model (nothing when it is already equal)."""
    try:
        text = page.read_text(encoding="utf-8")
    except OSError as exc:
        raise AcklineError(f"cannot read {page}: {exc}") from exc
    new = splice(text, reference_block())
    if new != text:
        page.write_text(new, encoding="utf-8")


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "config",
        help="the effective settings (no subcommand: show them), or every setting documented",
    )
    actions = p.add_subparsers(dest="action", metavar="{show,reference}")
    show = actions.add_parser("show", help="print every setting (secrets redacted) and its source")
    show.add_argument("--json", action="store_true", help="one JSON object: value and source")
    ref = actions.add_parser(
        "reference", help="print every setting's variable, type, default and meaning (markdown)"
    )
    ref.add_argument(
        "--into",
        metavar="PAGE",
        help="rewrite the generated settings block of PAGE (docs/operating.md) instead",
    )
    p.set_defaults(handler=cmd_config)
    for shows in (p, show):  # the settings as this command line sets them
        uses(shows, "topic", "group_id")
    uses(ref, why="it documents the settings, not their values")
