"""A model of PyTorch's CUDA caching allocator, to replay a traced step's allocations.

PyTorch never hands tensor memory back to the driver between steps, so what a GPU must hold is
the peak of *reserved* segment bytes, not the peak of tensor bytes. This module replays an
ordered stream of allocations and frees through the rules of
``c10/cuda/CUDACachingAllocator.cpp`` (the constants below are named as there), with or
without ``expandable_segments``, and reads off the allocator's counters (``AllocatorStats``).

The rules, the commit they were read at, what is left out: docs/memory.md, "The caching allocator".
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from whichgpu.units import MIB

MIN_BLOCK_BYTES = 512
"""``kMinBlockSize``: every request is rounded up to a multiple of this."""
SMALL_REQUEST_BYTES = 1 * MIB
"""``kSmallSize``: requests up to this size use the small pool."""
SMALL_SEGMENT_BYTES = 2 * MIB
"""``kSmallBuffer``: the size of every small-pool segment."""
LARGE_SEGMENT_BYTES = 20 * MIB
"""``kLargeBuffer``: the segment allocated for large-pool requests below 10 MiB."""
MIN_LARGE_ALLOC_BYTES = 10 * MIB
"""``kMinLargeAlloc``: from this size up, a segment is the request rounded to 2 MiB."""
ROUND_LARGE_BYTES = 2 * MIB
"""``kRoundLarge``: rounding of segments for requests of 10 MiB and more."""


def round_request(size_bytes: int) -> int:
    """The block size the allocator hands out for a request (``round_size``)."""
    if size_bytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    return -(-size_bytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def segment_size(block_bytes: int) -> int:
    """The ``cudaMalloc`` size when no cached block fits (``get_allocation_size``)."""
    if block_bytes <= SMALL_REQUEST_BYTES:
        return SMALL_SEGMENT_BYTES
    if block_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_SEGMENT_BYTES
    return -(-block_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


class OutOfMemory(Exception):
    """The replay needed more device memory than the capacity it was given."""


_SIZE_SHIFT = 96
_SEGMENT_SHIFT = 64
"""A free block's sort key packs (size, segment, offset) into one integer: offsets are below
2**64 B and segment numbers below 2**32, so ordering the integers orders the triples (best
fit: smallest size, then lowest segment and address), and comparing integers is several times
cheaper than comparing tuples."""


@dataclass(eq=False, slots=True)
class _Block:
    segment: int
    offset: int
    size: int
    small: bool
    allocated: bool = False
    prev: _Block | None = None
    next: _Block | None = None

    def key(self) -> int:
        return (self.size << _SIZE_SHIFT) | (self.segment << _SEGMENT_SHIFT) | self.offset


@dataclass(slots=True)
class _Pool:
    small: bool
    free: list[int] = field(default_factory=list)
    """Sorted keys (``_Block.key``) of the free blocks: best fit is a bisection."""
    blocks: dict[int, _Block] = field(default_factory=dict)
    """Free blocks by key."""

    def insert(self, block: _Block) -> None:
        key = block.key()
        bisect.insort(self.free, key)
        self.blocks[key] = block

    def remove(self, block: _Block) -> None:
        key = block.key()
        del self.free[bisect.bisect_left(self.free, key)]
        del self.blocks[key]

    def take_best_fit(self, size: int) -> _Block | None:
        """Remove and return the smallest free block of at least ``size`` bytes (lowest
        segment and address among equals), or None."""
        free = self.free
        index = bisect.bisect_left(free, size << _SIZE_SHIFT)
        if index == len(free):
            return None
        return self.blocks.pop(free.pop(index))


@dataclass(frozen=True)
class AllocatorStats:
    """What the caching allocator's counters would read after a replay."""

    peak_allocated_bytes: int
    """``torch.cuda.max_memory_allocated``: peak of handed-out block bytes (after rounding)."""
    peak_reserved_bytes: int
    """``torch.cuda.max_memory_reserved``: peak of segment bytes held from the driver."""
    peak_requested_bytes: int
    """Peak of the exact requested bytes (the live-tensor peak)."""
    final_reserved_bytes: int
    """Segment bytes still held at the end (what the next step starts from)."""
    segments_allocated: int
    """``cudaMalloc`` calls made."""
    cache_flushes: int
    """Times the cached segments were released to make room (``num_alloc_retries``)."""


class CachingAllocator:
    """Replays allocations and frees as PyTorch's CUDA caching allocator would serve them.

    ``capacity_bytes`` is what the allocator may reserve in total (device memory minus what
    lives outside the allocator); ``None`` means unlimited. ``malloc`` raises ``OutOfMemory``
    when a request cannot be served even after releasing the cache.
    """

    def __init__(self, capacity_bytes: int | None = None, *, expandable: bool = False) -> None:
        self.capacity_bytes = capacity_bytes
        self.expandable = expandable
        self._pools = {True: _Pool(small=True), False: _Pool(small=False)}
        self._live: dict[int, _Block] = {}
        self._segments: dict[int, int] = {}
        self._next_segment = 0
        self._tails: dict[bool, _Block | None] = {True: None, False: None}
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.requested_bytes = 0
        self._requested: dict[int, int] = {}
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.peak_requested_bytes = 0
        self.segments_allocated = 0
        self.cache_flushes = 0

    # --- public ------------------------------------------------------------------------------

    def malloc(self, handle: int, size_bytes: int) -> None:
        """Serve a request of ``size_bytes`` for the tensor storage ``handle``."""
        # round_request, inlined: a replay makes thousands of these calls
        size = (
            -(-size_bytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
            if size_bytes > MIN_BLOCK_BYTES
            else MIN_BLOCK_BYTES
        )
        small = size <= SMALL_REQUEST_BYTES
        pool = self._pools[small]
        block = pool.take_best_fit(size)
        if block is None:
            block = self._grow(pool, size)
        remaining = block.size - size
        if (
            remaining >= MIN_BLOCK_BYTES
            if (small or self.expandable)
            else remaining > SMALL_REQUEST_BYTES
        ):
            self._split(pool, block, size, remaining)
        block.allocated = True
        self._live[handle] = block
        self._requested[handle] = size_bytes
        self.allocated_bytes += block.size
        self.requested_bytes += size_bytes
        if self.allocated_bytes > self.peak_allocated_bytes:
            self.peak_allocated_bytes = self.allocated_bytes
        if self.requested_bytes > self.peak_requested_bytes:
            self.peak_requested_bytes = self.requested_bytes

    def free(self, handle: int) -> None:
        """Return the block of ``handle`` to its pool, merging with free neighbours."""
        block = self._live.pop(handle)
        self.allocated_bytes -= block.size
        self.requested_bytes -= self._requested.pop(handle)
        block.allocated = False
        pool = self._pools[block.small]
        before, after = block.prev, block.next
        if before is not None and not before.allocated:
            pool.remove(before)
            block = self._merge(before, block)
        if after is not None and not after.allocated:
            pool.remove(after)
            block = self._merge(block, after)
        pool.insert(block)

    def stats(self) -> AllocatorStats:
        """The counters so far."""
        return AllocatorStats(
            peak_allocated_bytes=self.peak_allocated_bytes,
            peak_reserved_bytes=self.peak_reserved_bytes,
            peak_requested_bytes=self.peak_requested_bytes,
            final_reserved_bytes=self.reserved_bytes,
            segments_allocated=self.segments_allocated,
            cache_flushes=self.cache_flushes,
        )

    # --- segments ----------------------------------------------------------------------------

    def _grow(self, pool: _Pool, size: int) -> _Block:
        if self.expandable:
            return self._expand(pool, size)
        nbytes = segment_size(size)
        if not self._fits(nbytes):
            self._release_cache()
            if not self._fits(nbytes):
                raise OutOfMemory(nbytes)
        segment = self._next_segment
        self._next_segment += 1
        self._segments[segment] = nbytes
        self._reserve(nbytes)
        return _Block(segment=segment, offset=0, size=nbytes, small=pool.small)

    def _expand(self, pool: _Pool, size: int) -> _Block:
        """Expandable segments: extend the pool's single segment at its tail."""
        page = SMALL_SEGMENT_BYTES if pool.small else LARGE_SEGMENT_BYTES
        tail = self._tails[pool.small]
        reuse = tail is not None and not tail.allocated
        have = tail.size if reuse and tail is not None else 0
        extra = -(-(size - have) // page) * page
        if not self._fits(extra):
            self._release_cache()
            tail = self._tails[pool.small]
            reuse = tail is not None and not tail.allocated
            have = tail.size if reuse and tail is not None else 0
            extra = -(-(size - have) // page) * page
            if not self._fits(extra):
                raise OutOfMemory(extra)
        self._reserve(extra)
        segment = 0 if pool.small else 1
        if reuse and tail is not None:
            pool.remove(tail)
            tail.size += extra
            return tail
        offset = 0 if tail is None else tail.offset + tail.size
        block = _Block(segment=segment, offset=offset, size=extra, small=pool.small, prev=tail)
        if tail is not None:
            tail.next = block
        self._tails[pool.small] = block
        return block

    def _fits(self, nbytes: int) -> bool:
        return self.capacity_bytes is None or self.reserved_bytes + nbytes <= self.capacity_bytes

    def _reserve(self, nbytes: int) -> None:
        self.reserved_bytes += nbytes
        self.segments_allocated += 1
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)

    def _release_cache(self) -> None:
        """``release_cached_blocks``: give back every segment with nothing allocated in it."""
        self.cache_flushes += 1
        for pool in self._pools.values():
            if self.expandable:
                self._unmap_tail(pool)
                continue
            whole = [b for b in pool.blocks.values() if b.prev is None and b.next is None]
            for block in whole:
                pool.remove(block)
                self.reserved_bytes -= self._segments.pop(block.segment)

    def _unmap_tail(self, pool: _Pool) -> None:
        page = SMALL_SEGMENT_BYTES if pool.small else LARGE_SEGMENT_BYTES
        tail = self._tails[pool.small]
        if tail is None or tail.allocated:
            return
        start = -(-tail.offset // page) * page
        end = tail.offset + tail.size
        unmapped = max(0, (end - start) // page * page)
        if unmapped == 0:
            return
        pool.remove(tail)
        tail.size -= unmapped
        self.reserved_bytes -= unmapped
        if tail.size == 0:
            self._tails[pool.small] = tail.prev
            if tail.prev is not None:
                tail.prev.next = None
        else:
            pool.insert(tail)

    # --- blocks ------------------------------------------------------------------------------

    def _split(self, pool: _Pool, block: _Block, size: int, remaining: int) -> None:
        """Keep the first ``size`` bytes of ``block`` and free the ``remaining`` rest (the
        caller has checked the pool's split threshold)."""
        rest = _Block(
            block.segment, block.offset + size, remaining, block.small, False, block, block.next
        )
        if block.next is not None:
            block.next.prev = rest
        elif self._tails[block.small] is block:
            self._tails[block.small] = rest
        block.next = rest
        block.size = size
        pool.insert(rest)

    def _merge(self, low: _Block, high: _Block) -> _Block:
        """Merge two adjacent blocks of a segment, ``low`` below ``high``; ``low`` survives."""
        low.size += high.size
        low.next = high.next
        if high.next is not None:
            high.next.prev = low
        if self._tails[low.small] is high:
            self._tails[low.small] = low
        return low


def replay(
    events: Iterable[tuple[int, int, bool]],
    capacity_bytes: int | None = None,
    *,
    expandable: bool = False,
) -> AllocatorStats:
    """Replay ``(handle, size_bytes, is_alloc)`` events; raises ``OutOfMemory`` past capacity."""
    allocator = CachingAllocator(capacity_bytes, expandable=expandable)
    for handle, size_bytes, is_alloc in events:
        if is_alloc:
            allocator.malloc(handle, size_bytes)
        else:
            allocator.free(handle)
    return allocator.stats()
