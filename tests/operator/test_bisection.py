"""Failing batches: poison records are isolated by bisection; out-of-memory shrinks the batch size."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.operator.failures.bisection import Failed, infer_isolating
from sluice.operator.failures.oom_governor import BatchSizeGovernor, is_out_of_memory


class PoisonEngine:
    def __init__(self) -> None:
        self.calls = 0

    def infer(self, items: Sequence[int]) -> list[int]:
        self.calls += 1
        if any(i < 0 for i in items):
            raise ValueError("negative input")
        return [i * 10 for i in items]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-3, max_value=100), min_size=1, max_size=64))
def test_bisection_fails_exactly_the_poison_items(items: list[int]) -> None:
    engine = PoisonEngine()
    out = infer_isolating(engine.infer, items)
    assert len(out) == len(items)
    for item, result in zip(items, out, strict=True):
        if item < 0:
            assert isinstance(result, Failed) and "negative" in str(result.error)
        else:
            assert result == item * 10
    num_bad = sum(1 for i in items if i < 0)
    assert engine.calls <= 1 + 2 * num_bad * max(1, len(items).bit_length())


class SmallGpu:
    """Runs out of memory above ``capacity`` items; the error looks like PyTorch's."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    def infer(self, items: Sequence[int]) -> list[int]:
        if len(items) > self.capacity:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return list(items)


def test_out_of_memory_splits_the_batch_and_lowers_the_limit_then_recovers() -> None:
    gpu = SmallGpu(capacity=10)
    governor = BatchSizeGovernor(max_batch_size=64, recover_after=3)
    assert infer_isolating(gpu.infer, list(range(64)), governor) == list(range(64))  # nothing dead-lettered
    assert governor.limit == 8  # 64 -> 32 -> 16 -> 8 fits
    for _ in range(3):
        infer_isolating(gpu.infer, list(range(8)), governor)
    assert governor.limit == 16  # recovered one step after a run of successes
    infer_isolating(gpu.infer, list(range(16)), governor)
    assert governor.limit == 8  # and backs off again when that is still too much


def test_a_single_record_that_runs_out_of_memory_alone_fails() -> None:
    gpu = SmallGpu(capacity=0)
    governor = BatchSizeGovernor(max_batch_size=4)
    out = infer_isolating(gpu.infer, [1, 2], governor)
    assert all(isinstance(o, Failed) for o in out)
    assert governor.limit == 1


def test_out_of_memory_detection() -> None:
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate"))
    assert is_out_of_memory(RuntimeError("[ONNXRuntimeError] : 6 : Failed to allocate memory for requested buffer"))
    type_named = type("OutOfMemoryError", (RuntimeError,), {})
    assert is_out_of_memory(type_named("boom"))
    assert not is_out_of_memory(ValueError("bad input"))
