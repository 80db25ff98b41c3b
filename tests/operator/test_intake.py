"""The intake prepares a poll a batch's worth at a time, and takes a failing record's error in its place; an
engine that waits on a store while preparing gets polls of the size it asks for.

Images are fetched and decoded in ``prepare``: were a whole poll prepared before any of it was queued, the
engine would idle for the poll's fetches and decodes. An engine that can tell which record failed
(``prepare_each``) is not asked again record by record (fetches are not repeated).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any

from sluice.engines.engine_contract import BatchEngine, RecordError
from sluice.operator.intake import MIN_CHUNK
from tests.operator.memory import run


class Counting(BatchEngine):
    """Tags texts; counts what it was asked to prepare, and how much was prepared before the first batch ran.
    A text ``bad:STAGE`` fails alone with that stage, in its place."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.prepared_before_first_batch: int | None = None
        self.lock = threading.Lock()

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        raise AssertionError("the intake asks prepare_each")

    def prepare_each(self, values: Sequence[Any]) -> list[Any]:
        time.sleep(0.03)  # fetching and decoding images take a while (the GIL is free meanwhile)
        with self.lock:
            self.calls.append(len(values))
        return [RecordError("refused", stage=v[4:]) if v.startswith("bad:") else v for v in values]

    def infer(self, items: Sequence[Any]) -> list[Any]:
        with self.lock:
            if self.prepared_before_first_batch is None:
                self.prepared_before_first_batch = sum(self.calls)
        return [f"<{item}>" for item in items]


def test_a_poll_is_prepared_and_queued_a_batch_at_a_time() -> None:
    texts = ["bad:fetch" if i == 7 else "bad:decode-image" if i == 300 else f"text {i}" for i in range(600)]
    records = [(json.dumps({"text": t}).encode(), f"k{i}".encode(), []) for i, t in enumerate(texts)]
    engine = Counting()
    summary, _, sink = run(records, engine)  # one poll holds them all
    assert max(engine.calls) <= MIN_CHUNK  # max_batch_size 16: chunks of MIN_CHUNK
    assert sum(engine.calls) == len(texts)  # nobody was prepared twice: the errors came in place
    assert engine.prepared_before_first_batch is not None and engine.prepared_before_first_batch < len(texts)
    stages = sorted(m.header("sluice.error.stage") for m in sink.produced if m.topic == "dlq")
    assert stages == ["decode-image", "fetch"]
    assert sum(m.topic == "out" for m in sink.produced) == len(texts) - 2
    assert summary.num_in == len(texts)


class SlowStore(Counting):
    def records_per_poll(self) -> int | None:
        return 8  # its prepare fetches from a store: the poll loop must come back often


def test_an_engine_that_waits_on_a_store_gets_small_polls() -> None:
    records = [(json.dumps({"text": f"text {i}"}).encode(), f"k{i}".encode(), []) for i in range(100)]
    engine = SlowStore()
    summary, source, sink = run(records, engine)
    assert max(engine.calls) <= 8 and sum(engine.calls) == 100
    assert sum(m.topic == "out" for m in sink.produced) == 100
