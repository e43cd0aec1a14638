"""Exact numbers: the one place floats, ints, Fractions and sympy numbers become each other.

Bounds, rounds and crossovers are exact (:class:`~fractions.Fraction`); the figures users give
(``alpha_us=0.7``) are read as the shortest decimal that rounds to them, so ``0.7`` is ``7/10``.
"""

from __future__ import annotations

import math
from fractions import Fraction
from numbers import Rational, Real
from typing import TYPE_CHECKING

from collsynth.errors import InvalidInstanceError

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    import sympy

__all__ = ["exact_fraction", "as_fraction", "sympy_rational", "fraction_text"]


def exact_fraction(value: Real, name: str = "value") -> Fraction:
    """``value`` (>= 0) as a Fraction: ints and Fractions as they are, floats by their shortest
    decimal.

    Raises
    ------
    InvalidInstanceError
        Not a number, not finite, or negative (``name`` says which figure).

    >>> exact_fraction(0.7), exact_fraction(3)
    (Fraction(7, 10), Fraction(3, 1))
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidInstanceError(f"{name} = {value!r}; expected a number")
    if isinstance(value, Rational):
        result = Fraction(value)
    else:
        if not math.isfinite(value):
            raise InvalidInstanceError(f"{name} = {value!r}; expected a finite number")
        result = Fraction(repr(float(value)))
    if result < 0:
        raise InvalidInstanceError(f"{name} = {value!r}; expected a number >= 0")
    return result


def as_fraction(value: "int | Fraction | sympy.Expr") -> Fraction:
    """An exact number (int, Fraction, or a sympy rational) as a Fraction.

    Raises
    ------
    InvalidInstanceError
        A sympy value that is not an exact rational number.

    >>> import sympy
    >>> as_fraction(sympy.Rational(3, 4))
    Fraction(3, 4)
    """
    if isinstance(value, (int, Fraction)) and not isinstance(value, bool):
        return Fraction(value)
    import sympy

    number = sympy.sympify(value)
    if not number.is_Rational:
        raise InvalidInstanceError(f"expected an exact rational number, got {number}")
    return Fraction(int(number.p), int(number.q))


def sympy_rational(value: Real, name: str = "figure") -> "sympy.Rational":
    """``value`` (>= 0, see :func:`exact_fraction`) as a sympy Rational.

    >>> sympy_rational(0.7)
    7/10
    """
    import sympy

    f = exact_fraction(value, name)
    return sympy.Rational(f.numerator, f.denominator)


def fraction_text(value: Fraction) -> str:
    """``"3"`` or ``"7/10"``: a Fraction as JSON and tables show it.

    >>> fraction_text(Fraction(7, 10)), fraction_text(Fraction(6, 2))
    ('7/10', '3')
    """
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"
