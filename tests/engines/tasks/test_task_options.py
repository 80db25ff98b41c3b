"""Task options under ``engine:`` (validated by ``sluice validate``), start-up errors, and bad records."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice.config import ConfigError, parse_pipeline
from sluice.engines.engine_contract import EngineStartError, RecordError
from sluice.engines.tasks import task_types

PIPELINE = """\
source:
  kafka: {bootstrap_servers: "127.0.0.1:9092", topics: [t], group_id: g}
codec: {format: json, input_field: "."}
engine:
  type: ENGINE
  model: some/dir
OPTIONS
sink:
  kafka: {topic: out}
"""


def _validate(options: str, engine: str = "onnx") -> Any:
    return parse_pipeline(PIPELINE.replace("ENGINE", engine).replace("OPTIONS", options), environ={})


@pytest.mark.parametrize(("engine", "options", "fragments"), [
    ("onnx", "  task: text-embedding\n  top_k: 3",
     ["engine.top_k (line 8)",
      "'top_k' is an option of task text-classification / image-classification, not of task text-embedding"]),
    ("torch", "  task: text-classification\n  topk: 3", ["engine.topk (line 8)", "unknown key"]),
    ("onnx", "  task: sentiment", ["engine.task (line 7)", "unknown task 'sentiment'"]),
    ("tensorrt", "  task: raw\n  inputs: {x: y}", ["engine.task", "runs text tasks; run task raw on engine type onnx"]),
    ("tensorrt", "  task: image-classification", ["engine.task", "run task image-classification on engine type onnx"]),
    ("onnx", "  task: image-classification\n  image: {source: url}", ["engine.image.source", "'location'"]),
    ("torch", "  task: image-text-embedding\n  inputs: {picture: p}", ["'image' and 'text' fields"]),
    ("onnx", "  task: cross-encoder", ["needs 'inputs: {text: FIELD, text_pair: FIELD}'"]),
    ("onnx", "  task: cross-encoder\n  inputs: {query: q, doc: d}", ["exactly the keys text and text_pair"]),
    ("torch", "  task: token-classification\n  aggregation_strategy: longest",
     ["engine.aggregation_strategy (line 8)", "expected one of"]),
    ("onnx", "  prompt: 'query: '\n  prompt_name: query", ["'prompt' (the text) or 'prompt_name'"]),
    ("onnx", "  pooling: median", ["engine.pooling"]),
    ("onnx", "  task: text-classification\n  top_k: 0", ["engine.top_k (line 8)", "greater than or equal to 1"]),
])
def test_misplaced_or_wrong_task_options_fail_validation_with_their_path(engine: str, options: str,
                                                                         fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        _validate(options, engine)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_a_task_gets_its_own_options_with_its_defaults() -> None:
    loaded = _validate("  task: token-classification\n  aggregation_strategy: first")
    options = loaded.engine_options.task_options()
    assert type(options).__name__ == "TokenClassificationOptions"
    assert (options.aggregation_strategy, options.ignore_labels, options.max_length) == ("first", ["O"], None)
    pair = _validate("  task: cross-encoder\n  inputs: {text: q, text_pair: d}", "torch").engine_options
    assert pair.task_options().inputs == {"text": "q", "text_pair": "d"}


def test_every_task_is_registered_with_a_model_class() -> None:
    assert task_types.names() == ["text-embedding", "text-classification", "token-classification", "cross-encoder",
                                "image-classification", "image-text-embedding", "raw"]
    assert task_types.text_task_names() == task_types.names()[:4]
    assert task_types.exportable_task_names() == task_types.names()[:-1]
    assert {task_types.lookup(name).model_class.value for name in task_types.names()} == {
        "encoder", "sequence-classification", "token-classification", "image-classification", "image-text", "any"}


# ---------------------------------------------------------------------------------------- start-up errors


def _start_error(make_engine: Callable[..., Any], kind: str, **options: Any) -> str:
    with pytest.raises(EngineStartError) as caught:
        make_engine(kind, **options)
    message = str(caught.value)
    assert "\n" not in message
    return message


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def test_classifying_without_labels_or_with_an_encoder_fails_at_start(tmp_path: Path, tiny: dict[str, Path],
                                                                     make_engine: Callable[..., Any]) -> None:
    unlabelled = _copy(tiny["classifier"], tmp_path / "unlabelled")
    config = json.loads((unlabelled / "config.json").read_text())
    del config["id2label"], config["label2id"]
    (unlabelled / "config.json").write_text(json.dumps(config))
    assert "has no id2label" in _start_error(make_engine, "onnx", model=str(unlabelled), task="text-classification")
    message = _start_error(make_engine, "torch", model=str(tiny["embedder-cls"]), task="text-classification")
    assert "describes a BertModel" in message and "ForSequenceClassification" in message


def test_a_head_that_does_not_match_the_task_fails_at_start(tmp_path: Path, tiny: dict[str, Path],
                                                            make_engine: Callable[..., Any]) -> None:
    message = _start_error(make_engine, "onnx", model=str(tiny["classifier"]), task="token-classification")
    assert "BertForSequenceClassification" in message and "ForTokenClassification" in message
    # A config without architectures: the weights tell (the classification head is missing).
    bare = _copy(tiny["embedder-cls"], tmp_path / "bare")
    config = json.loads((bare / "config.json").read_text())
    del config["architectures"]
    config["id2label"] = {"0": "a", "1": "b"}
    (bare / "config.json").write_text(json.dumps(config))
    for kind in ("torch", "onnx"):
        message = _start_error(make_engine, kind, model=str(bare), task="text-classification")
        assert "has no weights for classifier" in message and "not a sequence-classification model" in message


def test_ner_without_a_fast_tokenizer_fails_at_start(tmp_path: Path, tiny: dict[str, Path],
                                                     make_engine: Callable[..., Any]) -> None:
    slow_only = _copy(tiny["ner"], tmp_path / "slow-only")
    (slow_only / "tokenizer.json").unlink()  # vocab.txt alone: no offsets
    message = _start_error(make_engine, "torch", model=str(slow_only), task="token-classification")
    assert "character offsets" in message and "tokenizer.json" in message


def test_embedding_configs_the_task_cannot_honour_fail_at_start(tmp_path: Path, tiny: dict[str, Path],
                                                                make_engine: Callable[..., Any]) -> None:
    message = _start_error(make_engine, "onnx", model=str(tiny["embedder-cls"]), prompt_name="classification")
    assert "prompt_name 'classification'" in message and "document, passage, query" in message
    message = _start_error(make_engine, "torch", model=str(tiny["embedder-cls"]), dimensions=99)
    assert "dimensions: 99 is more than the model's 32" in message
    reranker_with_dense = _copy(tiny["cross-encoder"], tmp_path / "dense-reranker")
    (reranker_with_dense / "modules.json").write_text(json.dumps([
        {"idx": 0, "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "path": "1_Dense", "type": "sentence_transformers.base.modules.dense.Dense"}]))
    message = _start_error(make_engine, "torch", model=str(reranker_with_dense), task="cross-encoder",
                           inputs={"text": "q", "text_pair": "d"})
    assert "lists modules after the transformer" in message


# --------------------------------------------------------------------------------------------- bad records


def test_malformed_pair_records_are_record_errors(tiny: dict[str, Path], make_engine: Callable[..., Any]) -> None:
    engine = make_engine("torch", model=str(tiny["cross-encoder"]), task="cross-encoder",
                         inputs={"text": "q", "text_pair": "doc.body"}, warmup=False)
    for value, fragment in [("just a string", "JSON object"), ({"q": "x"}, "no field 'doc.body'"),
                            ({"q": 3, "doc": {"body": "y"}}, "expects a string in field 'q', got int"),
                            ({"q": "x", "doc": {"body": b"\xff"}}, "field 'doc.body' is not valid UTF-8")]:
        with pytest.raises(RecordError, match=fragment):
            engine.prepare([value])
    assert len(engine.infer(engine.prepare([{"q": b"bytes", "doc": {"body": ""}}]))) == 1
