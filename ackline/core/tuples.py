"""Building named tuples on the hot path without their ``__new__``.

A ``NamedTuple`` class's ``__new__`` is a Python function (generated code that calls
``tuple.__new__``), so building one costs a Python frame: ~0.2 µs against ~0.11 µs for
``tuple.__new__`` called directly, measured with timeit on this machine. The worker builds
four per event (the Kafka record, the decoded row, its coordinates, the pair of them), so
the frames were ~0.4 µs of an event's ~12 µs on a replay, where one core bounds the rate.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar, cast

T = TypeVar("T", bound=tuple[Any, ...])


def builder(cls: type[T]) -> Callable[[tuple[Any, ...]], T]:
    """``cls`` built from one tuple of all its fields, in declaration order, defaults
    included: nothing checks the count, so every call site passes them all (a short tuple
    makes a value whose missing fields raise IndexError when read)."""
    return cast(Callable[[tuple[Any, ...]], T], partial(tuple.__new__, cls))
