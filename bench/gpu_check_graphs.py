"""GPU check rows for decode graphs (``kernels.decode_graphs``): the same engine's decode steps with the
graphs on and off, side by side, and their greedy tokens compared.

One engine is built with graphs for the batch sizes timed (``decode_graph_sizes``); the eager steps are the
same engine's with its graphs set aside (``runner.graphs = None``), so weights, KV pool and kernels are
shared and only the launch path differs. Rows:

* ``decode graphs``: the start-up line (buckets, compile seconds per bucket, memory the CUDA graphs hold),
  and whether the parity prompts' greedy tokens are equal with graphs and without (``tokens_equal``; where
  not, ``exact`` prompts and where the others first diverge, as the parity rows say it);
* ``decode graphs bs=N``: ``step_ms`` with graphs, ``eager_step_ms`` without, ``speedup``; ``kernel_ms``,
  ``busy``, ``floor_ms`` and ``x_floor`` as the eager ``decode bs=N`` rows have them (graphed steps).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gpu_check_llm_reference import parity_summary

GRAPHED = {"native_cpu": False, "cpu_attention": "paged", "decode_graphs": "on"}  # CPU (dry run): the kernels' ops


def planned(batches: tuple[int, ...]) -> dict[str, str]:
    return {"decode graphs": "decode", **{f"decode graphs bs={b}": "decode" for b in batches}}


class _StartLine(logging.Handler):
    """Keeps the start log's ``decode graphs ready`` line."""

    def __init__(self) -> None:
        super().__init__()
        self.line: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if "decode graphs ready" in record.getMessage():
            self.line = record.getMessage()


def graph_rows(rows: Any, make_llm: Callable[..., Any], batches: tuple[int, ...], prompts: list[list[int]],
               greedy: Callable[[Any], list[list[int]]], decode_row: Callable[[Any, int], dict[str, Any]],
               floor_ms: Callable[[int, float], float]) -> None:  # fmt: skip
    """Build the graphed engine (``make_llm(max_num_seqs=..., kernels=...)``) and measure its rows.

    ``greedy(llm)``: the parity prompts' tokens; ``decode_row(llm, batch)``: a ``decode bs=N`` row's
    measurement; ``floor_ms(batch, kv_len)``: the memory floor of such a step."""
    start_log = logging.getLogger("sluice.start")
    catch = _StartLine()
    start_log.addHandler(catch)
    level = start_log.level
    start_log.setLevel(logging.INFO)
    try:
        llm = make_llm(max_num_seqs=max(batches), kernels={**GRAPHED, "decode_graph_sizes": list(batches)})
    finally:
        start_log.removeHandler(catch)
        start_log.setLevel(level)
    graphs = llm.runner.graphs
    graphed = greedy(llm)
    llm.runner.graphs = None
    eager = greedy(llm)
    llm.runner.graphs = graphs
    rows.measured("decode graphs", "decode", start=catch.line, tokens_equal=graphed == eager,
                  graph_steps=graphs.num_steps, **parity_summary(graphed, eager))  # fmt: skip
    for b in batches:
        with rows.attempt(f"decode graphs bs={b}"):
            before = graphs.num_steps
            on = decode_row(llm, b)
            if graphs.num_steps - before < 2:
                raise RuntimeError(f"the decode steps of {b} requests did not run through a graph")
            llm.runner.graphs = None
            try:
                off = decode_row(llm, b)
            finally:
                llm.runner.graphs = graphs
            note = on.pop("kernel_note")
            floor = floor_ms(b, on["kv_len"])
            kernel = on["kernel_ms"]
            rows.measured(f"decode graphs bs={b}", "decode", **on, eager_step_ms=off["step_ms"],
                          eager_kernel_ms=off["kernel_ms"], speedup=round(off["step_ms"] / on["step_ms"], 2),
                          floor_ms=round(floor, 4), x_floor=round(on["step_ms"] / floor, 1),
                          busy=None if kernel is None else round(kernel / on["step_ms"], 3),
                          kernel_note=note)  # fmt: skip
