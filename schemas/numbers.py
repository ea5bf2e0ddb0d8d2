"""The number rule: which JSON number literals an event may carry (``CANONICAL.md``).

An integer literal (no fraction, no exponent) is read as a Python ``int``, exactly. A
literal with a fraction or an exponent is read as a double (``float(literal)``), and the
canonical form writes that double back in its shortest round-trip text (``repr``). So it
is accepted only if nothing is lost on the way: its decimal value must equal the value of
``repr(float(literal))``. Then what is hashed, what the ``jsonb`` column stores and what
the producer sent are the same number. ``0.1``, ``1E2``, ``100.00``, ``1e-07``, ``-0.0``
and every output of a shortest-round-trip formatter (Python, JavaScript, Go, Rust, Java
19+, .NET Core 3+) pass; ``12345678901234567890.5`` (read as ``1.2345678901234567e+19``),
``1e-400`` (read as ``0.0``) and ``0.10000000000000001`` (``%.17g`` of 0.1) do not. A
literal too large for a double (``1e400``, read as infinity) is refused before this rule.

Both decoders apply it at parse time, through :func:`finite_float` and
:func:`round_trips` (``ackline.schemas.decode``) or :func:`exact_float`
(``ackline.schemas.decode_fast``).
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import Final

_ZERO_DIGITS: Final = frozenset("0.-+")


def round_trips(literal: str, value: float) -> bool:
    """Whether the JSON number ``literal`` has exactly the decimal value of ``repr(value)``,
    ``value`` being ``float(literal)`` (finite).

    The comparison is exact (``Decimal`` equality does not round); zeros of either sign
    are equal. An exponent beyond ``Decimal``'s range (more than 18 digits) is a zero
    literal (``0e-99999999999999999999``, exact) or a value a double cannot hold.
    """
    shortest = repr(value)
    if literal == shortest:
        return True
    try:
        return Decimal(literal) == Decimal(shortest)
    except InvalidOperation:
        mantissa = literal.partition("e")[0].partition("E")[0]
        return value == 0.0 and set(mantissa) <= _ZERO_DIGITS


def finite_float(literal: str) -> float:
    """``float(literal)``; ValueError for a literal that reads as infinity (``1e400``)."""
    value = float(literal)
    if math.isinf(value):
        raise ValueError(f"{literal[:40]} is not a finite JSON number")
    return value


def exact_float(literal: str) -> float:
    """:func:`finite_float` that also refuses (ValueError) a literal that does not
    :func:`round_trips`: a float hook for a parser that hands over every float literal."""
    value = finite_float(literal)
    if not round_trips(literal, value):
        raise ValueError(f"{literal[:40]} is not exactly a double")
    return value
