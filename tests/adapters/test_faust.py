"""sluice.adapters.faust.Enricher against a stand-in for a Faust stream that behaves like Faust's
``take_events``: windows of events, acknowledged only when the consumer asks for the next window."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from sluice.adapters.faust import Enriched, Enricher, FaustAdapterError
from sluice.engines.engine_contract import BatchEngine


@dataclass
class Event:
    key: bytes
    value: Any


class FakeStream:
    """take_events(max_, within): windows of up to ``max_`` events; a window's events are acked once the
    consumer comes back for the next one (what faust.Stream.take_events does)."""

    def __init__(self, values: list[Any]) -> None:
        self.events = [Event(f"k{i}".encode(), v) for i, v in enumerate(values)]
        self.acked: list[Event] = []
        self.window_sizes: list[int] = []

    async def take_events(self, max_: int, within: float) -> AsyncIterator[Sequence[Event]]:
        for start in range(0, len(self.events), max_):
            window = self.events[start:start + max_]
            self.window_sizes.append(len(window))
            yield window
            self.acked.extend(window)


class LengthEngine(BatchEngine):
    """'Tokenises' by splitting words; fails on the word 'poison'; records where it ran."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.threads: set[int] = set()

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        return [str(v).split() for v in values]

    def item_length(self, item: Any) -> int:
        return len(item)

    def infer(self, items: Sequence[Any]) -> list[Any]:
        self.threads.add(threading.get_ident())
        if any("poison" in words for words in items):
            raise ValueError("cannot digest poison")
        self.batches.append([len(words) for words in items])
        return [" ".join(words).upper() for words in items]


async def _collect(enricher: Enricher, stream: FakeStream, on_batch: Any = None) -> list[list[Enriched]]:
    out = []
    async for batch in enricher.batches(stream):
        out.append(batch)
        if on_batch:
            on_batch(batch)
    return out


def test_every_event_comes_back_once_with_its_result_in_length_aware_batches() -> None:
    texts = [" ".join(["w"] * (1 + (i * 7) % 40)) for i in range(200)]  # lengths 1..40, mixed
    engine = LengthEngine()
    enricher = Enricher(engine, {"max_batch_size": 16, "bucket_by": "tokens", "bucket_width": 8,
                                 "max_batch_tokens": 256}, window_batches=4)
    enricher.start()
    batches = asyncio.run(_collect(enricher, FakeStream(texts)))
    enricher.close()

    items = [item for batch in batches for item in batch]
    assert sorted(item.event.key for item in items) == sorted(f"k{i}".encode() for i in range(200))
    assert all(item.error is None and item.result == item.value.upper() for item in items)
    for lengths in engine.batches:
        assert len(lengths) <= 16 and len(lengths) * max(lengths) <= 256  # size and padded-token caps
    # Similar lengths batched together: far less padding than batches cut in arrival order.
    padded = sum(len(lengths) * max(lengths) for lengths in engine.batches)
    fifo_lengths = [1 + (i * 7) % 40 for i in range(200)]
    fifo = sum(len(chunk) * max(chunk) for chunk in (fifo_lengths[i:i + 16] for i in range(0, 200, 16)))
    assert padded < 0.75 * fifo, (padded, fifo)
    assert threading.get_ident() not in engine.threads  # the model ran off the event loop's thread


def test_a_window_is_acknowledged_only_after_all_its_results_were_handled() -> None:
    stream = FakeStream([f"text {i}" for i in range(40)])
    enricher = Enricher(LengthEngine(), {"max_batch_size": 5}, window_batches=2)  # windows of 10 events
    enricher.start()
    handled: list[Event] = []

    def on_batch(batch: list[Enriched]) -> None:
        # Everything acked so far was handled before, never an event of a batch being handled now.
        assert all(e in handled for e in stream.acked)
        assert not {id(i.event) for i in batch} & {id(e) for e in stream.acked}
        handled.extend(i.event for i in batch)

    asyncio.run(_collect(enricher, stream, on_batch))
    enricher.close()
    assert stream.window_sizes == [10, 10, 10, 10]
    assert len(stream.acked) == 40


def test_records_the_engine_rejects_carry_the_reason_and_the_rest_get_results() -> None:
    values = [{"text": "fine one"}, {"text": "poison pill"}, {"no_text": 1}, {"text": "fine two"}]
    enricher = Enricher(LengthEngine(), {"max_batch_size": 8}, to_input=lambda v: v["text"])
    enricher.start()
    items = {i.event.key: i for batch in asyncio.run(_collect(enricher, FakeStream(values))) for i in batch}
    enricher.close()

    assert items[b"k0"].result == "FINE ONE" and items[b"k3"].result == "FINE TWO"
    assert items[b"k1"].result is None and "infer: ValueError: cannot digest poison" == items[b"k1"].error
    assert items[b"k2"].result is None and items[b"k2"].error is not None and "KeyError" in items[b"k2"].error


def test_engine_and_batching_sections_are_validated_like_a_pipeline() -> None:
    enricher = Enricher({"type": "python", "function": "tests.integration.funcs:tag"}, {"max_batch_size": 4})
    enricher.start()
    (batch,) = asyncio.run(_collect(enricher, FakeStream(["a", "b"])))
    enricher.close()
    assert [i.result for i in batch] == ["<A>", "<B>"]

    with pytest.raises(FaustAdapterError, match="batching: max_batch_sise"):
        Enricher({"type": "python", "function": "m:f"}, {"max_batch_sise": 4})
    with pytest.raises(FaustAdapterError, match="engine: function"):
        Enricher({"type": "python", "function": "no-colon"})
    with pytest.raises(FaustAdapterError, match="start"):
        asyncio.run(_collect(Enricher(LengthEngine()), FakeStream(["a"])))
