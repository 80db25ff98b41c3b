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
* A batch is due when some bucket is full, when the oldest item has waited ``max_queue_delay_s``, or when
  the whole queue holds a full batch's worth of items or tokens spread over buckets (waiting could then
  only make the next batch later, not bigger, and leave the records behind it facing a busy engine).
  The batcher is only asked for a batch when the engine is idle, so while the engine is busy batches keep
  growing rather than leaving as small batches queued behind a timer.
* Nothing is lost or duplicated: every added item leaves through exactly one ``next_batch``, ``drain`` or
  ``remove`` call.
* Without length buckets, items leave in the order they were added (so order within a partition is kept).
  With ``bucket_by_length`` items of one bucket leave in order, but a short record may overtake a long one.
* After :meth:`seal`, the items queued until then leave first, due at once, and never in a batch with an
  item added later (a model switch: what the old engine prepared runs on the old engine, batch by batch).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from sluice.config import Batching

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

    @classmethod
    def of(cls, batching: Batching) -> BatchPolicy:
        """The policy a pipeline's ``batching`` section describes."""
        return cls(max_batch_size=batching.max_batch_size, max_queue_delay_s=batching.max_delay_s,
                   bucket_by_length=batching.bucket_by == "tokens", max_batch_tokens=batching.max_batch_tokens,
                   bucket_width=batching.bucket_width)


@dataclass(slots=True)
class _Entry(Generic[T]):
    item: T
    length: int
    deadline_s: float
    seq: int  # arrival order, to find the oldest head among buckets


@dataclass(slots=True)
class _Bucket(Generic[T]):
    entries: deque[_Entry[T]] = field(default_factory=deque)
    # Entries whose length is larger than every later entry's, oldest first: maxima[0] is the longest
    # entry in the bucket, kept exact in O(1) amortised per add / take (a monotonic queue).
    maxima: deque[_Entry[T]] = field(default_factory=deque)

    def append(self, entry: _Entry[T], track_max: bool) -> None:
        self.entries.append(entry)
        if track_max:
            maxima = self.maxima
            while maxima and maxima[-1].length <= entry.length:
                maxima.pop()
            maxima.append(entry)

    def popleft(self) -> _Entry[T]:
        entry = self.entries.popleft()
        if self.maxima and self.maxima[0] is entry:
            self.maxima.popleft()
        return entry

    @property
    def max_length(self) -> int:
        return self.maxima[0].length if self.maxima else 0


class Batcher(Generic[T]):
    """Gathers items into batches closed by size, padded-token budget or time."""

    def __init__(self, policy: BatchPolicy) -> None:
        self.policy = policy
        self._buckets: dict[int, _Bucket[T]] = {}
        self._seq = 0
        self._count = 0
        self._num_tokens = 0  # sum of the queued items' lengths
        self.last_padded_tokens = 0  # the last batch taken: its size x its longest length
        self._sealed: Batcher[T] | None = None  # items queued before seal()

    def __len__(self) -> int:
        return self._count + self.num_sealed

    @property
    def num_sealed(self) -> int:
        return self._sealed._count if self._sealed is not None else 0  # sealed items not taken yet

    def seal(self) -> None:
        """Items queued now leave before, and never with, any added later; due at once (nothing can join them).
        One generation at a time: sealing while sealed items are left is a bug (RuntimeError)."""
        if self.num_sealed:
            raise RuntimeError("the batcher is still sealed: the previous generation has items left")
        sealed: Batcher[T] = Batcher(self.policy)
        sealed._buckets, sealed._count, sealed._num_tokens, sealed._seq = (
            self._buckets, self._count, self._num_tokens, self._seq)
        self._buckets, self._count, self._num_tokens = {}, 0, 0
        self._sealed = sealed if sealed._count else None

    def add(self, item: T, now: float, length: int = 1) -> None:
        """Queue one item that arrived at ``now``; ``length`` is its size in tokens (>= 1)."""
        self.add_many(((item, length),), now)

    def add_many(self, items: Iterable[tuple[T, int]], now: float) -> None:
        """Queue (item, length) pairs that all arrived at ``now``, in order (one call per poll: cheaper)."""
        p = self.policy
        deadline = now + p.max_queue_delay_s
        width = p.bucket_width if p.bucket_by_length else 0
        track_max = p.max_batch_tokens is not None  # only a token budget needs each bucket's longest
        buckets = self._buckets
        seq = self._seq
        num_tokens = 0
        for item, length in items:
            length = length if length > 1 else 1
            num_tokens += length
            key = -(-length // width) if width else 0
            bucket = buckets.get(key)
            if bucket is None:
                bucket = buckets[key] = _Bucket()
            bucket.append(_Entry(item, length, deadline, seq), track_max)
            seq += 1
        self._count += seq - self._seq
        self._num_tokens += num_tokens
        self._seq = seq

    def next_deadline(self) -> float | None:
        """The earliest time at which a batch becomes due by time, or None when empty (sealed items are due
        now, whatever their deadline; theirs are the earliest anyway: they came first)."""
        heads = [b.entries[0].deadline_s for b in self._buckets.values() if b.entries]
        if self._sealed is not None and (sealed := self._sealed.next_deadline()) is not None:
            heads.append(sealed)
        return min(heads) if heads else None

    def next_batch(self, now: float, max_size: int | None = None, horizon_s: float = 0.0,
                   max_tokens: int | None = None) -> list[T] | None:
        """Close and return the batch that is due at ``now``, or None when no batch is due yet.

        Call it only when the engine can take a batch: a due batch keeps growing until then. ``max_size``
        lowers ``max_batch_size`` for this call (after the engine ran out of memory, say). ``horizon_s`` is
        how long the engine is expected to take: a record whose deadline falls within it joins a batch due by
        time like an expired one, because waiting for its own turn would find the engine busy and make it late.
        ``max_tokens`` lowers ``max_batch_tokens`` for this call (the adaptive policy's choice).
        """
        if (sealed := self._sealed) is not None and sealed._count:  # what was sealed goes first, at once
            batch = sealed.next_batch(float("inf"), max_size, 0.0, max_tokens)
            self.last_padded_tokens = sealed.last_padded_tokens
            return batch
        size = self.policy.max_batch_size if max_size is None else max(1, min(max_size, self.policy.max_batch_size))
        due = self._due_bucket(now, size)
        if due is None:
            return None
        cap = self.policy.max_batch_tokens
        if max_tokens is not None:
            cap = max(1, max_tokens if cap is None else min(cap, max_tokens))
        return self._take(due[0], now, size, now + max(0.0, horizon_s), top_up=due[1], max_tokens=cap)

    def drain(self) -> list[list[T]]:
        """Every queued item, cut into batches that respect the size and token caps (for shutdown); sealed
        items first, in batches of their own."""
        batches = self._sealed.drain() if self._sealed is not None else []
        while self._count:
            key = min(self._buckets, key=lambda k: self._buckets[k].entries[0].seq)
            batches.append(self._take(key, float("inf"), self.policy.max_batch_size, float("inf"), top_up=True,
                                      max_tokens=self.policy.max_batch_tokens))
        return batches

    def remove(self, predicate: Callable[[T], bool]) -> list[T]:
        """Remove and return every queued item for which ``predicate`` holds (e.g. revoked partitions)."""
        removed: list[T] = self._sealed.remove(predicate) if self._sealed is not None else []
        num_sealed_removed = len(removed)
        for key in list(self._buckets):
            old = self._buckets.pop(key)
            kept: _Bucket[T] = _Bucket()
            for e in old.entries:
                if predicate(e.item):
                    removed.append(e.item)
                else:
                    kept.append(e, self.policy.max_batch_tokens is not None)
            if kept.entries:
                self._buckets[key] = kept
        self._count -= len(removed) - num_sealed_removed
        self._num_tokens = sum(e.length for b in self._buckets.values() for e in b.entries)
        return removed

    # ------------------------------------------------------------------------------------------ inner

    def _is_full(self, bucket: _Bucket[T], size: int) -> bool:
        p = self.policy
        if len(bucket.entries) >= size:
            return True
        return p.max_batch_tokens is not None and len(bucket.entries) * bucket.max_length >= p.max_batch_tokens

    def _due_bucket(self, now: float, size: int) -> tuple[int, bool] | None:
        """(bucket key, whether to top up from neighbours), or None when no batch is due."""
        expired_key, expired_seq = None, None
        full_key, full_seq = None, None
        oldest_key, oldest_seq = None, None
        for key, bucket in self._buckets.items():
            head = bucket.entries[0]
            if head.deadline_s <= now and (expired_seq is None or head.seq < expired_seq):
                expired_key, expired_seq = key, head.seq
            elif self._is_full(bucket, size) and (full_seq is None or head.seq < full_seq):
                full_key, full_seq = key, head.seq
            if oldest_seq is None or head.seq < oldest_seq:
                oldest_key, oldest_seq = key, head.seq
        if expired_key is not None:
            return expired_key, True
        if full_key is not None:
            return full_key, False
        p = self.policy
        if oldest_key is not None and (self._count >= size or (
                p.max_batch_tokens is not None and self._num_tokens >= p.max_batch_tokens)):
            # A backlog of a full batch or more, spread over buckets: waiting cannot make the next batch
            # bigger, only later, and the records behind it would find the engine busy at their deadlines.
            return oldest_key, True
        return None

    def _take(self, key: int, now: float, size: int, late_s: float, top_up: bool,
              max_tokens: int | None) -> list[T]:
        """Cut one batch starting from bucket ``key``; top it up from neighbouring buckets if it is due by
        time and still has room, so expired records elsewhere are not left behind.

        From a neighbouring bucket a record due by ``late_s`` always comes along (leaving it would only make
        it wait for the engine), but one that may still wait joins only if it adds at most ``bucket_width``
        padded tokens: padding a batch of short records up to a long one can cost more engine time than a
        second call, and at moderate load that extra time is what makes later records wait past their deadline.
        """
        p = self.policy
        batch: list[_Entry[T]] = []
        longest = 0
        order = [key]
        if p.bucket_by_length and top_up:
            # neighbours by closeness of length, so the padding added stays small
            order += sorted((k for k in self._buckets if k != key), key=lambda k: (abs(k - key), k))
        for k in order:
            bucket = self._buckets[k]
            while bucket.entries and len(batch) < size:
                entry = bucket.entries[0]
                new_longest = max(longest, entry.length)
                if batch and max_tokens is not None and (len(batch) + 1) * new_longest > max_tokens:
                    break
                if k != key and entry.deadline_s > late_s:
                    added_padding = (new_longest - entry.length) + len(batch) * (new_longest - longest)
                    if added_padding > p.bucket_width:
                        break
                batch.append(bucket.popleft())
                longest = new_longest
            if not bucket.entries:
                del self._buckets[k]
            if len(batch) >= size:
                break
        self._count -= len(batch)
        self._num_tokens -= sum(e.length for e in batch)
        self.last_padded_tokens = len(batch) * longest
        return [e.item for e in batch]
