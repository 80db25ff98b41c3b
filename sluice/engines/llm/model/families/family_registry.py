"""The model families Sluice runs, and how a checkpoint picks one.

A HF directory is matched by ``config.json``'s ``architectures`` (first entry), then its ``model_type``; a
GGUF file by ``general.architecture``. Anything else is refused at start with one line naming what is
supported (and by ``sluice validate``, which reads the checkpoint's config through ``checkpoint.py`` too).
Adding a family is one module in this package plus one line in ``FAMILIES`` (and, for a block of a new
shape, its layer in ``model/layers/decoder.py``). Imports no torch.
"""

from __future__ import annotations

from typing import Any

from sluice.engines.llm.model.families import (
    gemma2,
    gemma3,
    gpt_oss,
    granite,
    llama,
    mistral,
    mixtral,
    olmo2,
    phi3,
    qwen2,
    qwen3,
    qwen3_moe,
    smollm3,
)
from sluice.engines.llm.model.families.common import ModelFamily

FAMILIES: tuple[ModelFamily, ...] = (
    llama.FAMILY,
    mistral.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    gemma2.FAMILY,
    gemma3.FAMILY,
    phi3.FAMILY,
    granite.FAMILY,
    smollm3.FAMILY,
    olmo2.FAMILY,
    qwen3_moe.FAMILY,
    mixtral.FAMILY,
    gpt_oss.FAMILY,
)


def supported_hf() -> str:
    return ", ".join(a for f in FAMILIES for a in f.hf_architectures)


def supported_gguf() -> str:
    return ", ".join(a for f in FAMILIES for a in f.gguf_architectures)


def family_named(name: str) -> ModelFamily:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise ValueError(f"unknown model family {name!r} (known: {', '.join(f.name for f in FAMILIES)})")


# heads of an encoder-style task on a decoder body: the llm engine generates text, these do not
_TASK_HEADS = {"ForSequenceClassification": "text-classification", "ForTokenClassification": "token-classification",
               "ForQuestionAnswering": None}  # fmt: skip


def family_for_hf(cfg: dict[str, Any]) -> ModelFamily:
    """The family of a HF ``config.json``: by architecture, else by model_type; ValueError if neither, or if
    the architecture is a task head (``Qwen3ForSequenceClassification``) on a supported body."""
    archs = cfg.get("architectures") or []
    for family in FAMILIES:
        if archs and archs[0] in family.hf_architectures:
            return family
    for head, task in _TASK_HEADS.items():
        if archs and archs[0].endswith(head):
            instead = (f"; run it with engine onnx or torch and task: {task}" if task
                       else "; no Sluice task runs this head")  # fmt: skip
            raise ValueError(f"architecture {archs[0]!r} is a task head, not a causal LM: the llm engine runs "
                             f"{supported_hf()}{instead}")  # fmt: skip
    model_type = cfg.get("model_type")
    for family in FAMILIES:
        if model_type in family.hf_model_types:
            return family
    what = f"architecture {archs[0]!r}" if archs else f"model_type {model_type!r}"
    custom = (" (the llm engine runs its own implementation of each family, never a model directory's code)"
              if cfg.get("auto_map") else "")
    raise ValueError(f"{what} is not supported{custom}; supported architectures: {supported_hf()}")


def family_for_gguf(architecture: str) -> ModelFamily:
    for family in FAMILIES:
        if architecture in family.gguf_architectures and family.config_from_gguf is not None:
            return family
    raise ValueError(f"GGUF architecture {architecture!r} is not supported; supported: {supported_gguf()}")
