"""The timing loop: warm up until step times are steady, then time enough steps; statistics.

The rule, in full (``TimingRule``):

1. **Warm-up.** Steps run untimed until two consecutive windows of ``window`` steps agree: the
   median of the last ``window`` step times is within ``tolerance`` of the median of the
   ``window`` before them. The first step never counts (it allocates optimizer state, and
   compiles and autotunes kernels), so warm-up is at least ``2 x window + 1`` steps. It ends
   anyway after ``warmup_max_iters`` steps or ``warmup_max_s`` seconds (counted after the
   first step, so a long compilation is never cut short); the measurement then says it was
   not steady.
2. **Timing.** Steps are timed one by one, each ended by a device synchronisation, until at
   least ``min_iters`` steps *and* ``min_seconds`` seconds of step time are reached.
3. **Statistics.** The median step time, and the interquartile range (Q3 - Q1, the
   ``inclusive`` quartiles of ``statistics.quantiles``) as the spread.

In a multi-GPU run every rank must take the same decisions (a rank that stops early leaves
the others waiting in a collective), so each decision is made on ``agree(step_time)``: the
slowest rank's time of that step, the same number on every rank.

Pure Python: the step, the synchronisation and the clock are passed in, so the rule is tested
with a fake clock.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TimingRule:
    """When warm-up ends and when timing stops."""

    min_iters: int = 10
    """Timed steps, at least."""
    min_seconds: float = 5.0
    """Seconds of timed steps, at least."""
    window: int = 3
    """Steps per window of the steadiness test."""
    tolerance: float = 0.05
    """Largest relative difference of two windows' medians that counts as steady."""
    warmup_max_iters: int = 50
    """Warm-up steps at most."""
    warmup_max_s: float = 60.0
    """Warm-up seconds at most, after the first step."""

    def describe(self) -> str:
        """The rule in one sentence (for a result's notes)."""
        return (
            f"warm-up until the median of the last {self.window} step times is within "
            f"{self.tolerance:.0%} of the median of the {self.window} before (first step "
            f"excluded; at most {self.warmup_max_iters} steps or {self.warmup_max_s:g} s), then "
            f">= {self.min_iters} timed steps and >= {self.min_seconds:g} s, each synchronised; "
            "median and interquartile range of the step times"
        )


@dataclass(frozen=True)
class Timing:
    """The step times of one measurement and their statistics."""

    times_s: tuple[float, ...]
    """Timed step times, in order, s."""
    warmup_times_s: tuple[float, ...]
    """Warm-up step times, in order, s."""
    steady: bool
    """Whether warm-up ended by the steadiness test (else by its limits)."""

    @property
    def iterations(self) -> int:
        """Timed steps."""
        return len(self.times_s)

    @property
    def warmup_iterations(self) -> int:
        """Warm-up steps."""
        return len(self.warmup_times_s)

    @property
    def median_s(self) -> float:
        """Median step time, s."""
        return statistics.median(self.times_s)

    @property
    def iqr_s(self) -> float:
        """Interquartile range of the step times, s (0 with fewer than two steps)."""
        return interquartile_range(self.times_s)

    @property
    def measured_s(self) -> float:
        """Sum of the timed step times, s."""
        return sum(self.times_s)


def interquartile_range(values: Sequence[float]) -> float:
    """Q3 - Q1 (inclusive quartiles); 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


def is_steady(times: Sequence[float], window: int, tolerance: float) -> bool:
    """Whether the last two windows of ``times`` (the first step left out) agree."""
    usable = times[1:]
    if len(usable) < 2 * window:
        return False
    last = statistics.median(usable[-window:])
    before = statistics.median(usable[-2 * window : -window])
    return abs(last - before) <= tolerance * before


def measure(
    step: Callable[[], None],
    synchronize: Callable[[], None],
    rule: TimingRule,
    *,
    clock: Callable[[], float] = time.perf_counter,
    agree: Callable[[float], float] | None = None,
    on_step: Callable[[str, int, float | None], None] | None = None,
    on_timing_start: Callable[[], None] | None = None,
) -> Timing:
    """Warm up, then time, by ``rule``.

    ``agree`` maps this process's step time to the one every rank decides on (the slowest);
    ``on_step(stage, steps_done, fraction)`` reports progress (``warmup`` or ``timing``);
    ``on_timing_start`` is called just before the first timed step (to start sampling).
    """
    agreed = agree or (lambda seconds: seconds)

    def timed_step() -> tuple[float, float]:
        synchronize()
        started = clock()
        step()
        synchronize()
        own = clock() - started
        return own, agreed(own)

    warmup: list[float] = []
    decided: list[float] = []
    steady = False
    spent_after_first = 0.0
    while True:
        own, shared = timed_step()
        warmup.append(own)
        decided.append(shared)
        if len(decided) > 1:
            spent_after_first += shared
        if on_step is not None:
            on_step("warmup", len(warmup), None)
        if is_steady(decided, rule.window, rule.tolerance):
            steady = True
            break
        if len(decided) >= rule.warmup_max_iters or spent_after_first >= rule.warmup_max_s:
            break
    if on_timing_start is not None:
        on_timing_start()
    times: list[float] = []
    elapsed = 0.0
    while len(times) < rule.min_iters or elapsed < rule.min_seconds:
        own, shared = timed_step()
        times.append(own)
        elapsed += shared
        if on_step is not None:
            fraction = min(
                1.0,
                min(
                    len(times) / max(rule.min_iters, 1),
                    elapsed / rule.min_seconds if rule.min_seconds > 0 else 1.0,
                ),
            )
            on_step("timing", len(times), fraction)
    return Timing(times_s=tuple(times), warmup_times_s=tuple(warmup), steady=steady)
