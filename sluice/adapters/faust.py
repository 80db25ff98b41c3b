"""Sluice's batcher and engines inside a Faust agent.

An existing Faust app keeps its topics, agents and sinks, and hands the model work to Sluice::

    enricher = Enricher(engine={"type": "onnx", "model": "minilm-l6"},
                        batching={"max_batch_size": 32, "max_queue_delay_ms": 20, "bucket_by": "tokens"},
                        to_input=lambda review: review["text"])
    enricher.start()                                   # load and warm up the model (blocking), once

    @app.agent(reviews)
    async def embed(stream):
        async for batch in enricher.batches(stream):
            for item in batch:
                await embeddings.send(key=item.event.key, value={**item.value, "embedding": item.result})

``engine`` and ``batching`` are the pipeline YAML's ``engine:`` and ``batching:`` sections, validated the
same way (unknown keys are errors). Only batch engines fit here (not the continuous ``llm`` engine).

How it works and what it guarantees:

* Records are taken from the stream in windows of ``window_batches x max_batch_size`` events
  (``stream.take_events``; a window also closes after ``max_queue_delay_ms``). Sluice's batcher cuts each
  window into batches of similar length under ``max_batch_size`` and ``max_batch_tokens``.
* ``prepare`` (tokenising) and ``infer`` run in a worker thread, so the event loop keeps serving Faust
  (heartbeats, fetches, other agents) while the model runs.
* At-least-once, as Faust means it: the events of a window are acknowledged only when the agent asks for
  the batch after that window's last one -- after its loop body has handled (sent) every result of the
  window. A crash before that re-delivers the whole window.
* Every event of a window comes back exactly once, in some batch, with a ``result`` or an ``error``: a
  record the engine rejects (``prepare``, or ``infer`` once the failing batch is bisected down to it)
  carries the reason and no result. The agent decides where it goes (a dead-letter topic, say).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from sluice.config import Batching, EngineSection
from sluice.engines import engine_types
from sluice.engines.engine_contract import BatchEngine, EngineContext, first_line
from sluice.operator.batcher import Batcher, BatchPolicy
from sluice.operator.failures.bisection import Failed, infer_isolating


class EventLike(Protocol):
    """What the adapter needs of a Faust event: its value (``event.key``, ``event.message``... pass through)."""

    value: Any


class StreamLike(Protocol):
    """What the adapter needs of a Faust stream."""

    def take_events(self, max_: int, within: float) -> AsyncIterator[Sequence[Any]]: ...


@dataclass(frozen=True, slots=True)
class Enriched:
    """One event and what the engine made of it: ``result``, or ``error`` (one line) and no result."""

    event: Any  # the Faust event: .key, .value, .headers, .message (topic, partition, offset)
    value: Any  # event.value
    result: Any = None
    error: str | None = None


class FaustAdapterError(Exception):
    """The enricher cannot be built as configured (one line for the user)."""


class Enricher:
    """A Sluice batch engine plus batching policy, serving Faust streams. Not thread-safe; one per app."""

    def __init__(self, engine: dict[str, Any] | BatchEngine, batching: dict[str, Any] | None = None, *,
                 to_input: Callable[[Any], Any] = lambda value: value, window_batches: int = 4) -> None:
        """``engine``: an ``engine:`` section (``{"type": ..., **options}``) or a ready BatchEngine.
        ``to_input``: the model input of an event value (a field of it, say). ``window_batches``: how many
        batches' worth of events to gather before cutting batches (more: better length grouping, more
        records re-delivered after a crash)."""
        try:
            b = Batching.model_validate(batching or {})
        except ValidationError as err:
            raise FaustAdapterError(f"batching: {_first_error(err)}") from None
        if b.latency_target_ms is not None:
            raise FaustAdapterError("batching.latency_target_ms (adaptive batching) is not available in Faust agents")
        if window_batches < 1:
            raise FaustAdapterError("window_batches must be at least 1")
        self.policy = BatchPolicy.of(b)
        self.engine = engine if isinstance(engine, BatchEngine) else _build_engine(engine, b)
        self._input = to_input
        self._window = window_batches * b.max_batch_size
        # One thread: the engine sees one batch at a time, as under `sluice run`.
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sluice-engine")
        self._started = False

    def start(self) -> None:
        """Load and warm up the engine (blocking; call it before the Faust worker starts)."""
        if not self._started:
            self.engine.start()
            self._started = True

    def close(self) -> None:
        """Release the engine and its thread. Safe to call twice."""
        self._executor.shutdown(wait=True)
        if self._started:
            self.engine.close()
            self._started = False

    async def batches(self, stream: StreamLike) -> AsyncIterator[list[Enriched]]:
        """Batches of enriched events from a Faust stream, for as long as the stream runs (see the module
        docstring for acknowledgements)."""
        if not self._started:
            raise FaustAdapterError("Enricher.start() must be called before batches()")
        loop = asyncio.get_running_loop()
        async for events in stream.take_events(self._window, within=self.policy.max_queue_delay_s):
            for batch in await loop.run_in_executor(self._executor, self._cut, list(events)):
                yield await loop.run_in_executor(self._executor, self._infer, batch)

    # --------------------------------------------------------------------------------- worker thread

    def _cut(self, events: list[Any]) -> list[list[tuple[Any, Any, str | None]]]:
        """Prepare a window's inputs and cut it into batches of (event, item, error)."""
        engine = self.engine
        pairs: list[tuple[Any, Any, str | None]] = []
        inputs: list[Any] = []
        for event in events:
            try:
                inputs.append(self._input(event.value))
                pairs.append((event, None, None))
            except Exception as err:  # a value without the field, say
                pairs.append((event, None, f"input: {type(err).__name__}: {first_line(err)}"))
        try:
            items = iter(engine.prepare(inputs))
            pairs = [(e, next(items), None) if err is None else (e, None, err) for e, _, err in pairs]
        except Exception:  # one bad input: prepare the others one by one
            values = iter(inputs)
            pairs = [self._prepare_one(e, next(values)) if err is None else (e, None, err) for e, _, err in pairs]
        batcher: Batcher[tuple[Any, Any, str | None]] = Batcher(self.policy)
        now = time.monotonic()
        failed = [p for p in pairs if p[2] is not None]
        batcher.add_many(((p, engine.item_length(p[1])) for p in pairs if p[2] is None), now)
        batches = []
        while (batch := batcher.next_batch(now)) is not None:  # full length buckets first...
            batches.append(batch)
        batches += batcher.drain()  # ...then the rest, neighbouring lengths together (the window is closed)
        if failed:
            batches.append(failed)
        return batches

    def _prepare_one(self, event: Any, value: Any) -> tuple[Any, Any, str | None]:
        try:
            return event, self.engine.prepare([value])[0], None
        except Exception as err:
            return event, None, f"prepare: {type(err).__name__}: {first_line(err)}"

    def _infer(self, batch: list[tuple[Any, Any, str | None]]) -> list[Enriched]:
        ok = [(e, item) for e, item, err in batch if err is None]
        out = [Enriched(e, e.value, error=err) for e, _, err in batch if err is not None]
        if not ok:
            return out
        # a failing batch is bisected until the records the engine fails on are isolated (as under `sluice run`)
        outcomes = infer_isolating(self.engine.infer, [item for _, item in ok])
        for (e, _), outcome in zip(ok, outcomes, strict=True):
            if isinstance(outcome, Failed):
                err = outcome.error
                out.append(Enriched(e, e.value, error=f"infer: {type(err).__name__}: {first_line(err)}"))
            else:
                out.append(Enriched(e, e.value, result=outcome))
        return out


def _build_engine(section: dict[str, Any], batching: Batching) -> BatchEngine:
    try:
        parsed = EngineSection.model_validate(section)
        engine_type = engine_types.lookup(parsed.type)
        options = engine_type.options.model_validate(parsed.raw_options())
    except ValidationError as err:
        raise FaustAdapterError(f"engine: {_first_error(err)}") from None
    except ImportError as err:
        raise FaustAdapterError(f"engine '{section.get('type')}' is not installed here ({err})") from None
    if engine_type.continuous:
        raise FaustAdapterError(f"engine '{parsed.type}' is a continuous engine; only batch engines run in Faust")
    context = EngineContext(max_batch_size=batching.max_batch_size, max_batch_tokens=batching.max_batch_tokens)
    engine: BatchEngine = engine_type.factory(options, context)
    return engine


def _first_error(err: ValidationError) -> str:
    e = err.errors()[0]
    where = ".".join(str(p) for p in e["loc"]) or "<top>"
    return f"{where}: {e['msg']}"
