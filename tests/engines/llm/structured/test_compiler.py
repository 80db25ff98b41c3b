"""GrammarCompiler: compiles off the calling thread, once per constraint, and counts what it did."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from sluice.engines.llm.structured.backend import BitmaskRow, GrammarError, GrammarMatcher
from sluice.engines.llm.structured.compiler import GrammarCompiler
from sluice.engines.llm.structured.spec import StructuredOutput


class GatedBackend:
    """A backend whose compiles wait for ``gate``; a regex "bad" fails. Records the compiling thread."""

    name = "gated"
    bitmask_words = 1

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate
        self.compiled: list[str] = []
        self.threads: set[str] = set()

    @staticmethod
    def check(spec: StructuredOutput) -> list[str]:
        return []

    def compile(self, spec: StructuredOutput) -> Any:
        self.threads.add(threading.current_thread().name)
        self.gate.wait(10)
        self.compiled.append(spec.key)
        if spec.regex == "bad":
            raise GrammarError("bad regex")
        return spec.key

    def matcher(self, compiled: Any) -> GrammarMatcher:
        raise NotImplementedError

    def fill_bitmask(self, rows: Sequence[BitmaskRow], bitmask: Any) -> None:
        raise NotImplementedError


def test_submit_never_waits_and_equal_constraints_compile_once() -> None:
    gate = threading.Event()
    backend = GatedBackend(gate)
    compiler = GrammarCompiler(lambda: backend)
    first = compiler.submit(StructuredOutput(regex="a+"))
    again = compiler.submit(StructuredOutput(regex="a+"))
    other = compiler.submit(StructuredOutput(choice=["x", "y"]))
    assert again is first and not first.done()  # the compile is still held at the gate
    gate.set()
    assert first.result(10).grammar == "regex:a+" and other.result(10).backend is backend
    assert backend.compiled == ["regex:a+", 'choice:["x", "y"]']
    assert backend.threads and threading.current_thread().name not in backend.threads
    stats = compiler.stats
    assert (stats.num_compiled, stats.num_cache_hits, stats.num_errors) == (2, 1, 0)
    assert stats.compile_s > 0
    compiler.close()


def test_a_failed_compile_is_cached_too() -> None:
    gate = threading.Event()
    gate.set()
    backend = GatedBackend(gate)
    compiler = GrammarCompiler(lambda: backend)
    futures = [compiler.submit(StructuredOutput(regex="bad")) for _ in range(5)]
    for future in futures:
        with pytest.raises(GrammarError, match="bad regex"):
            future.result(10)
    assert backend.compiled == ["regex:bad"]
    assert (compiler.stats.num_errors, compiler.stats.num_cache_hits) == (1, 4)
    compiler.close()


def test_the_cache_forgets_the_least_recently_used() -> None:
    gate = threading.Event()
    gate.set()
    backend = GatedBackend(gate)
    compiler = GrammarCompiler(lambda: backend, max_cached=2)
    for regex in ("a", "b", "a", "c", "a", "b"):  # "b" was evicted by "c", "a" stayed in use
        compiler.submit(StructuredOutput(regex=regex)).result(10)
    assert backend.compiled == ["regex:a", "regex:b", "regex:c", "regex:b"]
    compiler.close()
