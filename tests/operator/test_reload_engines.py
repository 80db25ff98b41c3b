"""Reloads of real engines, built the way ``sluice run`` builds them (sluice/operator/build.py: the model
hashed while it loads, the reloader, the memory check), run by the real runner over the in-memory source
and sink: an ONNX model and an LLM swapped mid-stream behind a symlink, each output checked against what
the model its header names computes for that record, and broken versions left unloaded."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice.engines.identity import MODEL_HEADER, parse_label
from sluice.model_store.digest import content_digest
from sluice.operator.build import build_reloader, start_engine
from sluice.operator.observer import Observer
from sluice.operator.reload.outcome import ReloadOutcome
from sluice.operator.reload.reloader import Phase
from sluice.operator.reload.switch import Stage
from sluice.operator.runner import Runner
from tests.operator.memory import ManualClock, MemorySink, MemorySource, pipeline

RELOAD = "reload: {watch: true, poll_interval_s: 0.02, settle_s: 0}"


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "cache"))


def point(link: Path, target: Path) -> None:
    """``ln -sfn target link``, atomically."""
    tmp = link.with_name(link.name + ".tmp")
    tmp.symlink_to(target)
    os.replace(tmp, link)


class Outcomes(Observer):
    def __init__(self) -> None:
        self.seen: list[ReloadOutcome] = []

    def model_reloaded(self, outcome: ReloadOutcome) -> None:
        self.seen.append(outcome)


def run_with_swaps(engine_yaml: str, values: list[Any], swaps: list[tuple[int, Callable[[], None], str]],
                   per_poll: int = 8, input_field: str = "text") -> tuple[list[tuple[str, Any, Any]], Outcomes, Runner]:
    """Run ``values`` through the pipeline; at each ``(records handed out, swap, wait for)`` the swap runs
    and the intake waits until the reloader is ``ready`` or has ``failed``. After ``ready`` the next poll
    also waits until the engine thread has sealed the old engine's records: the switch comes at the engine's
    next batch, and without the wait the intake can read the rest of a short input before the engine thread
    is scheduled (it did once in CI, on 2 slow cores), leaving nothing for the new model. Returns (model
    header, input, result) per output, by input offset."""
    loaded = pipeline(extra=f"engine: {engine_yaml}\nbatching: {{max_batch_size: 8, max_queue_delay_ms: 5}}\n"
                             f'codec: {{format: json, input_field: "{input_field}"}}\n')
    observer = Outcomes()
    engine, started = start_engine(loaded)
    reloader = build_reloader(loaded, engine, started, observer)
    pending = list(swaps)

    offered = [False]  # a ready engine was handed over at the end of the last poll: wait for its seal

    def script(source: MemorySource) -> None:
        if offered[0]:
            offered[0] = False
            deadline = time.monotonic() + 60
            while runner.state.model_switch.stage is Stage.OFFERED:
                assert time.monotonic() < deadline, "the engine thread never sealed the old engine's records"
                time.sleep(0.005)
        if pending and source.num_handed_out >= pending[0][0]:
            _, swap, until = pending.pop(0)
            done = len(observer.seen)
            swap()
            deadline = time.monotonic() + 60
            while not (reloader.phase is Phase.READY if until == "ready" else len(observer.seen) > done):
                assert time.monotonic() < deadline, f"no reload outcome: {observer.seen}"
                time.sleep(0.005)
            offered[0] = until == "ready"

    records = [(json.dumps(v if input_field == "." else {input_field: v}).encode(), None, []) for v in values]
    source = MemorySource(records, per_poll=per_poll, clock=ManualClock(), script=script)
    sink = MemorySink()
    runner = Runner(loaded, source, sink, engine, clock=source.clock, observer=observer, model=started.identity,
                    reloader=reloader, max_records=len(records))
    try:
        assert runner.run().error is None
    finally:
        runner.engine.close()
    assert sink.on("dlq") == []
    outputs = sorted(sink.on("out"), key=lambda p: p.input_offset)
    assert [p.input_offset for p in outputs] == list(range(len(values)))  # each input once
    return [(p.header(MODEL_HEADER), values[p.input_offset], json.loads(p.value or b"{}")["tagged"])
            for p in outputs], observer, runner


def onnx_scale(path: Path, factor: float) -> Path:
    """A one-node ONNX graph: y = factor * x, x of shape (batch, n)."""
    import onnx
    from onnx import TensorProto, helper

    scale = helper.make_tensor("k", TensorProto.FLOAT, [], [factor])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y"])], "scale",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])],
                              initializer=[scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_an_onnx_model_swapped_behind_a_symlink_serves_every_later_record_and_a_broken_file_is_refused(
        tmp_path: Path) -> None:
    v2, v3 = onnx_scale(tmp_path / "v2.onnx", 2.0), onnx_scale(tmp_path / "v3.onnx", 3.0)
    (tmp_path / "broken.onnx").write_bytes(b"this is not an ONNX file")
    renamed = tmp_path / "renamed.onnx"  # loads, but its input is not the one the pipeline feeds
    renamed.write_bytes(v3.read_bytes().replace(b"\n\x01x", b"\n\x01z"))
    current = tmp_path / "current.onnx"
    current.symlink_to(v2)
    factor = {parse_label(f"m@sha256:{content_digest(p)[:12]} (onnx)")[1]: k
              for p, k in ((v2, 2.0), (v3, 3.0))}
    values = [{"x": [float(i), 1.0]} for i in range(240)]
    rows, observer, runner = run_with_swaps(
        f'{{type: onnx, task: raw, inputs: {{x: x}}, providers: [cpu], model: "{current}", {RELOAD}}}', values,
        [(60, lambda: point(current, tmp_path / "broken.onnx"), "failed"),
         (100, lambda: point(current, v3), "ready"),
         (180, lambda: point(current, renamed), "failed")], input_field=".")
    assert [(o.result, o.stage) for o in observer.seen] == [("failed", "start"), ("ready", None), ("failed", "start")]
    assert "cannot load ONNX model" in (observer.seen[0].reason or "")
    assert "not inputs of the model" in (observer.seen[2].reason or "")
    served = []
    for header, value, result in rows:
        name, digest, engine = parse_label(header)
        assert (name, engine) == ("current", "onnx")
        assert result == {"y": [factor[digest] * x for x in value["x"]]}  # computed by the model it names
        served.append(factor[digest])
    switch = served.index(3.0)
    assert 100 <= switch and served == [2.0] * switch + [3.0] * (len(served) - switch)
    assert runner.serving.identity.digest.startswith(next(d for d, k in factor.items() if k == 2.0))


@pytest.fixture
def _one_torch_thread() -> Any:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: OpenMP threads waiting on each other only slow them on 2 cores
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
@pytest.mark.usefixtures("_one_torch_thread")
def test_an_llm_swapped_mid_stream_finishes_what_it_started_and_each_answer_is_its_models(tmp_path: Path) -> None:
    from sluice.engines.engine_contract import EngineContext
    from sluice.engines.llm.operator_engine import LLMEngine, LLMOptions
    from tests.support.tiny_llms import save_tiny_model

    options = dict(max_tokens=6, kv_cache_memory_mb=4, max_num_seqs=4, temperature=0.0)
    versions = {seed: save_tiny_model(tmp_path / f"llama-{seed}", "llama", seed=seed) for seed in (1, 2)}
    texts = [f"review {i}: {'good' if i % 3 else 'bad'} value" for i in range(48)]
    expected: dict[str, dict[str, str]] = {}  # short digest -> text -> the answer of that model
    for path in versions.values():
        engine = LLMEngine(LLMOptions(model=str(path), **options), EngineContext(max_batch_size=8))  # type: ignore[arg-type]
        engine.start()
        answers: dict[int, str] = {}
        for key, item in enumerate(engine.prepare(texts)):
            engine.add(key, item)
        while engine.llm.has_unfinished():
            answers.update(engine.step())
        engine.close()
        expected[content_digest(path)[:12]] = {texts[k]: a for k, a in answers.items()}
    assert len({tuple(sorted(v.items())) for v in expected.values()}) == 2  # the two models answer differently
    current = tmp_path / "current"
    current.symlink_to(versions[1])
    rows, observer, _ = run_with_swaps(
        f'{{type: llm, model: "{current}", max_tokens: 6, kv_cache_memory_mb: 4, max_num_seqs: 4, {RELOAD}}}',
        texts, [(16, lambda: point(current, versions[2]), "ready")], per_poll=4)
    assert [o.result for o in observer.seen] == ["ready"]
    by_model = {parse_label(header)[1] for header, _, _ in rows}
    assert by_model == set(expected)  # both served
    for header, text, answer in rows:
        assert answer == expected[parse_label(header)[1]][text]  # generated start to end by the model it names


def test_watching_a_model_built_in_code_is_refused_at_start_with_what_to_do() -> None:
    from sluice.operator.build import StartError

    loaded = pipeline(extra=f'engine: {{type: python, function: "tests.integration.funcs:tag", {RELOAD}}}\n')
    engine, started = start_engine(loaded)
    assert not started.source.reloadable and started.identity.name == "tests.integration.funcs:tag"
    with pytest.raises(StartError, match="built in code, not a model on disk: there is nothing to watch "
                                         r"\(give engine.model -- with engine.factory for the python engine"):
        build_reloader(loaded, engine, started, Observer())
