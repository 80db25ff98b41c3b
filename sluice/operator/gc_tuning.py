"""The cyclic garbage collector, made cheap for a stream of short-lived records."""

from __future__ import annotations

import gc


def relax_gc() -> tuple[int, int, int]:
    """Collect less often, and never walk what exists at start again. Returns the old thresholds.

    Every record allocates a few small container objects; with CPython's default thresholds the collector
    runs every 700 allocations and, with thousands of records in flight, its full passes cost a large share
    of the operator's CPU (bench/operator_overhead.py). Records hold no reference cycles, so
    reference counting frees them anyway: collect less often, and freeze what exists at start (modules,
    the model) so that full passes never walk it again.
    """
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    return old


def restore_gc(thresholds: tuple[int, int, int]) -> None:
    gc.set_threshold(*thresholds)
    gc.unfreeze()
