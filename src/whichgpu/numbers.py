"""Numbers as people read them: a few significant figures, thousands separators, never
scientific notation (``2,630``, ``47.4``, ``0.177``). Shared by every view (terminal, HTML,
notebook) and by the ranking's reasons, so it sits below them all."""

from __future__ import annotations


def significant(value: float | None, digits: int = 3, *, trim: bool = False) -> str:
    """``value`` to ``digits`` significant figures with thousands separators; whole numbers
    from ``10 ** (digits - 1)`` up (``12,345`` keeps its digits); ``-`` for None. ``trim``
    drops trailing zeros of the decimals (``7.3``, not ``7.300``), for figures quoted from a
    table that gave no more."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    decimals = digits - 1 - int(f"{magnitude:e}".split("e")[1])
    text = f"{value:,.{max(decimals, 0)}f}"
    if trim and "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def count_si(n: float) -> str:
    """A large count with an SI prefix, three significant figures (``1.24 G``, ``66.0 T``)."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= factor:
            return f"{significant(n / factor)} {prefix}"
    return significant(n)
