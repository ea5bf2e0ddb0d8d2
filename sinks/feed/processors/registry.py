"""Finding a processor by name: built-in, entry point, or ``module:attribute``.

``ackline process NAME`` resolves NAME in this order:

1. a built-in: ``runs`` (:mod:`ackline.sinks.feed.processors.runs`) and ``dispatcher``
   (:mod:`ackline.sinks.feed.dispatcher`);
2. an entry point of the group :data:`GROUP` named NAME (a user's package declares
   ``[project.entry-points."ackline.processors"] my_proc = "my_pkg.mod:PROCESSOR"``);
3. ``module:attribute`` (dotted attributes allowed), importable from ``sys.path``.

The object found is the processor; a class is instantiated with no arguments. It is then
checked against the contract (:func:`ackline.sinks.feed.processors.contract.check`).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Final

from ackline.sinks.errors import FeedError
from ackline.sinks.feed.processors.contract import Processor, check

GROUP: Final = "ackline.processors"
BUILTINS: Final = {
    "runs": "ackline.sinks.feed.processors.runs:RUNS",
    "dispatcher": "ackline.sinks.feed.dispatcher:DISPATCHER",
}


def available() -> dict[str, str]:
    """Every processor findable by name: name -> ``module:attribute`` (built-ins win)."""
    found = {ep.name: ep.value for ep in entry_points(group=GROUP)}
    found.update(BUILTINS)
    return dict(sorted(found.items()))


def target_of(spec: str) -> str:
    """The ``module:attribute`` a name or spec stands for, or a FeedError."""
    if ":" in spec:
        return spec
    if spec in BUILTINS:
        return BUILTINS[spec]
    for ep in entry_points(group=GROUP, name=spec):
        return str(ep.value)
    known = ", ".join(available()) or "-"
    raise FeedError(f"no processor named {spec!r} (known: {known}; or give module:attribute)")


def load(spec: str) -> Processor:
    """Import and check the processor ``spec`` names (see the module docstring)."""
    target = target_of(spec)
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise FeedError(f"processor {spec!r}: {target!r} is not module:attribute")
    try:
        obj: object = importlib.import_module(module_name)
    except Exception as exc:  # an ImportError, or the module's own error at import
        raise FeedError(
            f"processor {spec!r}: cannot import {module_name}: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise FeedError(f"processor {spec!r}: {target} has no attribute {part!r}") from exc
    if isinstance(obj, type):
        try:
            obj = obj()
        except Exception as exc:
            raise FeedError(
                f"processor {spec!r}: {target}() failed: {type(exc).__name__}: {exc}"
            ) from exc
    return check(obj, spec)


def cursor_name(spec: str) -> str:
    """The name of the cursor ``spec`` stands for, as `processors reset --cursor-only`
    moves it: a ``module:attribute`` or a built-in or entry point is loaded for its
    processor's name; any other name, or one whose code does not load, is the cursor's
    name as given (a cursor can be moved without the processor's code, and the reset
    then says when no cursor has that name)."""
    if ":" not in spec and spec not in available():
        return spec
    try:
        return load(spec).name
    except FeedError:  # a reader's own name may hold a ':' (`tail --reader a:b`)
        return spec
