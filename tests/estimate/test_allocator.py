"""The caching-allocator model follows the rules of PyTorch's CUDACachingAllocator."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from whichgpu.estimate.allocator import (
    CachingAllocator,
    OutOfMemory,
    replay,
    round_request,
    segment_size,
)
from whichgpu.units import MIB


def test_requests_round_to_512_bytes() -> None:
    assert round_request(1) == 512
    assert round_request(512) == 512
    assert round_request(513) == 1024
    assert round_request(0) == 512


def test_segment_sizes_by_request() -> None:
    assert segment_size(512) == 2 * MIB  # small pool
    assert segment_size(1 * MIB) == 2 * MIB
    assert segment_size(1 * MIB + 512) == 20 * MIB  # 1-10 MiB share 20 MiB blocks
    assert segment_size(10 * MIB - 512) == 20 * MIB
    assert segment_size(10 * MIB) == 10 * MIB  # from 10 MiB: rounded to 2 MiB
    assert segment_size(11 * MIB) == 12 * MIB


def test_small_requests_share_a_two_mib_segment() -> None:
    a = CachingAllocator()
    for handle in range(4):
        a.malloc(handle, 100_000)
    assert a.reserved_bytes == 2 * MIB
    assert a.allocated_bytes == 4 * round_request(100_000)


def test_freed_block_is_reused_and_merged() -> None:
    a = CachingAllocator()
    a.malloc(1, 4 * MIB)
    a.malloc(2, 4 * MIB)  # same 20 MiB segment
    assert a.reserved_bytes == 20 * MIB
    a.free(1)
    a.free(2)
    a.malloc(3, 12 * MIB)  # fits only in the merged free block: no new segment
    assert a.reserved_bytes == 20 * MIB


def test_large_pool_keeps_small_remainder_attached() -> None:
    """A remainder of at most 1 MiB in the large pool is not split off (it stays allocated)."""
    a = CachingAllocator()
    a.malloc(1, 12 * MIB)
    a.free(1)
    a.malloc(2, 12 * MIB - 512 * 1024)  # leaves 512 KiB: not split
    assert a.allocated_bytes == 12 * MIB
    a.free(2)
    a.malloc(3, 10 * MIB)  # leaves 2 MiB: split
    assert a.allocated_bytes == 10 * MIB


def test_best_fit_prefers_the_smallest_block() -> None:
    a = CachingAllocator()
    a.malloc(1, 30 * MIB)
    a.malloc(2, 12 * MIB)
    a.free(1)
    a.free(2)
    a.malloc(3, 11 * MIB)  # best fit: the 12 MiB segment, so 30 MiB stays whole
    a.malloc(4, 30 * MIB)
    assert a.reserved_bytes == 42 * MIB


def test_capacity_flushes_cache_then_fails() -> None:
    a = CachingAllocator(capacity_bytes=40 * MIB)
    a.malloc(1, 30 * MIB)
    a.free(1)
    a.malloc(2, 36 * MIB)  # needs the cached 30 MiB segment released first
    assert a.cache_flushes == 1
    assert a.reserved_bytes == 36 * MIB
    with pytest.raises(OutOfMemory):
        a.malloc(3, 10 * MIB)


def test_expandable_segments_grow_in_pages() -> None:
    a = CachingAllocator(expandable=True)
    a.malloc(1, 30 * MIB)
    assert a.reserved_bytes == 40 * MIB  # 20 MiB pages in the large pool
    a.malloc(2, 5 * MIB)  # fits in the mapped tail
    assert a.reserved_bytes == 40 * MIB
    a.free(2)
    a.malloc(3, 12 * MIB)  # tail is free (10 MiB): extend by one page
    assert a.reserved_bytes == 60 * MIB


events = st.lists(
    st.tuples(st.booleans(), st.integers(min_value=1, max_value=40 * MIB)), max_size=60
)


@settings(max_examples=60, deadline=None)
@given(events)
def test_invariants_hold_for_any_stream(stream: list[tuple[bool, int]]) -> None:
    """Reserved covers allocated covers requested, and everything freed returns to the pool."""
    a = CachingAllocator()
    live: list[int] = []
    for handle, (free_one, size) in enumerate(stream):
        if free_one and live:
            a.free(live.pop(0))
        else:
            a.malloc(handle, size)
            live.append(handle)
        assert a.requested_bytes <= a.allocated_bytes <= a.reserved_bytes
    for handle in live:
        a.free(handle)
    assert a.allocated_bytes == 0
    stats = a.stats()
    assert stats.peak_requested_bytes <= stats.peak_allocated_bytes <= stats.peak_reserved_bytes


def test_replay_of_event_tuples() -> None:
    stats = replay([(1, 3 * MIB, True), (2, 3 * MIB, True), (1, 0, False), (3, 3 * MIB, True)])
    assert stats.peak_reserved_bytes == 20 * MIB
    assert stats.peak_allocated_bytes == 6 * MIB
