"""A sentence-transformers model directory, read without sentence-transformers or torch.

``modules.json`` lists the model's modules in order. Supported: the ``Transformer`` (first; its files at
the directory root or in a subfolder such as ``0_Transformer/``), one ``Pooling`` (its ``config.json``),
then any ``Dense`` and ``Normalize`` modules, applied in order to the pooled vector. Any other module is a
start-up error naming it: an embedding computed without it would be silently wrong.

``config_sentence_transformers.json`` gives the named prompts and the default prompt;
``sentence_bert_config.json`` the truncation length and lowercasing. A plain HF directory without
``modules.json`` reads as sentence-transformers reads it: mean pooling, no Dense, no Normalize.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sluice.engines.engine_contract import EngineStartError, first_line
from sluice.engines.tasks.model_config import read_json
from sluice.engines.tasks.pooling import PoolingSpec, read_pooling_config

_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Identity": lambda x: x,
    "Tanh": np.tanh,
    "ReLU": lambda x: np.maximum(x, 0),
    "Sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "GELU": lambda x: 0.5 * x * (1 + np.vectorize(math.erf, otypes=[np.float32])(x / math.sqrt(2))),
}


@dataclass(frozen=True, slots=True)
class Dense:
    """sentence-transformers' Dense module: ``activation(x @ weight.T + bias)`` (+ a residual)."""

    weight: np.ndarray  # (out_features, in_features) float32
    bias: np.ndarray | None  # (out_features,)
    activation: str
    residual: np.ndarray | None  # (out_features, in_features) projection, or None; identity when square
    use_residual: bool

    def __call__(self, x: np.ndarray) -> np.ndarray:  # (batch, in) -> (batch, out)
        out = x @ self.weight.T
        if self.bias is not None:
            out = out + self.bias
        out = _ACTIVATIONS[self.activation](out)
        if self.use_residual:
            out = out + (x if self.residual is None else x @ self.residual.T)
        return out.astype(np.float32, copy=False)


@dataclass(frozen=True, slots=True)
class SentenceModel:
    """What sentence-transformers would run after the transformer, and how it prepares texts."""

    transformer_dir: Path  # config.json, weights and tokenizer of the transformer
    pooling: PoolingSpec
    steps: tuple[Dense | str, ...]  # in order after pooling: Dense modules, and "normalize"
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    max_seq_length: int | None = None
    do_lower_case: bool = False
    has_modules: bool = False  # modules.json present

    @property
    def normalizes(self) -> bool:
        return "normalize" in self.steps


def transformer_dir(directory: Path) -> Path:
    """Where the transformer of the model in ``directory`` is (its first module's folder)."""
    return read_sentence_model(directory).transformer_dir


def read_sentence_model(directory: Path) -> SentenceModel:
    """Read ``directory``; EngineStartError (one line) for modules this task cannot run."""
    modules_path = directory / "modules.json"
    transformer_dir, pooling = directory, PoolingSpec()
    steps: list[Dense | str] = []
    if modules_path.is_file():
        try:
            modules = json.loads(modules_path.read_text(encoding="utf-8"))
            modules = sorted(modules, key=lambda m: int(m.get("idx", 0)))
        except (OSError, ValueError, TypeError, AttributeError) as err:
            raise EngineStartError(f"cannot read {modules_path}: {first_line(err)}") from None
        for index, module in enumerate(modules):
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            path = directory / str(module.get("path", ""))
            if kind == "Transformer" and index == 0:
                transformer_dir = path
            elif kind == "Pooling" and index == 1:
                pooling = read_pooling_config(path / "config.json")
            elif kind == "Dense" and index >= 2:
                steps.append(_read_dense(path))
            elif kind == "Normalize" and index >= 2:
                steps.append("normalize")
            else:
                raise EngineStartError(f"{modules_path}: module {index} is {module.get('type')!r}; the "
                                       "text-embedding task runs Transformer, Pooling, then Dense/Normalize modules")
    st_config = read_json(directory / "config_sentence_transformers.json")
    bert_config = read_json(transformer_dir / "sentence_bert_config.json") or read_json(
        directory / "sentence_bert_config.json")
    prompts = st_config.get("prompts") or {}
    max_seq_length = bert_config.get("max_seq_length")
    return SentenceModel(transformer_dir=transformer_dir, pooling=pooling, steps=tuple(steps),
                         prompts={str(k): str(v) for k, v in prompts.items()} if isinstance(prompts, dict) else {},
                         default_prompt_name=st_config.get("default_prompt_name") or None,
                         max_seq_length=max_seq_length if isinstance(max_seq_length, int) else None,
                         do_lower_case=bool(bert_config.get("do_lower_case", False)),
                         has_modules=modules_path.is_file())


def _read_dense(path: Path) -> Dense:
    config = read_json(path / "config.json")
    activation = str(config.get("activation_function") or "Identity").rsplit(".", 1)[-1]
    if activation not in _ACTIVATIONS:
        raise EngineStartError(f"{path}: Dense activation {config.get('activation_function')!r} is not "
                               f"supported; supported: {sorted(_ACTIVATIONS)}")
    weights = _load_weights(path)
    weight = weights.get("linear.weight")
    if weight is None:
        raise EngineStartError(f"{path}: the Dense weights have no linear.weight (found {sorted(weights)})")
    bias = weights.get("linear.bias") if config.get("bias", True) else None
    return Dense(weight=weight, bias=bias, activation=activation, residual=weights.get("residual.weight"),
                 use_residual=bool(config.get("use_residual", False)))


def _load_weights(path: Path) -> dict[str, np.ndarray]:
    safetensors_file, torch_file = path / "model.safetensors", path / "pytorch_model.bin"
    if safetensors_file.is_file():
        numpy_loader = _require("safetensors.numpy", f"{path} holds Dense weights; reading them needs the "
                                                     "'safetensors' package (pip install 'sluice[onnx]')")
        try:
            return {k: v.astype(np.float32) for k, v in numpy_loader.load_file(str(safetensors_file)).items()}
        except Exception as err:  # safetensors raises its own error types
            raise EngineStartError(f"cannot read {safetensors_file}: {first_line(err)}") from None
    if torch_file.is_file():
        torch = _require("torch", f"{torch_file} is a torch pickle; install torch to read it, or save the model "
                                  "again with safetensors")
        state: Any = torch.load(str(torch_file), map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}
    raise EngineStartError(f"{path}: a Dense module without model.safetensors or pytorch_model.bin")


def _require(module: str, message: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise EngineStartError(message) from None
