"""Text rendering for the operator commands. Pure functions."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A left-aligned plain-text table; None shows as '-'."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [_line(headers, widths), _line(["-" * w for w in widths], widths)]
    lines.extend(_line(row, widths) for row in cells)
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return "-" if value is None else safe_text(str(value))


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def safe_text(text: str, keep_newlines: bool = False) -> str:
    """``text`` with control characters (terminal escapes) shown as ``\\xNN``/``\\uNNNN``."""
    out = []
    for ch in text:
        code = ord(ch)
        if keep_newlines and ch in "\n\t":
            out.append(ch)
        elif code < 0x20 or 0x7F <= code < 0xA0:
            out.append(f"\\x{code:02x}")
        elif code in (0x2028, 0x2029, 0x200E, 0x200F) or 0x202A <= code <= 0x202E:
            out.append(f"\\u{code:04x}")  # line separators and bidi overrides
        else:
            out.append(ch)
    return "".join(out)


def show_bytes(value: bytes | None, raw: bool = False, limit: int = 4096) -> str:
    """Bytes for a terminal: UTF-8 with replacement and escaped controls, or base64.

    ``limit`` bytes at most (0: all), with a note of how many were left out.
    """
    if value is None:
        return "(null)"
    shown = value if limit <= 0 else value[:limit]
    text = (
        base64.b64encode(shown).decode()
        if raw
        else safe_text(shown.decode("utf-8", errors="replace"), keep_newlines=True)
    )
    left = len(value) - len(shown)
    return text + (f"\n… {left} more bytes (--max-bytes 0 shows all)" if left else "")


def short_hex(value: bytes, keep: int = 12) -> str:
    """The first ``keep`` hex digits of a hash, enough to tell rows apart in a table."""
    return value.hex()[:keep]


def body_diff(stored: Any, incoming: Any, path: str = "") -> list[str]:
    """What changed between two JSON values, one line per changed leaf, by dotted path
    (``payload.thought: 'plan' -> 'replan'``; ``(absent)`` for a missing key). Pure."""
    if isinstance(stored, dict) and isinstance(incoming, dict):
        out: list[str] = []
        for key in sorted(stored.keys() | incoming.keys()):
            sub = f"{path}.{key}" if path else str(key)
            if key not in incoming:
                out.append(f"{sub}: {_short(stored[key])} -> (absent)")
            elif key not in stored:
                out.append(f"{sub}: (absent) -> {_short(incoming[key])}")
            else:
                out.extend(body_diff(stored[key], incoming[key], sub))
        return out
    if isinstance(stored, list) and isinstance(incoming, list) and len(stored) == len(incoming):
        out = []
        for i, (a, b) in enumerate(zip(stored, incoming, strict=True)):
            out.extend(body_diff(a, b, f"{path}[{i}]"))
        return out
    if stored == incoming and type(stored) is type(incoming):
        return []
    return [f"{path or '(body)'}: {_short(stored)} -> {_short(incoming)}"]


def _short(value: Any, limit: int = 120) -> str:
    text = safe_text(json.dumps(value, sort_keys=True, ensure_ascii=False))
    return text if len(text) <= limit else text[: limit - 1] + "…"
