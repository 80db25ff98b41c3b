"""What the classification tasks share: the model's labels, its head, and score functions.

* :func:`require_head` -- a start-up error unless ``config.json`` describes a model with the head the task
  needs (``...ForSequenceClassification`` / ``...ForTokenClassification``) and its labels.
* :func:`softmax`, :func:`sigmoid` -- row-wise, in float32, as the transformers pipelines compute them;
  :func:`ranked` -- the best labels of a row, as they rank them.
* :func:`logits_output` -- the model output holding the logits.
"""

from __future__ import annotations

import numpy as np

from sluice.engines.backends.backend_contract import ModelClass, ModelIO
from sluice.engines.engine_contract import EngineStartError
from sluice.engines.tasks.model_config import ModelConfig


def require_architecture(config: ModelConfig, model_class: ModelClass, task: str) -> None:
    """EngineStartError when ``config.json``'s ``architectures`` name a model without the task's head."""
    suffix = model_class.architecture_suffix
    if config.architectures and not any(a.endswith(suffix) for a in config.architectures):
        raise EngineStartError(f"task {task}: {config.path} describes a {', '.join(config.architectures)}; "
                               f"the task needs a *{suffix} model (a {model_class.value} head)")


def require_head(config: ModelConfig, model_class: ModelClass, task: str) -> dict[int, str]:
    """The model's labels (``id2label``); EngineStartError when the config does not fit ``task``."""
    if not config.exists:
        raise EngineStartError(f"task {task}: no config.json in {config.path.parent}; the task reads the labels "
                               "(id2label) from it")
    require_architecture(config, model_class, task)
    if config.id2label is None:
        raise EngineStartError(f"task {task}: {config.path} has no id2label; save the model with its labels "
                               "(config.id2label = {0: 'NEGATIVE', 1: 'POSITIVE', ...})")
    missing = [i for i in range(config.num_labels) if i not in config.id2label]
    if missing:
        raise EngineStartError(f"task {task}: {config.path}: id2label has no label for index {missing[0]}")
    return config.id2label


def logits_output(io: ModelIO, model_name: str, task: str) -> str:
    """``logits`` when the model has it, else its only output; EngineStartError otherwise."""
    outputs = io.output_names
    if "logits" in outputs:
        return "logits"
    if len(outputs) == 1:
        return outputs[0]
    raise EngineStartError(f"model {model_name} has outputs {outputs}; task {task} reads 'logits'")


def check_num_labels(io: ModelIO, output: str, num_labels: int, model_name: str) -> None:
    """When the model declares its logits' label axis, it must match config.json's labels."""
    (spec,) = [s for s in io.outputs if s.name == output]
    size = spec.shape[-1] if spec.shape else None
    if size is not None and size != num_labels:
        raise EngineStartError(f"model {model_name} gives {size} scores per row; its config.json has "
                               f"{num_labels} labels (id2label)")


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax over the last axis, shifted by the row maximum (no overflow)."""
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32, copy=False)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32, copy=False)


def ranked(labels: dict[int, str], scores: np.ndarray, top_k: int) -> list[dict[str, object]]:
    """The ``top_k`` best ``{"label", "score"}`` of one row of scores, best first; equal scores keep label order
    (a stable sort, as transformers' pipelines)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_k]
    return [{"label": labels[i], "score": float(scores[i])} for i in order]
