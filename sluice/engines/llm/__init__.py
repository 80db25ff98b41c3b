"""Sluice's own LLM engine: paged KV cache, continuous batching, prefix caching, chunked prefill.

Usage::

    from sluice.engines.llm import LLM, SamplingParams

    llm = LLM("smollm2-135m")                      # or a .gguf file / HF safetensors directory
    prompt = llm.apply_chat_template([{"role": "user", "content": "Label: great phone"}])
    [out] = llm.generate([prompt], SamplingParams(max_tokens=16))
    print(out.text, out.finish_reason)

    # constrained decoding: the answer can only be one of the labels (or match a JSON Schema, a regex)
    label = StructuredOutput(choice=["positive", "negative", "neutral"])
    [out] = llm.generate([prompt], SamplingParams(max_tokens=8, structured_output=label))

The names below are imported when first used, so importing a torch-free part of this package (its options,
``checkpoint.py``, the family registry: what ``sluice validate`` reads) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sluice.engines.llm.config import EngineConfig, ModelConfig

if TYPE_CHECKING:
    from sluice.engines.llm.core.output import RequestOutput
    from sluice.engines.llm.core.request import RequestStatus, SamplingParams
    from sluice.engines.llm.llm_engine import LLM, EngineStats
    from sluice.engines.llm.structured import GrammarError, StructuredOutput

_LAZY = {"LLM": "llm_engine", "EngineStats": "llm_engine", "RequestOutput": "core.output",
         "RequestStatus": "core.request", "SamplingParams": "core.request", "GrammarError": "structured",
         "StructuredOutput": "structured"}

__all__ = ["LLM", "EngineConfig", "EngineStats", "GrammarError", "ModelConfig", "RequestOutput", "RequestStatus",
           "SamplingParams", "StructuredOutput"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
