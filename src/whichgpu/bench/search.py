"""The largest size that runs: grow by doubling, then bisect, given a probe.

Pure Python. ``search_largest`` asks ``probe(size)`` whether a size runs (a batch size, or a
sequence length at a fixed batch) and returns the largest size that ran, to ``resolution``:

1. Probe ``start``. If it runs, double until a size fails (or ``upper`` is reached); if it
   fails, halve until a size runs (or ``minimum`` fails too: nothing fits).
2. Bisect between the largest size that ran and the smallest that failed until they are at
   most ``resolution`` apart (1: exact).

Given a ``guess`` of the answer (whichgpu's memory prediction for the device), step 1 starts
there instead and gallops: steps of ``resolution``, 2 x ``resolution``, 4 x … up from the guess
while sizes run, or down from it while they fail. A guess that is right costs two probes (the
guess runs, the next size fails) where doubling from 1 to a batch in the hundreds costs about
twenty; a wrong one costs twice the number of doublings its error needs, no more.

The answer is always a size that was seen to run. Memory grows with size, so a failure
above a success is the boundary; but a size can fail for a reason of its own (an allocator or
kernel choice particular to it, a transient), which would stop the growth far too early. The
guard: when doubling first fails at ``s`` by running out of memory, ``2s`` is probed too; if
it runs, the failure at ``s`` is recorded as an anomaly (non-monotonic) and growth goes on
from ``2s``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """What one probe said."""

    runs: bool
    """Whether the size ran."""
    detail: str
    """``ran, peak 3.1 GiB``, ``out of memory``, ``timed out`` …"""
    unusual: bool = False
    """A failure other than running out of memory (timeout, crash, error): a limit, but
    worth a note."""


@dataclass(frozen=True)
class ProbeRecord:
    """One probe of a search."""

    size: int
    """Size probed."""
    verdict: Verdict
    """Its outcome."""


@dataclass(frozen=True)
class SearchResult:
    """The outcome of a search."""

    largest: int | None
    """Largest size that ran; None if not even ``minimum`` ran."""
    smallest_failure: int | None
    """Smallest size seen to fail above ``largest`` (None: the bound was reached)."""
    resolution: int
    """Resolution asked for (1 = exact)."""
    probes: tuple[ProbeRecord, ...]
    """Every probe, in order."""
    reached_upper: bool
    """Whether growth stopped at ``upper`` rather than at a failure."""
    notes: tuple[str, ...]
    """Anomalies: non-monotonic results, failures other than out-of-memory."""
    guess: int | None = None
    """The size the search started from when it was given a guess (within the bounds)."""


def search_largest(
    probe: Callable[[int], Verdict],
    *,
    start: int = 1,
    resolution: int = 1,
    minimum: int = 1,
    upper: int | None = None,
    what: str = "batch",
    guess: int | None = None,
) -> SearchResult:
    """The largest size in ``[minimum, upper]`` for which ``probe`` runs, to ``resolution``;
    from ``guess`` (galloping) when one is given, else from ``start`` (doubling)."""
    if resolution < 1:
        raise ValueError("resolution must be at least 1")
    if minimum < 1 or start < minimum or (upper is not None and start > upper):
        raise ValueError("need 1 <= minimum <= start <= upper")
    if guess is not None:
        guess = max(minimum, guess if upper is None else min(guess, upper))
    records: list[ProbeRecord] = []
    notes: list[str] = []

    def run(size: int) -> bool:
        verdict = probe(size)
        records.append(ProbeRecord(size, verdict))
        if not verdict.runs and verdict.unusual:
            notes.append(f"{what} {size}: {verdict.detail}; taken as the limit")
        return verdict.runs

    def last_was_unusual() -> bool:
        return records[-1].verdict.unusual

    good: int | None = None
    bad: int | None = None
    reached_upper = False
    first = start if guess is None else guess
    step = resolution

    def grown(size: int) -> int:
        """The next size up from a size that ran: double, or gallop on from the guess."""
        nonlocal step
        if guess is None:
            bigger = size * 2
        else:
            bigger = size + step
            step *= 2
        return bigger if upper is None else min(bigger, upper)

    if run(first):
        good = first
        while True:
            if upper is not None and good >= upper:
                reached_upper = True
                break
            size = grown(good)
            if run(size):
                good = size
                continue
            # guard: a failure below a size that runs is not the boundary (not tried after a
            # timeout or a crash, which would likely cost as much again)
            past = size * 2
            if not last_was_unusual() and (upper is None or past <= upper) and run(past):
                notes.append(
                    f"non-monotonic: {what} {size} failed but {what} {past} ran; growth went "
                    "on past it (memory use at that size is unusual)"
                )
                good = past
                continue
            bad = size
            break
    else:
        bad = first
        size = first
        while size > minimum:
            if guess is None:
                size = max(minimum, size // 2)
            else:
                size = max(minimum, size - step)
                step *= 2
            if run(size):
                good = size
                break
            bad = size
        if good is None:
            return SearchResult(
                largest=None,
                smallest_failure=bad,
                resolution=resolution,
                probes=tuple(records),
                reached_upper=False,
                notes=tuple(notes),
                guess=guess,
            )
    if bad is not None:
        assert good is not None
        while bad - good > resolution:
            middle = (good + bad) // 2
            if run(middle):
                good = middle
            else:
                bad = middle
    return SearchResult(
        largest=good,
        smallest_failure=bad,
        resolution=resolution,
        probes=tuple(records),
        reached_upper=reached_upper,
        notes=tuple(notes),
        guess=guess,
    )
