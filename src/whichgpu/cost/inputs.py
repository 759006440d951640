"""Checks of the numbers a user gives the cost functions; each message names the input.

The cost functions are called from the command line and from Python, so a bad number (a
negative price, a utilisation above 1) is a ``UsageError`` that says which input and why,
never a wrong answer.
"""

from __future__ import annotations

import math

from whichgpu.errors import UsageError


def positive(name: str, value: float) -> float:
    """``value`` if it is a finite number above zero."""
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{name} must be a positive number, not {value:g}.")
    return value


def non_negative(name: str, value: float) -> float:
    """``value`` if it is a finite number of at least zero."""
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{name} must be zero or more, not {value:g}.")
    return value


def fraction(name: str, value: float) -> float:
    """``value`` if it is a share of time above 0 and at most 1."""
    if not math.isfinite(value) or not 0 < value <= 1:
        raise UsageError(
            f"{name} must be a fraction above 0 and at most 1 (0.15 = 15 % of the time), "
            f"not {value:g}."
        )
    return value
