"""``sluice validate`` checks the model a pipeline names, as far as its files say, without loading it.

What the engine's start refuses before reading weights -- an LLM checkpoint whose ``config.json``
architecture, ``model_type``, activation, rope scaling or keys no family runs, a GGUF header likewise, a
task model whose head or labels do not fit the task -- is refused by validate too, with the same reason, in
one line ``<file>: engine.model: <reason>``, exit 1. A model that is not on this machine (a path that does
not exist here, a hub id, a known model not fetched) cannot be checked: a warning saying so, exit 0. The
models here are a few JSON keys and a GGUF header written in milliseconds: no weights to speak of.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sluice.config import load_pipeline
from sluice.engines.engine_contract import EngineContext
from sluice.engines.model_check import ModelCheck, check_model

ROOT = Path(__file__).resolve().parents[1]
SLUICE = [sys.executable, "-m", "sluice.cli"]

TINY_LLAMA: dict[str, Any] = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=32, hidden_size=16, intermediate_size=32,
    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
)
TINY_GEMMA2: dict[str, Any] = dict(TINY_LLAMA, architectures=["Gemma2ForCausalLM"], model_type="gemma2", head_dim=8)


# ------------------------------------------------------------------------------------------- models


def hf_dir(path: Path, config: dict[str, Any]) -> Path:
    """A HF checkpoint directory: ``config`` as config.json, and a (tiny) model.safetensors."""
    from safetensors.numpy import save_file

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file({"model.embed_tokens.weight": np.zeros((4, 4), dtype=np.float32)}, str(path / "model.safetensors"))
    return path


def gguf_file(path: Path, architecture: str, **strings: str) -> Path:
    """A GGUF file of ``architecture`` with a Llama-shaped header (1 block, 16 wide) and one small tensor."""
    from gguf import GGUFWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_embedding_length(16)
    writer.add_feed_forward_length(32)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_context_length(64)
    for key, value in strings.items():
        writer.add_string(key, value)
    writer.add_tensor("token_embd.weight", np.zeros((32, 16), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def classifier_dir(path: Path, architecture: str, labels: dict[str, str] | None) -> Path:
    """A task model directory: config.json (``architecture``, ``id2label``) and a word-level tokenizer.json."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    path.mkdir(parents=True)
    config: dict[str, Any] = {"architectures": [architecture], "model_type": "bert", "max_position_embeddings": 64}
    if labels is not None:
        config["id2label"] = labels
    (path / "config.json").write_text(json.dumps(config))
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "good": 4, "bad": 5}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(path / "tokenizer.json"))
    return path


def pipeline(directory: Path, engine: str, name: str = "p.yaml") -> Path:
    """A pipeline file in ``directory`` reading in.jsonl with ``engine`` (YAML flow mapping contents)."""
    (directory / "in.jsonl").write_text('{"text": "good"}\n')
    path = directory / name
    path.write_text(f"name: models\nsource: {{file: {{path: in.jsonl}}}}\nengine: {{{engine}}}\n"
                    "sink: {file: {path: out.jsonl, overwrite: true}}\n")
    return path


def check(path: Path) -> ModelCheck:
    """What validate finds about the model of the pipeline file ``path`` (the same call as the command)."""
    loaded = load_pipeline(path)
    p = loaded.pipeline
    context = EngineContext(max_batch_size=p.batching.max_batch_size, pipeline_dir=str(loaded.base_dir))
    return check_model(p.engine.type, loaded.engine_options, context)


def validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SLUICE, "validate", *map(str, paths)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


# ------------------------------------------------------------------------------------------- the command


def test_an_unsupported_architecture_is_one_error_line_naming_it_and_exit_1(tmp_path: Path) -> None:
    hf_dir(tmp_path / "models" / "falcon", {"architectures": ["FalconForCausalLM"], "model_type": "falcon"})
    path = pipeline(tmp_path, "type: llm, model: models/falcon, max_tokens: 4")
    proc = validate(path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"{path}: engine.model: ")
    assert "'FalconForCausalLM' is not supported" in line and "LlamaForCausalLM" in line  # and what is


def test_an_unsupported_gguf_architecture_is_refused_from_its_header(tmp_path: Path) -> None:
    gguf_file(tmp_path / "models" / "falcon.gguf", "falcon")
    path = pipeline(tmp_path, "type: llm, model: models/falcon.gguf, max_tokens: 4")
    proc = validate(path)
    assert proc.returncode == 1, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"{path}: engine.model: ") and "GGUF architecture 'falcon' is not supported" in line


def test_supported_tiny_models_validate_ok_without_warnings(tmp_path: Path) -> None:
    hf_dir(tmp_path / "models" / "llama", TINY_LLAMA)
    gguf_file(tmp_path / "models" / "gguf" / "model.gguf", "llama")  # a directory holding one .gguf
    classifier_dir(tmp_path / "models" / "classifier", "BertForSequenceClassification", {"0": "bad", "1": "good"})
    paths = [pipeline(tmp_path, "type: llm, model: models/llama, max_tokens: 4", "hf.yaml"),
             pipeline(tmp_path, "type: llm, model: models/gguf, max_tokens: 4", "gguf.yaml"),
             pipeline(tmp_path, "type: onnx, model: models/classifier, task: text-classification", "onnx.yaml")]
    proc = validate(*paths)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr and "engine.model" not in proc.stderr
    assert [line.split(": ok (")[0] for line in proc.stdout.splitlines()[:3]] == [str(p) for p in paths]


def test_a_model_that_is_not_here_is_a_warning_that_it_could_not_be_checked(tmp_path: Path) -> None:
    paths = [pipeline(tmp_path, "type: llm, model: models/elsewhere, max_tokens: 4", "path.yaml"),
             pipeline(tmp_path, "type: llm, model: HuggingFaceTB/SmolLM2-135M-Instruct, max_tokens: 4", "hub.yaml"),
             pipeline(tmp_path, "type: onnx, model: models/elsewhere, task: text-classification", "onnx.yaml")]
    proc = validate(*paths)
    assert proc.returncode == 0, proc.stderr
    warnings = proc.stderr.splitlines()
    assert len(warnings) == 3 and proc.stdout.count(": ok (") == 3
    for path, warning in zip(paths, warnings, strict=True):
        assert warning.startswith(f"{path}: warning: engine.model: model path ")
        assert "could not be checked here" in warning


def test_validate_gives_the_reason_sluice_run_stops_with(tmp_path: Path) -> None:
    """Not a second copy of the rules: the engine's start refuses the same model with the same words."""
    hf_dir(tmp_path / "models" / "gemma", dict(TINY_GEMMA2, hidden_activation="gelu_new"))
    path = pipeline(tmp_path, "type: llm, model: models/gemma, max_tokens: 4")
    validated = validate(path)
    run = subprocess.run([*SLUICE, "--log-level", "error", "run", str(path)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert validated.returncode == 1 and run.returncode == 1, (validated.stderr, run.stderr)
    [line] = validated.stderr.splitlines()
    reason = line.removeprefix(f"{path}: engine.model: ")
    assert "hidden_activation 'gelu_new' is not supported" in reason
    assert f"sluice: cannot start: engine 'llm': {reason}" in run.stderr


def test_validate_imports_no_torch(tmp_path: Path) -> None:
    hf_dir(tmp_path / "models" / "llama", TINY_LLAMA)
    gguf_file(tmp_path / "models" / "falcon.gguf", "falcon")
    classifier_dir(tmp_path / "models" / "classifier", "BertForSequenceClassification", {"0": "bad", "1": "good"})
    paths = [pipeline(tmp_path, "type: llm, model: models/llama, max_tokens: 4, structured_output: {choice: [a, b]}",
                      "hf.yaml"),  # the constraint is checked with its grammar library, without torch too
             pipeline(tmp_path, "type: llm, model: models/falcon.gguf, max_tokens: 4", "gguf.yaml"),
             pipeline(tmp_path, "type: torch, model: models/classifier, task: text-classification", "torch.yaml")]
    code = ("import sys\nfrom sluice.cli import main\n"
            f"code = main(['validate', {', '.join(repr(str(p)) for p in paths)}])\n"
            "print(code, sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.stdout.splitlines()[-1] == "1 []", proc.stdout + proc.stderr  # the falcon refused; no torch
    assert "GGUF architecture 'falcon'" in proc.stderr


# ------------------------------------------------------------------------------------------- what is refused


@pytest.mark.parametrize(("config", "reason"), [
    ({"architectures": ["MambaForCausalLM"], "model_type": "mamba"}, "architecture 'MambaForCausalLM' is not supported"),
    ({"model_type": "falcon"}, "model_type 'falcon' is not supported"),
    ({"architectures": ["MyForCausalLM"], "auto_map": {"AutoModelForCausalLM": "modeling_my.MyForCausalLM"}},
     "never a model directory's code"),
    (dict(TINY_GEMMA2, hidden_activation="gelu_new"), "hidden_activation 'gelu_new' is not supported"),
    (dict(TINY_LLAMA, hidden_act="relu2"), "hidden_act 'relu2' is not supported"),
    (dict(TINY_LLAMA, architectures=["Qwen3ForSequenceClassification"], model_type="qwen3"),
     "'Qwen3ForSequenceClassification' is a task head, not a causal LM: the llm engine runs LlamaForCausalLM"),
    (dict(TINY_LLAMA, quantization_config={"quant_method": "awq", "bits": 4}), "(quant_method 'awq') is not supported"),
    (dict(TINY_LLAMA, architectures=["Qwen2ForCausalLM"], model_type="qwen2", layer_types=["linear_attention"]),
     "layer_types ['linear_attention'] are not supported"),
    (dict(TINY_LLAMA, rope_scaling={"rope_type": "mrope", "factor": 2.0}), "rope scaling 'mrope' is not supported"),
    (dict(TINY_LLAMA, num_key_value_heads=3), "must be a multiple of num_kv_heads"),
    ({k: v for k, v in TINY_LLAMA.items() if k != "num_attention_heads"},
     "config.json has no 'num_attention_heads', which a llama model needs"),
    (dict(TINY_GEMMA2, use_bidirectional_attention=True), "use an encoder engine"),
], ids=["architecture", "model-type", "custom-code", "activation", "llama-activation", "task-head", "prequantised",
        "layer-type", "rope-scaling", "shape", "missing-key", "bidirectional"])
def test_what_config_json_says_is_refused_in_one_line(tmp_path: Path, config: dict[str, Any], reason: str) -> None:
    hf_dir(tmp_path / "model", config)
    result = check(pipeline(tmp_path, "type: llm, model: model, max_tokens: 4"))
    assert result.unchecked is None and result.refusal is not None
    assert result.refusal.startswith("cannot load model 'model': ") and reason in result.refusal
    assert "\n" not in result.refusal


def test_what_a_gguf_header_says_is_refused(tmp_path: Path) -> None:
    gguf_file(tmp_path / "rope.gguf", "llama", **{"llama.rope.scaling.type": "longrope"})
    (tmp_path / "cut.gguf").write_bytes(gguf_file(tmp_path / "whole.gguf", "llama").read_bytes()[:200])
    rope = check(pipeline(tmp_path, "type: llm, model: rope.gguf, max_tokens: 4", "rope.yaml"))
    assert rope.refusal is not None and "rope scaling 'longrope' is not supported" in rope.refusal
    cut = check(pipeline(tmp_path, "type: llm, model: cut.gguf, max_tokens: 4", "cut.yaml"))
    assert cut.refusal is not None and "not a complete GGUF file" in cut.refusal


def test_a_directory_without_weights_or_config_is_refused(tmp_path: Path) -> None:
    (hf_dir(tmp_path / "no-weights", TINY_LLAMA) / "model.safetensors").unlink()
    (tmp_path / "empty").mkdir()
    no_weights = check(pipeline(tmp_path, "type: llm, model: no-weights, max_tokens: 4", "a.yaml"))
    assert no_weights.refusal is not None and "no *.safetensors files" in no_weights.refusal
    empty = check(pipeline(tmp_path, "type: llm, model: empty, max_tokens: 4", "b.yaml"))
    assert empty.refusal is not None and "neither a .gguf file nor a directory with config.json" in empty.refusal


@pytest.mark.parametrize("engine", ["onnx", "torch", "tensorrt"])
def test_a_task_model_whose_head_does_not_fit_is_refused(tmp_path: Path, engine: str) -> None:
    """The task's own start check (``require_head``); tensorrt's GPU check is not validate's to make."""
    classifier_dir(tmp_path / "encoder", "BertModel", None)
    classifier_dir(tmp_path / "unlabelled", "BertForSequenceClassification", None)
    classifier_dir(tmp_path / "classifier", "BertForSequenceClassification", {"0": "bad", "1": "good"})
    task = "task: text-classification"
    head = check(pipeline(tmp_path, f"type: {engine}, model: encoder, {task}", "a.yaml"))
    assert head.refusal is not None and "describes a BertModel" in head.refusal
    assert "*ForSequenceClassification" in head.refusal and not head.refusal.startswith(f"engine {engine}:")
    labels = check(pipeline(tmp_path, f"type: {engine}, model: unlabelled, {task}", "b.yaml"))
    assert labels.refusal is not None and "has no id2label" in labels.refusal
    assert check(pipeline(tmp_path, f"type: {engine}, model: classifier, {task}", "c.yaml")) == ModelCheck()
    # the same encoder suits the embedding task
    assert check(pipeline(tmp_path, f"type: {engine}, model: encoder", "d.yaml")) == ModelCheck()


def test_a_known_model_not_fetched_here_is_not_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "empty-cache"))
    result = check(pipeline(tmp_path, "type: llm, model: smollm2-135m, max_tokens: 4"))
    assert result.refusal is None and result.unchecked is not None
    assert "not fetched yet" in result.unchecked and "could not be checked here" in result.unchecked


def test_an_engine_without_a_model_file_is_not_checked(tmp_path: Path) -> None:
    assert check(pipeline(tmp_path, "type: python, function: examples.functions.text:shout")) == ModelCheck()
