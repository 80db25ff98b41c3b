"""Grammar compilation off the engine thread, one compiled grammar per distinct constraint.

The engine thread calls :meth:`GrammarCompiler.submit` and keeps stepping the running batch; the request
that needs the grammar waits (outside the scheduler) until its future is done. The backend itself is built
lazily on the compile thread by the first submit -- building llguidance's token trie for a 50k vocabulary
takes a few hundred milliseconds the engine should not wait for either.

Guarantees: equal constraints (``StructuredOutput.key``) compile once while cached (LRU over
``max_cached`` grammars; a failed compile is cached too, so a bad schema repeated by many records costs
one attempt); ``submit`` never blocks; compile time, cache hits and failures are counted in
:class:`CompilerStats`. Threads: ``submit``/``stats``/``close`` from the engine thread, work on one
background thread.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sluice.engines.llm.structured.backend import GrammarBackend, GrammarError
from sluice.engines.llm.structured.spec import StructuredOutput


@dataclass(frozen=True, slots=True)
class CompilerStats:
    num_compiled: int  # grammars compiled (successfully or not)
    num_cache_hits: int  # submits served by an already compiled (or compiling) grammar
    num_errors: int  # compiles that failed (invalid constraint)
    compile_s: float  # total seconds spent compiling
    backend_s: float  # seconds spent building the backend (token trie), once


@dataclass(frozen=True, slots=True)
class Compiled:
    """A compiled grammar and the backend that made it (which hands out its matchers)."""

    backend: GrammarBackend
    grammar: Any


class GrammarCompiler:
    """Compiles constraints on a background thread and caches the results (see the module docstring)."""

    def __init__(self, make_backend: Callable[[], GrammarBackend], max_cached: int = 256,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if max_cached < 1:
            raise ValueError(f"max_cached must be >= 1, got {max_cached}")
        self._make_backend = make_backend
        self._backend: GrammarBackend | None = None
        self._max_cached = max_cached
        self._clock = clock
        self._cache: OrderedDict[str, Future[Compiled]] = OrderedDict()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sluice-grammar")
        self._lock = threading.Lock()  # the counters below are written by the compile thread
        self._num_compiled = self._num_hits = self._num_errors = 0
        self._compile_s = self._backend_s = 0.0

    def submit(self, spec: StructuredOutput) -> Future[Compiled]:
        """The compiled grammar of ``spec``, now or later. Its exception, if any, is a GrammarError."""
        future = self._cache.get(spec.key)
        if future is not None:
            self._cache.move_to_end(spec.key)
            with self._lock:
                self._num_hits += 1
            return future
        future = self._executor.submit(self._compile, spec)
        self._cache[spec.key] = future
        while len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)  # requests holding the future keep their grammar
        return future

    @property
    def stats(self) -> CompilerStats:
        with self._lock:
            return CompilerStats(self._num_compiled, self._num_hits, self._num_errors, self._compile_s,
                                 self._backend_s)

    def close(self) -> None:
        """Stop the compile thread (pending compiles are cancelled)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _compile(self, spec: StructuredOutput) -> Compiled:
        if self._backend is None:
            start_s = self._clock()
            self._backend = self._make_backend()
            with self._lock:
                self._backend_s = self._clock() - start_s
        start_s = self._clock()
        try:
            return Compiled(self._backend, self._backend.compile(spec))
        except GrammarError:
            with self._lock:
                self._num_errors += 1
            raise
        finally:
            with self._lock:
                self._num_compiled += 1
                self._compile_s += self._clock() - start_s
