"""The ONNX Runtime engine on the real all-MiniLM-L6-v2, against sentence-transformers as the reference."""

from __future__ import annotations

import logging
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from sluice.engines import engine_types
from sluice.engines.engine_contract import EngineContext, EngineStartError, RecordError
from sluice.engines.onnx.onnx_engine import ENGINE_TYPE, OnnxEngine, OnnxOptions
from sluice.engines.tasks.vector_formats import decode_base64_vector

_WORDS = ("the quick brown fox jumps over lazy dog battery screen delivery refund great terrible ok "
          "shipping arrived broken works perfectly would buy again não recomendo très bien größe "
          "naïve café señor 東京 製品 很好 质量 좋아요 ★★★★☆ 👍 🔥 😡 ½ 3.5mm USB-C 100% #1").split()


def varied_texts(num_texts: int = 200, seed: int = 7) -> list[str]:
    """Deterministic texts from 1 to 300+ words: ASCII, accents, CJK, emoji, the empty string, whitespace."""
    rng = random.Random(seed)
    texts = ["", "ok", "👍", "東京タワーはとても高いです。", "   spaced   out\n\tlines  ", "Ünïcödé ÀÉÎÕÜ ß"]
    while len(texts) < num_texts:
        # Skewed short, like reviews; every 40th text is 300+ words (truncated at 256 tokens).
        num_words = rng.choice([320, 400]) if len(texts) % 40 == 0 else rng.choice([1, 2, 3, 5, 8, 13, 21, 40, 60])
        words = [rng.choice(_WORDS) for _ in range(num_words)]
        text = " ".join(words)
        texts.append(text.capitalize() + rng.choice([".", "!", "?", "", " 🎉"]))
    return texts


def _engine(model: str | Path, **options: Any) -> OnnxEngine:
    opts = OnnxOptions(model=str(model), **{"providers": ["cpu"], "intra_op_num_threads": 2, **options})
    return ENGINE_TYPE.factory(opts, EngineContext(max_batch_size=16))


def _embed(engine: OnnxEngine, texts: list[str], batch_size: int = 8) -> list[Any]:
    items = [engine.prepare([text])[0] for text in texts]  # one record at a time, as the operator does
    results: list[Any] = []
    for start in range(0, len(items), batch_size):  # unsorted: each batch mixes short and long texts
        results.extend(engine.infer(items[start : start + batch_size]))
    return results


@pytest.fixture(scope="module")
def engine(minilm_dir: Path) -> OnnxEngine:
    engine = _engine("minilm-l6")
    engine.start()
    return engine


def test_embeddings_match_sentence_transformers_on_200_varied_texts(engine: OnnxEngine, minilm_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    texts = varied_texts()
    reference = SentenceTransformer(str(minilm_dir), device="cpu").encode(
        texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)  # (200, 384)
    got = np.asarray(_embed(engine, texts), dtype=np.float32)
    assert got.shape == (200, 384)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
    cosines = (got * reference).sum(axis=1) / np.linalg.norm(reference, axis=1)
    worst = int(np.argmin(cosines))
    assert cosines.min() >= 0.999, f"text {worst} ({texts[worst][:40]!r}) has cosine {cosines[worst]:.5f}"
    assert max(engine.item_length(engine.prepare([t])[0]) for t in texts) == 256  # long texts truncated


def test_an_embedding_does_not_depend_on_its_batch_mates(engine: OnnxEngine) -> None:
    alone = engine.infer(engine.prepare(["short review"]))[0]
    mixed = engine.infer(engine.prepare(["short review", "a much longer review " * 30, ""]))[0]
    np.testing.assert_allclose(alone, mixed, atol=1e-5)


def test_base64_output_decodes_to_the_list_vector(minilm_dir: Path, engine: OnnxEngine) -> None:
    b64_engine = _engine(minilm_dir / "model.onnx", output_format="base64", warmup=False)
    b64_engine.start()
    texts = ["first text", "second, longer text with more words in it"]
    as_list = engine.infer(engine.prepare(texts))
    as_b64 = b64_engine.infer(b64_engine.prepare(texts))
    assert all(isinstance(s, str) for s in as_b64)
    for b64, vector in zip(as_b64, as_list, strict=True):
        np.testing.assert_array_equal(decode_base64_vector(b64), np.asarray(vector, dtype=np.float32))


def test_normalize_false_returns_the_raw_mean(minilm_dir: Path, engine: OnnxEngine) -> None:
    raw_engine = _engine(minilm_dir, normalize=False, warmup=False)
    raw_engine.start()
    (raw,) = raw_engine.infer(raw_engine.prepare(["norm check"]))
    (unit,) = engine.infer(engine.prepare(["norm check"]))
    norm = np.linalg.norm(raw)
    assert abs(norm - 1.0) > 0.01
    np.testing.assert_allclose(np.asarray(raw) / norm, unit, atol=1e-5)


def test_max_length_bounds_item_length(minilm_dir: Path) -> None:
    short_engine = _engine(minilm_dir, max_length=32, warmup=False)
    short_engine.start()
    (item,) = short_engine.prepare(["word " * 200])
    assert short_engine.item_length(item) == 32


def test_io_binding_path_gives_the_same_vectors(minilm_dir: Path, engine: OnnxEngine) -> None:
    """On GPU the engine binds outputs to the device; here the same code path binds them to the CPU."""
    bound = _engine(minilm_dir, warmup=False)
    bound.start()
    bound.backend._use_io_binding, bound.backend._io_device = True, "cpu"
    texts = ["io binding", "another text that is longer than the first"]
    np.testing.assert_allclose(bound.infer(bound.prepare(texts)), engine.infer(engine.prepare(texts)), atol=1e-6)


def test_non_string_input_is_a_record_error(engine: OnnxEngine) -> None:
    with pytest.raises(RecordError, match="expects a string, got int"):
        engine.prepare([42])
    with pytest.raises(RecordError, match="UTF-8"):
        engine.prepare([b"\xff\xfe"])
    assert len(engine.prepare([b"bytes are decoded"])) == 1


def test_empty_batch_gives_no_results(engine: OnnxEngine) -> None:
    assert engine.infer([]) == []


# ------------------------------------------------------------------------------------ start-up errors


def _one_line_start_error(engine: OnnxEngine) -> str:
    with pytest.raises(EngineStartError) as caught:
        engine.start()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_missing_model_path_fails_at_start(tmp_path: Path) -> None:
    message = _one_line_start_error(_engine(tmp_path / "nope.onnx"))
    assert "nope.onnx" in message and "does not exist" in message


def test_a_directory_without_model_onnx_or_hf_model_fails_at_start(tmp_path: Path) -> None:
    message = _one_line_start_error(_engine(tmp_path))
    assert "no model.onnx" in message and "config.json" in message


def test_a_file_that_is_not_onnx_fails_at_start(tmp_path: Path, minilm_dir: Path) -> None:
    (tmp_path / "tokenizer.json").symlink_to(minilm_dir / "tokenizer.json")
    bad = tmp_path / "model.onnx"
    bad.write_text("not a model")
    assert "cannot load ONNX model" in _one_line_start_error(_engine(bad))


def test_raw_inputs_not_in_the_model_fail_at_start(minilm_dir: Path) -> None:
    message = _one_line_start_error(_engine(minilm_dir, task="raw", inputs={"pixels": "image"}))
    assert "'pixels'" in message and "input_ids" in message


def test_a_model_with_other_inputs_fails_for_text_embedding(tmp_path: Path, minilm_dir: Path) -> None:
    (tmp_path / "tokenizer.json").symlink_to(minilm_dir / "tokenizer.json")
    path = _tiny_model(tmp_path, input_name="features", output_name="scores")
    message = _one_line_start_error(_engine(path))
    assert "features" in message and "task: raw" in message


def test_a_model_without_embedding_outputs_fails_at_start(tmp_path: Path, minilm_dir: Path) -> None:
    (tmp_path / "tokenizer.json").symlink_to(minilm_dir / "tokenizer.json")
    path = _tiny_model(tmp_path, input_name="input_ids", output_name="logits", dtype="int64")
    message = _one_line_start_error(_engine(path))
    assert "logits" in message and "last_hidden_state" in message


def test_a_sentence_transformers_module_the_task_cannot_run_fails_at_start(minilm_dir: Path,
                                                                             tmp_path: Path) -> None:
    for name in ("model.onnx", "tokenizer.json", "config.json", "1_Pooling"):
        (tmp_path / name).symlink_to(minilm_dir / name)
    (tmp_path / "modules.json").write_text(
        '[{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},'
        ' {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},'
        ' {"idx": 2, "path": "2_LayerNorm", "type": "sentence_transformers.models.LayerNorm"}]')
    message = _one_line_start_error(_engine(tmp_path))
    assert "LayerNorm" in message and "Dense/Normalize" in message


def test_an_unknown_provider_fails(minilm_dir: Path) -> None:
    with pytest.raises(ValidationError, match="unknown provider 'gpu-magic'"):
        OnnxOptions(model=str(minilm_dir), providers=["gpu-magic"])
    message = _one_line_start_error(_engine(minilm_dir, providers=["FooExecutionProvider", "cpu"]))
    assert "FooExecutionProvider" in message and "CPUExecutionProvider" in message


def test_options_reject_misspelt_keys_and_raw_without_inputs() -> None:
    with pytest.raises(ValidationError, match="normalise"):
        OnnxOptions.model_validate({"model": "m", "normalise": False})
    with pytest.raises(ValidationError, match="needs 'inputs'"):
        OnnxOptions(model="m", task="raw")
    with pytest.raises(ValidationError, match="'top_k' is an option of task text-classification"):
        OnnxOptions(model="m", task="text-embedding", top_k=2)
    with pytest.raises(ValidationError, match="unknown task 'sentiment'"):
        OnnxOptions(model="m", task="sentiment")


def _cuda_available() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.mark.skipif(_cuda_available(), reason="this onnxruntime build has CUDA; nothing is skipped")
def test_unavailable_gpu_providers_are_skipped_in_one_info_line_without_a_warning(
        minilm_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = _engine(minilm_dir, providers=["tensorrt", "cuda", "cpu"], warmup=False)  # as the examples list
    with caplog.at_level(logging.DEBUG, logger="sluice.engines.onnx.onnx_engine"):
        engine.start()
    assert engine.providers_used == ["CPUExecutionProvider"]
    said = [r for r in caplog.records if r.name == "sluice.engines.onnx.onnx_engine"]
    assert [r.levelno for r in said] == [logging.INFO], caplog.text  # one line, no warning
    assert said[0].getMessage().startswith("onnx engine: runs on CPUExecutionProvider, the first listed one")
    assert "TensorrtExecutionProvider, CUDAExecutionProvider: not in this onnxruntime build" in caplog.text
    only_gpu = _engine(minilm_dir, providers=["cuda"], warmup=False)
    assert "none of the providers" in _one_line_start_error(only_gpu)


# --------------------------------------------------------------------------------------------- raw task


def test_raw_task_runs_records_of_any_shape_and_rejects_bad_ones(tmp_path: Path) -> None:
    path = _tiny_model(tmp_path, input_name="x", output_name="y")  # y = 2 * x, x: (batch, dynamic)
    engine = _engine(path, task="raw", inputs={"x": "data.values"})
    engine.start()
    items = engine.prepare([{"data": {"values": [1, 2]}}, {"data": {"values": [3, 4, 5]}},
                            {"data": {"values": [0.5, 1]}}])
    assert engine.infer(items) == [{"y": [2.0, 4.0]}, {"y": [6.0, 8.0, 10.0]}, {"y": [1.0, 2.0]}]
    with pytest.raises(RecordError, match="no field 'data.values'"):
        engine.prepare([{"data": {}}])
    with pytest.raises(RecordError, match="not a numeric array"):
        engine.prepare([{"data": {"values": ["a", "b"]}}])
    with pytest.raises(RecordError, match="dimensions"):
        engine.prepare([{"data": {"values": [[1.0]]}}])
    with pytest.raises(RecordError, match="JSON object"):
        engine.prepare(["text"])


def _tiny_model(tmp_path: Path, *, input_name: str, output_name: str, dtype: str = "float") -> Path:
    """A one-node ONNX graph: output = 2 * input, shape (batch, n), both axes dynamic."""
    import onnx
    from onnx import TensorProto, helper

    elem = TensorProto.FLOAT if dtype == "float" else TensorProto.INT64
    two = helper.make_tensor("two", elem, [], [2])
    graph = helper.make_graph(
        [helper.make_node("Mul", [input_name, "two"], [output_name])], "tiny",
        [helper.make_tensor_value_info(input_name, elem, ["batch", "n"])],
        [helper.make_tensor_value_info(output_name, elem, ["batch", "n"])], initializer=[two])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / f"{input_name}_{output_name}.onnx"
    onnx.save(model, str(path))
    return path


# ------------------------------------------------------------------------------------------- packaging


def test_the_registry_finds_the_engine_without_importing_onnxruntime() -> None:
    assert engine_types.lookup("onnx") is ENGINE_TYPE
    code = "import sys, sluice.engines.onnx.onnx_engine; print('onnxruntime' in sys.modules, 'tokenizers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
