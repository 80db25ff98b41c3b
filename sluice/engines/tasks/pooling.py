"""The pooler: token states -> one vector per text, as sentence-transformers' ``Pooling`` module computes it.

Modes (names as in ``pooling:``; sentence-transformers' own names in brackets):

* ``mean`` (mean) -- average of the attended tokens' states.
* ``cls`` (cls) -- the first attended token (BERT's [CLS]; BGE, GTE).
* ``max`` (max) -- element-wise maximum over attended tokens.
* ``last-token`` (lasttoken) -- the last attended token (decoder embedders such as Qwen3-Embedding).
* ``weighted-mean`` (weightedmean) -- tokens weighted by position 1, 2, 3... (SGPT).
* ``mean-sqrt-len`` (mean_sqrt_len_tokens) -- the sum divided by the square root of the token count.

Several modes concatenate, in the order given. The attention mask says which tokens count; a prompt that
``include_prompt: false`` leaves out is masked by the caller before pooling. Padding never counts, so a
text's vector does not depend on its batch-mates. Rows are right-padded (as the task collates them).

:func:`pool` is written once against :class:`sluice.engines.backends.arrays.ArrayOps`, so it runs on numpy
arrays (ONNX Runtime) or on torch tensors where the model put them (GPU), in float32 either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.engines.backends.arrays import ArrayOps
from sluice.engines.engine_contract import EngineStartError
from sluice.engines.tasks.model_config import read_json

POOLING_MODES = ("mean", "cls", "max", "last-token", "weighted-mean", "mean-sqrt-len")
# sentence-transformers' mode names -> ours
_ST_MODES = {"mean": "mean", "cls": "cls", "max": "max", "lasttoken": "last-token", "weightedmean": "weighted-mean",
             "mean_sqrt_len_tokens": "mean-sqrt-len"}
# Older configs: one boolean per mode; several true modes concatenate in this order.
_LEGACY_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
                "pooling_mode_mean_sqrt_len_tokens": "mean-sqrt-len",
                "pooling_mode_weightedmean_tokens": "weighted-mean", "pooling_mode_lasttoken": "last-token"}


@dataclass(frozen=True, slots=True)
class PoolingSpec:
    modes: tuple[str, ...] = ("mean",)  # from POOLING_MODES; concatenated in this order
    include_prompt: bool = True  # False: prompt tokens are masked out before pooling


def read_pooling_config(path: Path) -> PoolingSpec:
    """A sentence-transformers pooling ``config.json`` (new ``pooling_mode`` or legacy boolean keys)."""
    config = read_json(path)
    include_prompt = bool(config.get("include_prompt", True))
    given = config.get("pooling_mode")
    if given is not None:
        st_modes = [given] if isinstance(given, str) else list(given)
        unknown = [mode for mode in st_modes if mode not in _ST_MODES]
        if unknown or not st_modes:
            raise EngineStartError(f"{path}: unknown pooling_mode {unknown or given!r}; known: {sorted(_ST_MODES)}")
        return PoolingSpec(modes=tuple(_ST_MODES[mode] for mode in st_modes), include_prompt=include_prompt)
    modes = tuple(mode for key, mode in _LEGACY_KEYS.items() if config.get(key) is True)
    return PoolingSpec(modes=modes or ("mean",), include_prompt=include_prompt)


def pool(ops: ArrayOps, hidden: Any, mask: Any, modes: tuple[str, ...]) -> Any:
    """Pool ``hidden`` (batch, tokens, dim) over ``mask`` (batch, tokens; 1 = counts) -> (batch, dim * modes).

    float32, on the array library of ``ops`` (a numpy array or a device tensor).
    """
    xp = ops.xp
    hidden = ops.float32(hidden)  # (batch, tokens, dim)
    num_rows, num_tokens = hidden.shape[0], hidden.shape[1]
    weights = ops.float32(mask)[:, :, None]  # (batch, tokens, 1)
    rows = ops.arange(num_rows)  # (batch,)
    parts = []
    summed: Any = None  # shared by mean and mean-sqrt-len
    counts: Any = None
    for mode in modes:
        if mode == "cls":
            parts.append(hidden[rows, mask.argmax(axis=1)])  # first attended token; row 0 if none is
        elif mode == "last-token":
            positions = ops.arange(num_tokens) + 1  # (tokens,)
            last = xp.amax(mask * positions[None, :], axis=1) - 1  # (batch,); -1 when nothing is attended
            # Masked states, as sentence-transformers gathers them: a row with no attended token gives zeros.
            parts.append((hidden * weights)[rows, xp.clip(last, 0, None)])
        elif mode == "max":
            parts.append(xp.amax(xp.where(weights == 0, -math.inf, hidden), axis=1))
        elif mode in ("mean", "mean-sqrt-len"):
            if summed is None:
                summed = (hidden * weights).sum(axis=1)  # (batch, dim)
                counts = xp.clip(weights.sum(axis=1), 1e-9, None)  # (batch, 1); never divide by zero
            parts.append(summed / (counts if mode == "mean" else xp.sqrt(counts)))
        elif mode == "weighted-mean":
            positional = ops.float32(ops.arange(num_tokens) + 1)[None, :, None] * weights  # (batch, tokens, 1)
            parts.append((hidden * positional).sum(axis=1) / xp.clip(positional.sum(axis=1), 1e-9, None))
        else:
            raise ValueError(f"unknown pooling mode {mode!r}; expected one of {list(POOLING_MODES)}")
    return parts[0] if len(parts) == 1 else xp.concatenate(parts, axis=1)
