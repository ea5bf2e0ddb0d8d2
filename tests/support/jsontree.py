"""A JSON syntax tree that can say what Python dicts cannot: duplicate keys, exact number
literals, chosen string escapes and whitespace. The decoder's differential test
(tests/support/decode_diff.py) mutates valid events with it and writes them back."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any


class Obj(list):  # list[tuple[str, Any]]: members in order, duplicates allowed
    pass


class Arr(list):
    pass


@dataclass(frozen=True)
class Num:
    literal: str


@dataclass(frozen=True)
class Raw:
    """Text written as is (e.g. NaN, a bare word, a broken token)."""

    text: str


Node = Any  # Obj | Arr | str | Num | Raw | bool | None


def parse(text: str | bytes) -> Node:
    """A valid JSON text as a tree (keeps duplicates and number literals)."""
    return json.loads(
        text,
        object_pairs_hook=Obj,
        parse_int=Num,
        parse_float=Num,
        parse_constant=Raw,
    )


def arr_hook(tree: Node) -> Node:
    if isinstance(tree, Obj):
        return Obj((k, arr_hook(v)) for k, v in tree)
    if isinstance(tree, list):
        return Arr(arr_hook(v) for v in tree)
    return tree


def load(text: str | bytes) -> Node:
    return arr_hook(parse(text))


def from_python(value: Any) -> Node:
    if isinstance(value, dict):
        return Obj((k, from_python(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return Arr(from_python(v) for v in value)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return Num(str(value))
    if isinstance(value, float):
        return Num(repr(value))
    raise TypeError(type(value))


@dataclass
class Style:
    """How to write a tree: whitespace, escapes, hex case."""

    item_sep: str = ","
    key_sep: str = ":"
    indent: str | None = None
    ws: str = ""  # whitespace around the document
    escape_rate: float = 0.0  # chance to write a character as \\uXXXX
    ascii_only: bool = False  # ensure_ascii: non-ASCII as \\uXXXX (pairs above BMP)
    upper_hex: bool = False
    slash: bool = False  # write "/" as "\\/"
    rng: random.Random = field(default_factory=lambda: random.Random(0))


_SHORT = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _u(code: int, upper: bool) -> str:
    return f"\\u{code:04X}" if upper else f"\\u{code:04x}"


def write_string(s: str, style: Style) -> str:
    out = ['"']
    rng = style.rng
    for ch in s:
        code = ord(ch)
        if style.escape_rate and rng.random() < style.escape_rate:
            if code > 0xFFFF:
                code -= 0x10000
                out.append(_u(0xD800 + (code >> 10), style.upper_hex))
                out.append(_u(0xDC00 + (code & 0x3FF), style.upper_hex))
            else:
                out.append(_u(code, style.upper_hex))
        elif ch in _SHORT:
            out.append(_SHORT[ch])
        elif code < 0x20:
            out.append(_u(code, style.upper_hex))
        elif ch == "/" and style.slash:
            out.append("\\/")
        elif code > 0x7E and (style.ascii_only or 0xD800 <= code <= 0xDFFF):
            if code > 0xFFFF:
                code -= 0x10000
                out.append(_u(0xD800 + (code >> 10), style.upper_hex))
                out.append(_u(0xDC00 + (code & 0x3FF), style.upper_hex))
            else:
                out.append(_u(code, style.upper_hex))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def write(tree: Node, style: Style | None = None) -> str:
    style = style or Style()
    parts: list[str] = []
    _write(tree, style, parts, 0)
    return style.ws + "".join(parts) + style.ws


def _write(node: Node, style: Style, out: list[str], level: int) -> None:
    if node is None:
        out.append("null")
    elif node is True:
        out.append("true")
    elif node is False:
        out.append("false")
    elif isinstance(node, str):
        out.append(write_string(node, style))
    elif isinstance(node, Num):
        out.append(node.literal)
    elif isinstance(node, Raw):
        out.append(node.text)
    elif isinstance(node, Obj | Arr | list):
        is_obj = isinstance(node, Obj)
        out.append("{" if is_obj else "[")
        if node:
            inner = "" if style.indent is None else "\n" + style.indent * (level + 1)
            for i, item in enumerate(node):
                if i:
                    out.append(style.item_sep)
                out.append(inner)
                if is_obj:
                    key, value = item
                    out.append(write_string(key, style))
                    out.append(style.key_sep)
                    _write(value, style, out, level + 1)
                else:
                    _write(item, style, out, level + 1)
            if style.indent is not None:
                out.append("\n" + style.indent * level)
        out.append("}" if is_obj else "]")
    else:
        raise TypeError(type(node))


def containers(node: Node, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Node]]:
    """Every Obj/Arr in the tree with its path (pre-order)."""
    found: list[tuple[tuple[Any, ...], Node]] = []
    if isinstance(node, Obj):
        found.append((path, node))
        for i, (_, v) in enumerate(node):
            found += containers(v, (*path, i))
    elif isinstance(node, list):
        found.append((path, node))
        for i, v in enumerate(node):
            found += containers(v, (*path, i))
    return found


def scalars(node: Node) -> list[tuple[Node, int]]:
    """(container, index) of every scalar value (not keys)."""
    found: list[tuple[Node, int]] = []
    if isinstance(node, Obj):
        for i, (_, v) in enumerate(node):
            if isinstance(v, Obj | list):
                found += scalars(v)
            else:
                found.append((node, i))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if isinstance(v, Obj | list):
                found += scalars(v)
            else:
                found.append((node, i))
    return found


def get(container: Node, index: int) -> Node:
    return container[index][1] if isinstance(container, Obj) else container[index]


def put(container: Node, index: int, value: Node) -> None:
    if isinstance(container, Obj):
        container[index] = (container[index][0], value)
    else:
        container[index] = value


def member(obj: Obj, key: str) -> Node:
    for k, v in obj:
        if k == key:
            return v
    raise KeyError(key)


def set_member(obj: Obj, key: str, value: Node) -> None:
    for i, (k, _) in enumerate(obj):
        if k == key:
            obj[i] = (k, value)
            return
    obj.append((key, value))


def copy(node: Node) -> Node:
    if isinstance(node, Obj):
        return Obj((k, copy(v)) for k, v in node)
    if isinstance(node, list):
        return Arr(copy(v) for v in node)
    return node
