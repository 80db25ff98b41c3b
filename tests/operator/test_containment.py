"""Per-record containment through the real runner (in-memory source and sink): whatever one record makes
the codec, the engine or an observer raise, that record alone is dead-lettered with the real exception
class, every other record flows, each input ends in the output or the dead letters exactly once -- and a
run of failures past ``dead_letter.max_consecutive_failures`` stops the operator, uncommitted."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.engines.engine_contract import BatchEngine, ContinuousEngine, RecordError
from sluice.operator.failures.containment import ConsecutiveFailures, error_text
from sluice.operator.observer import Observer
from sluice.operator.record import InputRecord
from tests.operator.memory import MemorySink, Produced, pipeline, run


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


Cyrillic = type("Ошибка", (Exception,), {})

# exceptions a user's engine code can raise, one of each kind; none is special to Sluice
EXCEPTIONS: dict[str, Callable[[], BaseException]] = {
    "ValueError": lambda: ValueError("bad value"),
    "TypeError": lambda: TypeError("bad type"),
    "KeyError": lambda: KeyError("missing"),
    "IndexError": lambda: IndexError("list index out of range"),
    "RecursionError": lambda: RecursionError("maximum recursion depth exceeded"),
    "MemoryError": lambda: MemoryError(),
    "UnicodeDecodeError": lambda: UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
    "ZeroDivisionError": lambda: ZeroDivisionError("division by zero"),
    "AssertionError": lambda: AssertionError("assert len(x) < 512"),
    "NotImplementedError": lambda: NotImplementedError(),
    "OSError": lambda: OSError(5, "Input/output error"),
    "StopIteration": lambda: StopIteration(),
    "RecordError": lambda: RecordError("too long for the model"),
    "BrokenStr": BrokenStr,
    "Huge": lambda: type("Huge", (Exception,), {})("x" * 1_000_000),
    "Ошибка": lambda: Cyrillic("сбой"),
}


class Hostile(BatchEngine):
    """Tags texts; a text ``prepare:NAME`` / ``infer:NAME`` makes that step raise EXCEPTIONS[NAME];
    ``length:bad`` returns a length that is not a number; ``result:KIND`` returns a result that cannot
    become an output (an object, a 5,000-deep list, a lone surrogate, 2 MB)."""

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        items = []
        for v in values:
            if not isinstance(v, str):
                raise TypeError(f"expected a string, got {type(v).__name__}")
            if v.startswith("prepare:"):
                raise EXCEPTIONS[v[8:]]()
            items.append(v)
        return items

    def item_length(self, item: Any) -> int:
        return None if item == "length:bad" else len(item)  # type: ignore[return-value]

    def infer(self, items: Sequence[Any]) -> list[Any]:
        for item in items:
            if item.startswith("infer:"):
                raise EXCEPTIONS[item[6:]]()
        return [self._result(item) for item in items]

    @staticmethod
    def _result(item: str) -> Any:
        deep: list[Any] = []
        for _ in range(5000):
            deep = [deep]
        return {"result:object": object(), "result:deep": deep, "result:surrogate": "\ud800",
                "result:huge": "h" * 2_000_000}.get(item, f"<{item.upper()}>")


# text -> (stage, class) of its dead letter; texts not here come out tagged
EXPECTED: dict[str, tuple[str, str]] = {
    **{f"prepare:{name}": ("prepare", name) for name in EXCEPTIONS},
    **{f"infer:{name}": ("infer", name) for name in EXCEPTIONS},
    "length:bad": ("prepare", "TypeError"),
    "result:object": ("encode", "CodecError"),
    "result:deep": ("encode", "*"),  # msgspec's own class for a too-deep result
    "result:surrogate": ("encode", "CodecError"),
    "result:huge": ("produce", "OversizedResult"),
}


class HostileObserver(Observer):
    """Tracing that trips over a header: ``boom: polled`` at intake, ``boom: output`` on the way out; its
    ``rejected`` hook always fails."""

    injects_headers = True

    def polled(self, records: Sequence[InputRecord], now_s: float) -> None:
        if any(h == ("boom", b"polled") for r in records for h in r.headers):
            raise ValueError("unreadable trace context")

    def rejected(self, failures: Sequence[tuple[InputRecord, str, BaseException | None]]) -> None:
        raise RuntimeError("metrics are down")

    def output_headers(self, record: InputRecord, stage: str | None) -> list[tuple[str, bytes]]:
        if stage is None and ("boom", b"output") in record.headers:
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return [("traceparent", b"00-x")]


def record(text: Any, headers: list[tuple[str, bytes]] | None = None) -> tuple[bytes, list[tuple[str, bytes]]]:
    return json.dumps({"text": text}).encode(), headers or []


def nested(levels: int, shape: str) -> bytes:
    opens, closes = {"list": ("[", "]"), "object": ('{"a":', "}"), "mixed": ('[{"a":', "}]")}[shape]
    return ('{"text": "deep", "x": ' + opens * levels + "0" + closes * levels + "}").encode()


engineered = st.one_of(
    st.sampled_from(sorted(EXPECTED)).map(record),
    st.integers(32, 20_000).flatmap(lambda n: st.sampled_from(["list", "object", "mixed"]).map(
        lambda s: (nested(n, s), []))),
    st.sampled_from([record("ok boom", [("boom", b"polled")]), record("ok trace", [("boom", b"output")])]),
)
# records whose fate is not worked out here: each must still end up somewhere, once
wild = st.one_of(
    st.binary(max_size=60).map(lambda b: (b, [])),
    st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(2**80), 2**80), st.floats(), st.text(max_size=8)),
                 lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner,
                                                                                      max_size=3)),
                 max_leaves=12).map(record),
    st.sampled_from([(None, []), (b'{"text": "\\ud800"}', []), (b'{"text": 1e999}', []), (b"[" * 300_000, []),
                     (b'{"text": "ok ' + b"[" * 100_000 + b'"}', []), (b'{"tex": "no field"}', [])]),
)


def gather(strategy: st.SearchStrategy[Any], n: int) -> list[Any]:
    drawn: list[Any] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(strategy)
    def draw(value: Any) -> None:
        drawn.append(value)

    draw()
    return drawn


def headers_of(p: Produced) -> dict[str, str]:
    return {k: v.decode("utf-8", "replace") for k, v in p.headers}


def test_every_hostile_record_is_dead_lettered_with_its_real_class_and_the_rest_flow() -> None:
    hostile = gather(engineered, 400) + gather(wild, 400)
    inputs = []
    for i, (value, headers) in enumerate(hostile):
        inputs.append((json.dumps({"text": f"ok {i}"}).encode(), f"good{i}".encode(), []))
        inputs.append((value, f"bad{i}".encode(), headers))
    summary, source, sink = run(inputs, Hostile(), observer=HostileObserver())

    assert summary.error is None
    keys = Counter(p.key for p in sink.produced)
    assert keys == Counter(key for _, key, _ in inputs), "each input once, in the output or the dead letters"
    assert source.committed[source.tp] == len(inputs)
    original = {key: (value, headers) for value, key, headers in inputs}
    for p in sink.on("out"):
        doc = json.loads(p.value or b"")
        assert doc["tagged"] == f"<{doc['text'].upper()}>"
    for p in sink.on("dlq"):
        assert p.value == original[p.key][0]  # the original bytes
    dead = {p.key: headers_of(p) for p in sink.on("dlq")}
    for i, (value, headers) in enumerate(hostile):
        key = f"bad{i}".encode()
        text = json.loads(value)["text"] if value and value.startswith(b'{"text": "') and len(value) < 200 else None
        if text in EXPECTED:
            stage, cls = EXPECTED[text]
            assert dead[key]["sluice.error.stage"] == stage, (text, dead[key])
            assert cls == "*" or dead[key]["sluice.error.class"] == cls, (text, dead[key])
        elif value is not None and value.startswith(b'{"text": "deep", "x": '):
            assert "codec.max_depth allows 32" in dead[key]["sluice.error.message"]
            assert dead[key]["sluice.error.stage"] == "decode"
        elif ("boom", b"polled") in headers or ("boom", b"output") in headers:
            assert dead[key]["sluice.error.stage"] == "headers"
    assert all(len(h["sluice.error.message"].encode()) <= 4096 for h in dead.values())
    messages = {h["sluice.error.class"]: h["sluice.error.message"] for h in dead.values()}
    assert messages["BrokenStr"] == "<the message could not be read: RuntimeError>"
    assert messages["KeyError"] == "'missing'"


@pytest.mark.parametrize("kind", ["infer", "decode", "prepare"])
def test_a_run_of_failures_stops_the_operator_uncommitted(kind: str) -> None:
    value = {"infer": record("infer:ValueError")[0], "decode": b"{not json", "prepare": record(7)[0]}[kind]
    inputs = [(value, f"k{i}".encode(), []) for i in range(600)]
    summary, source, sink = run(inputs, Hostile(), pipeline(max_consecutive_failures=100))

    assert summary.error is not None
    assert re.search(r"\d+ records in a row failed \(the last, in\[0\]@\d+, at " + kind, summary.error), summary.error
    assert "dead_letter.max_consecutive_failures" in summary.error and "\n" not in summary.error
    num_dead = len(sink.on("dlq"))
    assert num_dead == 99  # the 100th failure in a row stops it, undelivered
    assert source.committed.get(source.tp, 0) <= num_dead  # nothing past the dead letters is committed


def test_failures_between_successes_never_stop_it_and_null_turns_the_breaker_off() -> None:
    alternating = [(record("infer:ValueError" if i % 3 else f"ok {i}")[0], f"k{i}".encode(), []) for i in range(900)]
    summary, _, sink = run(alternating, Hostile(), pipeline(max_consecutive_failures=10))
    assert summary.error is None and len(sink.on("dlq")) == 600

    failing = [(b"{not json", f"k{i}".encode(), []) for i in range(1500)]
    summary, source, sink = run(failing, Hostile(), pipeline(max_consecutive_failures=None))
    assert summary.error is None and len(sink.on("dlq")) == 1500 and source.committed[source.tp] == 1500


def test_a_dead_letter_too_large_for_its_topic_leaves_out_the_value_but_not_the_record() -> None:
    big = b'{"text": "x", "pad": "' + b"p" * 150_000 + b"["  # invalid JSON, over the dead-letter topic's limit
    sink = MemorySink(limits={"dlq": 100_000})
    inputs = [(big, b"big", [("h", b"v" * 500)]), (record("ok")[0], b"fine", [])]
    summary, source, sink = run(inputs, Hostile(), sink=sink)
    assert summary.error is None and source.committed[source.tp] == 2
    (dead,) = sink.on("dlq")
    h = headers_of(dead)
    assert dead.value == b"" and dead.key == b"big" and h["h"] == "v" * 500
    assert h["sluice.error.dropped"].startswith(f"value ({len(big)} bytes)") and h["sluice.error.offset"] == "0"


class Continuous(ContinuousEngine):
    """A continuous engine: ``add:fail`` cannot be added, ``step:fail`` finishes with an exception."""

    def __init__(self) -> None:
        self.running: list[tuple[Any, Any]] = []

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        return [v.upper() if not v.startswith("prepare:") else {}["no such field"] for v in values]

    def room(self) -> int:
        return 4 - len(self.running)

    def add(self, key: Any, item: Any) -> None:
        if item == "ADD:FAIL":
            raise OverflowError("the prompt does not fit")
        self.running.append((key, item))

    def step(self) -> list[tuple[Any, Any]]:
        done, self.running = self.running, []
        return [(k, LookupError("no answer") if item == "STEP:FAIL" else f"<{item}>") for k, item in done]

    def abort(self, key: Any) -> None:
        self.running = [(k, i) for k, i in self.running if k != key]


def test_a_continuous_engine_s_failures_are_contained_the_same_way() -> None:
    texts = ["ok", "add:fail", "step:fail", "prepare:x", "fine"] * 40
    inputs = [(record(t)[0], f"k{i}".encode(), []) for i, t in enumerate(texts)]
    summary, source, sink = run(inputs, Continuous())
    assert summary.error is None and source.committed[source.tp] == len(inputs)
    dead = Counter((headers_of(p)["sluice.error.stage"], headers_of(p)["sluice.error.class"]) for p in sink.on("dlq"))
    assert dead == {("infer", "OverflowError"): 40, ("infer", "LookupError"): 40, ("prepare", "KeyError"): 40}
    assert len(sink.on("out")) == 80


def test_consecutive_failures_count_from_the_last_success() -> None:
    breaker = ConsecutiveFailures(threshold=5)
    assert breaker.observe([False] * 3) == 3
    assert breaker.observe([False, True, False]) == 2  # a success in between: the run starts again after it
    assert breaker.run == 1
    assert breaker.observe([False, False, False, False, True]) == 3  # the 5th in a row trips it
    assert breaker.tripped and breaker.run == 0
    assert breaker.observe([False, True]) == 0  # once tripped, no failure passes
    assert ConsecutiveFailures(threshold=None).observe([False] * 10_000) == 10_000


def test_error_text_never_raises() -> None:
    assert error_text(BrokenStr()) == ("BrokenStr", "<the message could not be read: RuntimeError>")
    assert error_text(NotImplementedError()) == ("NotImplementedError", "NotImplementedError")
    assert error_text("plain") == ("Error", "plain")
