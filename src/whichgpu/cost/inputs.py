"""Checks of the numbers a user gives the cost functions; each message names the input.

The cost functions are called from the command line and from Python, so a bad number (a
negative price, a utilisation above 1) is a ``UsageError`` that says which input and why,
never a wrong answer.
"""

from __future__ import annotations

import math

from whichgpu.errors import UsageError
from whichgpu.units import LARGEST_NUMBER


def positive(name: str, value: float) -> float:
    """``value`` if it is a finite number above zero."""
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{name} must be a positive number, not {value:g}.")
    return value


LONGEST_YEARS = 30
"""The longest ownership a break-even answers for: no GPU machine serves longer (the guides
advise replacing GPUs after about three years), and the monthly curve grows with the years."""


def ownership_years(name: str, value: float) -> float:
    """``value`` if it is a number of years above 0 and at most ``LONGEST_YEARS``."""
    positive(name, value)
    if value > LONGEST_YEARS:
        raise UsageError(
            f"{name} must be at most {LONGEST_YEARS} years, not {value:g}: no GPU machine is "
            "kept that long (the guides replace GPUs after about three years)."
        )
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


def answerable(name: str, value: float, inputs: str) -> float:
    """``value`` if it is a finite number no larger than ``LARGEST_NUMBER``: an answer never
    holds more (the README's promise); else a ``UsageError`` naming the figure and the
    ``inputs`` that made it."""
    if not (math.isfinite(value) and abs(value) <= LARGEST_NUMBER):
        raise UsageError(
            f"{name} comes to {value:.3g}, beyond the largest number whichgpu answers with "
            f"({LARGEST_NUMBER:.0e}); check {inputs}."
        )
    return value
