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
"""

from sluice.engines.llm.config import EngineConfig, ModelConfig
from sluice.engines.llm.engine import LLM, EngineStats, RequestOutput
from sluice.engines.llm.request import RequestStatus, SamplingParams
from sluice.engines.llm.structured import GrammarError, StructuredOutput

__all__ = ["LLM", "EngineConfig", "EngineStats", "GrammarError", "ModelConfig", "RequestOutput", "RequestStatus",
           "SamplingParams", "StructuredOutput"]
