"""Reloads through the real runner in memory (tests/operator/memory.py): the reloader's thread, the hand-over
to the intake, the switch on the engine thread, the delivery strategies -- with engines that refuse any
record another engine prepared, so a record that moved engines, or a batch mixing two, fails the test.

What a user would notice: an input without an output, or with two; an output naming a model that did not
make it; a broken new model taking the pipeline down; an old model never closed."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from sluice.config.engine import Reload
from sluice.engines.engine_contract import BatchEngine, ContinuousEngine, EngineStartError
from sluice.engines.identity import MODEL_HEADER, ModelSource
from sluice.engines.model_source import identify
from sluice.operator.observer import Observer
from sluice.operator.reload.memory import Footprint
from sluice.operator.reload.outcome import ReloadOutcome
from sluice.operator.reload.reloader import Phase, Reloader
from sluice.operator.runner import Runner
from sluice.operator.serving import Serving
from tests.operator.memory import ManualClock, MemorySink, MemorySource, pipeline

BATCHING = "batching: {max_batch_size: 8, max_queue_delay_ms: 5}\n"
EXACTLY_ONCE = "delivery: exactly_once\nexactly_once: {transaction_interval_ms: 10}\n"
DELIVERY = pytest.mark.parametrize("extra", ["", EXACTLY_ONCE], ids=["at-least-once", "exactly-once"])


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "cache"))


def records(n: int) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    return [(json.dumps({"text": f"t{i}"}).encode(), f"k{i}".encode(), []) for i in range(n)]


def write_model(path: Path, tag: str) -> None:
    """Replace the model file atomically, as a deployment would (write beside it, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(tag)
    os.replace(tmp, path)


class Tagger(BatchEngine):
    """Tags texts with its model file's content (read at start; "broken" refuses to start). ``prepare``
    marks each item with this engine, and ``infer`` refuses items it did not prepare."""

    def __init__(self, path: Path) -> None:
        self.path, self.tag, self.closed, self.batches = path, "", False, 0

    def model_source(self) -> ModelSource:
        return ModelSource("tagger", self.path)

    def start(self) -> None:
        self.tag = self.path.read_text()
        if self.tag == "broken":
            raise EngineStartError("the model file is corrupt")

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        return [(self, v) for v in values]

    def infer(self, items: Sequence[Any]) -> list[Any]:
        assert not self.closed
        assert all(owner is self for owner, _ in items), "a record prepared by another engine reached this one"
        self.batches += 1
        time.sleep(0.002)  # slower than the records come: a queue builds up, and a switch has some to seal
        return [f"{self.tag}:{text}" for _, text in items]

    def close(self) -> None:
        self.closed = True


class Stepper(ContinuousEngine):
    """A continuous Tagger: each request takes ``num_steps`` steps; ``add`` refuses what it did not prepare."""

    def __init__(self, path: Path, num_steps: int = 4) -> None:
        self.path, self.tag, self.closed, self.num_steps = path, "", False, num_steps
        self.running: dict[Any, list[Any]] = {}
        self.steps = 0

    def model_source(self) -> ModelSource:
        return ModelSource("stepper", self.path)

    def start(self) -> None:
        self.tag = self.path.read_text()

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        return [(self, v) for v in values]

    def room(self) -> int:
        return 6 - len(self.running)

    def add(self, key: Any, item: Any) -> None:
        assert item[0] is self, "a request prepared by another engine reached this one"
        self.running[key] = [item[1], self.num_steps]

    def step(self) -> list[tuple[Any, Any]]:
        assert not self.closed
        self.steps += 1
        time.sleep(0.001)
        done = []
        for key, request in list(self.running.items()):
            request[1] -= 1
            if request[1] == 0:
                done.append((key, f"{self.tag}:{request[0]}"))
                del self.running[key]
        return done

    def abort(self, key: Any) -> None:
        self.running.pop(key, None)

    def close(self) -> None:
        self.closed = True


class Seen(Observer):
    """Remembers the models that served and the reload outcomes."""

    def __init__(self) -> None:
        self.serving: list[str] = []
        self.outcomes: list[ReloadOutcome] = []

    def model_serving(self, engine: Any, identity: Any, warmup_s: float) -> None:
        self.serving.append(identity.label)

    def model_reloaded(self, outcome: ReloadOutcome) -> None:
        self.outcomes.append(outcome)


class Harness:
    """The runner over records 0..n-1, its engine reloadable from ``model`` (watched every 10 ms)."""

    def __init__(self, tmp_path: Path, make: Callable[[Path], Any], n: int, script: Callable[[Harness], None],
                 extra: str = "", footprint: Footprint | None = None, watch: bool = True) -> None:
        self.model = tmp_path / "model.txt"
        write_model(self.model, "v1")
        self.engines: list[Any] = []

        def build() -> Any:
            engine = make(self.model)
            engine.start()
            self.engines.append(engine)
            return engine

        first = build()
        self.labels = {"v1": identify(first.model_source(), "python").label}
        identity = identify(first.model_source(), "python")
        self.observer = Seen()
        self.reloader = Reloader(first.model_source(), Serving(first, identity), footprint or Footprint(), build,
                                 Reload(watch=watch, poll_interval_s=0.01, settle_s=0), self.observer)
        self.source = MemorySource(records(n), per_poll=8, clock=ManualClock(), script=lambda _: script(self))
        self.sink = MemorySink(group_offsets=self.source.committed)
        self.runner = Runner(pipeline(extra=BATCHING + extra), self.source, self.sink, first, clock=self.source.clock,
                             model=identity, reloader=self.reloader, observer=self.observer, idle_exit_s=1)
        self.exactly_once = bool(extra)

    def swap(self, tag: str) -> None:
        write_model(self.model, tag)
        self.labels[tag] = identify(ModelSource("tagger" if isinstance(self.engines[0], Tagger) else "stepper",
                                                self.model), "python").label

    def wait(self, done: Callable[[], bool]) -> None:
        """Hold the intake (inside a poll) until ``done``: the reload happens mid-stream, not after it."""
        deadline = time.monotonic() + 10
        while not done():
            assert time.monotonic() < deadline, f"the reload never got there: {self.observer.outcomes}"
            time.sleep(0.002)

    def outputs(self) -> list[tuple[int, str, str]]:
        """(input offset, the value's tag, the header's model) of every output, by input offset."""
        produced = self.sink.committed_outputs if self.exactly_once else self.sink.on("out")
        found = []
        for p in produced:
            tag = json.loads(p.value or b"{}")["tagged"].split(":")[0]
            found.append((p.input_offset, tag, p.header(MODEL_HEADER)))
        return sorted(found)


def swap_to_v2_at(num_records: int) -> Callable[[Harness], None]:
    """A script: once ``num_records`` are handed out, deploy v2 and hold the intake until it is built."""
    def script(h: Harness) -> None:
        if h.source.num_handed_out == num_records and "v2" not in h.labels:
            h.swap("v2")
            h.wait(lambda: h.reloader.phase is Phase.READY)

    return script


@DELIVERY
def test_a_new_model_takes_over_between_two_batches_and_every_input_has_one_output(tmp_path: Path,
                                                                                   extra: str) -> None:
    h = Harness(tmp_path, Tagger, 400, swap_to_v2_at(160), extra)
    summary = h.runner.run()
    assert summary.error is None and h.sink.on("dlq") == []  # no batch mixed engines (infer would refuse)
    outputs = h.outputs()
    assert [offset for offset, _, _ in outputs] == list(range(400))  # each input exactly once
    assert all(h.labels[tag] == model for _, tag, model in outputs)  # the header names the model that made it
    tags = [tag for _, tag, _ in outputs]
    switch = tags.index("v2")
    assert 160 <= switch < 400 and tags == ["v1"] * switch + ["v2"] * (400 - switch)  # one switch, in order
    old, new = h.engines
    assert old.closed and not new.closed and h.runner.engine is new  # the caller closes the one left serving
    assert h.observer.serving == [h.labels["v1"], h.labels["v2"]]
    assert [o.result for o in h.observer.outcomes] == ["ready"]


def test_a_broken_new_model_leaves_the_old_one_serving_and_says_why(tmp_path: Path) -> None:
    def script(h: Harness) -> None:
        if h.source.num_handed_out == 80 and not h.observer.outcomes:
            h.swap("broken")
            h.wait(lambda: bool(h.observer.outcomes))

    h = Harness(tmp_path, Tagger, 200, script)
    summary = h.runner.run()
    assert summary.error is None
    assert {(tag, model) for _, tag, model in h.outputs()} == {("v1", h.labels["v1"])}
    assert len(h.outputs()) == 200
    (outcome,) = h.observer.outcomes
    assert outcome.result == "failed" and outcome.stage == "start" and "corrupt" in (outcome.reason or "")
    assert outcome.identity is not None and outcome.identity.label == h.labels["broken"]
    assert h.engines[0] is h.runner.engine and not h.engines[0].closed


def test_without_watch_only_a_manual_reload_loads_and_it_retries_a_version_that_failed(tmp_path: Path) -> None:
    def script(h: Harness) -> None:
        n, done = h.source.num_handed_out, len(h.observer.outcomes)
        if n == 40:
            h.swap("broken")  # not watched: nothing happens...
        elif n == 64:
            assert done == 0
            h.runner.reload()  # ...until asked (the loop passes the request on after this poll)
        elif n == 72:
            h.wait(lambda: len(h.observer.outcomes) == 1)
            h.runner.reload()  # the same broken version, asked for again: tried again
        elif n == 80:
            h.wait(lambda: len(h.observer.outcomes) == 2)
            h.swap("v3")
            h.runner.reload()
        elif n == 88:
            h.wait(lambda: h.reloader.phase is not Phase.IDLE)

    h = Harness(tmp_path, Tagger, 200, script, watch=False)
    assert h.runner.run().error is None
    assert [(o.result, o.stage) for o in h.observer.outcomes] == [("failed", "start"), ("failed", "start"),
                                                                   ("ready", None)]
    outputs = h.outputs()
    assert [offset for offset, _, _ in outputs] == list(range(200))
    assert {tag for _, tag, _ in outputs} == {"v1", "v3"}


def test_with_watch_the_same_bytes_are_unchanged_and_a_failed_version_waits_for_a_new_one(tmp_path: Path) -> None:
    def script(h: Harness) -> None:
        n = h.source.num_handed_out
        if n == 40 and not h.observer.outcomes:
            h.swap("v1")  # a new file (new inode, new times), the same bytes
            h.wait(lambda: len(h.observer.outcomes) == 1)
        elif n == 80 and len(h.observer.outcomes) == 1:
            h.swap("broken")
            h.wait(lambda: len(h.observer.outcomes) == 2)
        elif n == 120 and len(h.observer.outcomes) == 2:
            h.swap("v3")
            h.wait(lambda: h.reloader.phase is Phase.READY)

    h = Harness(tmp_path, Tagger, 200, script)
    h.runner.run()
    assert [(o.result, o.stage) for o in h.observer.outcomes] == [("unchanged", None), ("failed", "start"),
                                                                   ("ready", None)]
    assert len(h.engines) == 2  # the identical copy was never built
    outputs = h.outputs()
    assert [offset for offset, _, _ in outputs] == list(range(200))
    assert {tag for _, tag, _ in outputs} == {"v1", "v3"}


def test_no_room_for_a_second_engine_refuses_the_reload_before_building_it(tmp_path: Path) -> None:
    def script(h: Harness) -> None:
        if h.source.num_handed_out == 40 and not h.observer.outcomes:
            h.swap("v2")
            h.wait(lambda: bool(h.observer.outcomes))

    h = Harness(tmp_path, Tagger, 100, script, footprint=Footprint(host_bytes=1 << 60))  # an engine of 1 EiB
    h.runner.run()
    (outcome,) = h.observer.outcomes
    assert outcome.result == "failed" and outcome.stage == "memory"
    assert "not enough host memory" in (outcome.reason or "") and "check_memory: false" in (outcome.reason or "")
    assert len(h.engines) == 1 and {tag for _, tag, _ in h.outputs()} == {"v1"}


@pytest.mark.parametrize("meanwhile", ["touched", "rewritten"])
def test_a_model_changing_while_it_loads_is_loaded_again_unless_only_its_times_changed(tmp_path: Path,
                                                                                       meanwhile: str) -> None:
    class Touchy(Tagger):
        def start(self) -> None:
            super().start()
            if self.tag == "v2":  # the deployment is still at work while the new version loads
                if meanwhile == "touched":
                    os.utime(self.path, (1, 1))
                else:
                    write_model(self.path, "v3")

    def script(h: Harness) -> None:
        if h.source.num_handed_out == 40 and "v2" not in h.labels:
            h.swap("v2")
            h.wait(lambda: h.reloader.phase is Phase.READY)

    h = Harness(tmp_path, Touchy, 120, script)
    assert h.runner.run().error is None
    results = [(o.result, o.stage) for o in h.observer.outcomes]
    if meanwhile == "touched":  # the same bytes: what loaded is what was hashed
        assert results == [("ready", None)] and {tag for _, tag, _ in h.outputs()} == {"v1", "v2"}
    else:  # v2 loaded while v3 was written: refused, then v3 loaded
        assert results == [("failed", "changed"), ("ready", None)]
        assert {tag for _, tag, _ in h.outputs()} == {"v1", "v3"}
        v3 = identify(ModelSource("tagger", h.model), "python").label
        assert {model for _, tag, model in h.outputs() if tag == "v3"} == {v3}


@DELIVERY
def test_a_continuous_engine_runs_beside_the_new_one_until_its_requests_have_finished(tmp_path: Path,
                                                                                       extra: str) -> None:
    h = Harness(tmp_path, Stepper, 240, swap_to_v2_at(96), extra)
    summary = h.runner.run()
    assert summary.error is None and h.sink.on("dlq") == []
    outputs = h.outputs()
    assert [offset for offset, _, _ in outputs] == list(range(240))
    assert all(h.labels[tag] == model for _, tag, model in outputs)
    assert {tag for _, tag, _ in outputs} == {"v1", "v2"}
    old, new = h.engines
    assert old.closed and not new.closed and h.runner.engine is new
    assert not old.running  # retired only once drained: every request it took finished on it


def test_a_run_stopping_before_the_switch_closes_the_new_engine_and_leaves_the_serving_one(tmp_path: Path) -> None:
    hold, stopping = threading.Event(), threading.Event()

    class Held(Tagger):
        def infer(self, items: Sequence[Any]) -> list[Any]:
            if self.tag == "v1" and hold.is_set():  # held until the shutdown has begun
                deadline = time.monotonic() + 10
                while not h.runner.state.stopped:
                    assert time.monotonic() < deadline
                    time.sleep(0.001)
            return super().infer(items)

    def script(h: Harness) -> None:
        if h.source.num_handed_out == 40 and "v2" not in h.labels:
            hold.set()  # the old engine's next batch holds: the sealed records cannot drain
            h.swap("v2")
            h.wait(lambda: h.reloader.phase is Phase.READY)
        elif "v2" in h.labels and h.reloader.phase is Phase.SWITCHING and not stopping.is_set():
            stopping.set()
            h.runner.state.stop("a fatal error elsewhere")  # the engine thread stops after its batch

    h = Harness(tmp_path, Held, 200, script)
    summary = h.runner.run()
    assert summary.error == "a fatal error elsewhere"
    old, new = h.engines
    assert new.closed and new.batches == 0  # handed over, never switched to, closed at the end
    assert not old.closed and h.runner.engine is old  # the serving engine is the caller's to close
    assert {tag for _, tag, _ in h.outputs()} == {"v1"}


def test_the_switch_steps_in_order_and_records_prepared_too_late_are_prepared_again() -> None:
    from sluice.operator.batcher import Batcher, BatchPolicy
    from sluice.operator.ledger import InFlightLedger
    from sluice.operator.reload.switch import Stage
    from sluice.operator.state import SharedState

    state = SharedState(Batcher(BatchPolicy(max_batch_size=2, max_queue_delay_s=1.0)), InFlightLedger())
    old, new = (Serving(Tagger(Path(name)), identify(ModelSource(name, None), "python")) for name in ("a", "b"))
    item = (None, 1)  # the state never looks inside what it queues
    assert state.queue([item, item, item], 0.0) is None and len(state.batcher) == 3  # old's, no switch yet
    switch = state.model_switch
    switch.offer(new)
    assert state.queue([item], 0.0) is None and len(state.batcher) == 4  # offered: still the old engine's
    with state.cond:  # the engine thread's hook: the old engine's next batch, and the rest sealed for it
        last, serving = switch.between_batches(lambda: state.batcher.next_batch(float("inf")) or [])
    assert len(last) == 2 and serving is None  # not before the seal and the intake's move
    assert state.batcher.num_sealed == 2 and switch.stage is Stage.SEALED
    assert state.queue([item], 0.0) is new  # prepared by the old engine too late: not queued, to prepare again
    assert len(state.batcher) == 2 and switch.stage is Stage.ACKED
    assert state.queue([item], 0.0) is None and len(state.batcher) == 3  # the new engine's, unsealed
    with state.cond:
        assert switch.between_batches() == ([], None)  # the sealed ones run on the old engine first
        assert state.batcher.next_batch(float("inf")) is not None and state.batcher.num_sealed == 0
        assert switch.between_batches() == ([], new) and switch.stage is Stage.NONE
        assert switch.between_batches() == ([], None)  # no reload under way: nothing to do
    assert old.engine is not new.engine and switch.at_intake() is None


def test_dead_letters_name_the_model_too_whether_it_failed_them_or_was_serving_when_they_failed(
        tmp_path: Path) -> None:
    class Picky(Tagger):
        def infer(self, items: Sequence[Any]) -> list[Any]:
            if any("poison" in text for _, text in items):
                raise ValueError("cannot digest poison")
            return super().infer(items)

    write_model(tmp_path / "model.txt", "v1")
    engine = Picky(tmp_path / "model.txt")
    engine.start()
    label = identify(engine.model_source(), "python").label
    values = [json.dumps({"text": "fine"}).encode(), b"{broken", json.dumps({"text": "poison"}).encode()]
    source = MemorySource([(v, None, []) for v in values], clock=ManualClock())
    sink = MemorySink()
    Runner(pipeline(extra=BATCHING), source, sink, engine, clock=source.clock, max_records=3).run()
    (out,) = sink.on("out")
    assert out.header(MODEL_HEADER) == label
    dead = {p.header("sluice.error.stage"): p.header(MODEL_HEADER) for p in sink.on("dlq")}
    assert dead == {"decode": label, "infer": label}
