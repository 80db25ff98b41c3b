"""Micro-batching: size-or-time windows with optional length buckets and a token budget.

Pure code: no I/O, no threads, no clock of its own -- every call takes ``now`` (seconds, monotonic), so
tests drive it with a fake clock.

How the runner uses it::

    batcher.add(item, length, now)          # as records arrive
    if engine_is_idle:
        batch = batcher.next_batch(now)     # None until a batch is due
    timeout = batcher.next_deadline()       # when to wake up for the oldest record

Guarantees:

* A batch never holds more than ``max_batch_size`` items, and never more than ``max_batch_tokens`` padded
  tokens (batch size x longest length) -- except a single item longer than the budget, which goes alone.
* A batch is due when some bucket is full, or when the oldest item has waited ``max_queue_delay_s``.
  The batcher is only asked for a batch when the engine is idle, so while the engine is busy batches keep
  growing rather than leaving as small batches queued behind a timer.
* Nothing is lost or duplicated: every added item leaves through exactly one ``next_batch``, ``drain`` or
  ``remove`` call.
* Without length buckets, items leave in the order they were added (so order within a partition is kept).
  With ``bucket_by_length`` items of one bucket leave in order, but a short record may overtake a long one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    max_batch_size: int
    max_queue_delay_s: float
    bucket_by_length: bool = False
    max_batch_tokens: int | None = None  # cap on len(batch) * max(length in batch)
    bucket_width: int = 16  # lengths that round up to the same multiple of this share a bucket

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if self.max_queue_delay_s < 0:
            raise ValueError("max_queue_delay_s must not be negative")
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise ValueError("max_batch_tokens must be at least 1")
        if self.bucket_width < 1:
            raise ValueError("bucket_width must be at least 1")


@dataclass(slots=True)
class _Entry(Generic[T]):
    item: T
    length: int
    deadline_s: float
    seq: int  # arrival order, to find the oldest head among buckets


@dataclass(slots=True)
class _Bucket(Generic[T]):
    entries: deque[_Entry[T]] = field(default_factory=deque)
    max_length: int = 0  # longest length ever added since the bucket was last empty (an upper bound)


class Batcher(Generic[T]):
    """Gathers items into batches closed by size, padded-token budget or time."""

    def __init__(self, policy: BatchPolicy) -> None:
        self.policy = policy
        self._buckets: dict[int, _Bucket[T]] = {}
        self._seq = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, item: T, now: float, length: int = 1) -> None:
        """Queue one item that arrived at ``now``; ``length`` is its size in tokens (>= 1)."""
        length = max(1, length)
        key = -(-length // self.policy.bucket_width) if self.policy.bucket_by_length else 0
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket()
        bucket.entries.append(_Entry(item, length, now + self.policy.max_queue_delay_s, self._seq))
        bucket.max_length = max(bucket.max_length, length)
        self._seq += 1
        self._count += 1

    def next_deadline(self) -> float | None:
        """The earliest time at which a batch becomes due by time, or None when empty."""
        heads = [b.entries[0].deadline_s for b in self._buckets.values() if b.entries]
        return min(heads) if heads else None

    def next_batch(self, now: float) -> list[T] | None:
        """Close and return the batch that is due at ``now``, or None when no batch is due yet.

        Call it only when the engine can take a batch: a due batch keeps growing until then.
        """
        key = self._due_bucket(now)
        if key is None:
            return None
        return self._take(key, now)

    def drain(self) -> list[list[T]]:
        """Every queued item, cut into batches that respect the size and token caps (for shutdown)."""
        batches = []
        while self._count:
            key = min(self._buckets, key=lambda k: self._buckets[k].entries[0].seq)
            batches.append(self._take(key, now=float("inf")))
        return batches

    def remove(self, predicate: Callable[[T], bool]) -> list[T]:
        """Remove and return every queued item for which ``predicate`` holds (e.g. revoked partitions)."""
        removed: list[T] = []
        for key in list(self._buckets):
            bucket = self._buckets[key]
            kept = deque(e for e in bucket.entries if not predicate(e.item))
            removed.extend(e.item for e in bucket.entries if predicate(e.item))
            bucket.entries = kept
            if not kept:
                del self._buckets[key]
        self._count -= len(removed)
        return removed

    # ------------------------------------------------------------------------------------------ inner

    def _is_full(self, bucket: _Bucket[T]) -> bool:
        p = self.policy
        if len(bucket.entries) >= p.max_batch_size:
            return True
        return p.max_batch_tokens is not None and len(bucket.entries) * bucket.max_length >= p.max_batch_tokens

    def _due_bucket(self, now: float) -> int | None:
        expired_key, expired_seq = None, None
        full_key, full_seq = None, None
        for key, bucket in self._buckets.items():
            head = bucket.entries[0]
            if head.deadline_s <= now and (expired_seq is None or head.seq < expired_seq):
                expired_key, expired_seq = key, head.seq
            elif self._is_full(bucket) and (full_seq is None or head.seq < full_seq):
                full_key, full_seq = key, head.seq
        return expired_key if expired_key is not None else full_key

    def _take(self, key: int, now: float) -> list[T]:
        """Cut one batch starting from bucket ``key``; top it up from neighbouring buckets if it is due by
        time and still has room, so expired records elsewhere are not left behind."""
        p = self.policy
        batch: list[_Entry[T]] = []
        longest = 0
        order = [key]
        if p.bucket_by_length and self._buckets[key].entries[0].deadline_s <= now:
            # neighbours by closeness of length, so the padding added stays small
            order += sorted((k for k in self._buckets if k != key), key=lambda k: (abs(k - key), k))
        for k in order:
            bucket = self._buckets[k]
            while bucket.entries and len(batch) < p.max_batch_size:
                entry = bucket.entries[0]
                new_longest = max(longest, entry.length)
                if batch and p.max_batch_tokens is not None and (len(batch) + 1) * new_longest > p.max_batch_tokens:
                    break
                batch.append(bucket.entries.popleft())
                longest = new_longest
            if not bucket.entries:
                del self._buckets[k]
            if len(batch) >= p.max_batch_size:
                break
        self._count -= len(batch)
        for k in order:  # keep the padded-length bound tight after removals
            if k in self._buckets:
                self._buckets[k].max_length = max(e.length for e in self._buckets[k].entries)
        return [e.item for e in batch]
