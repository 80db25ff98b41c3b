"""Device helpers shared by the engines that run on torch tensors (``torch`` and ``tensorrt``).

* :func:`resolve_device` -- ``auto | cpu | cuda | cuda:N`` -> a ``torch.device``; one-line errors.
* :func:`resolve_dtype` -- the compute dtype; half types fall back to float32 on a CPU (with a warning),
  so one pipeline file runs on a GPU machine and on a laptop alike.
* :class:`HostStaging` -- pinned host buffers reused batch after batch, so host->device copies are
  asynchronous (``non_blocking``) and no page-locked memory is allocated per batch.
* :func:`mean_pool` -- the text-embedding pooling of :mod:`sluice.engines.text_embedding`, on the device.

torch is passed in or imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from sluice.engines.engine_contract import EngineStartError

log = logging.getLogger("sluice.engines.torch.torch_engine")

DTYPE_NAMES = ("float32", "float16", "bfloat16")


def resolve_device(torch: Any, name: str, engine: str) -> Any:
    """``auto``: the first CUDA device when one is visible, else the CPU. Pinned names must be usable."""
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise EngineStartError(f"engine {engine}: device {name!r} asked for, but no CUDA GPU is visible "
                               "(torch.cuda.is_available() is False); use device: auto or cpu")
    device = torch.device(name)
    index = 0 if device.index is None else device.index
    count = torch.cuda.device_count()
    if index >= count:
        raise EngineStartError(f"engine {engine}: device {name!r} asked for, but only {count} CUDA "
                               f"device(s) are visible (cuda:0..cuda:{count - 1})")
    return torch.device("cuda", index)


def resolve_dtype(torch: Any, name: str, device: Any, engine: str) -> Any:
    """The compute dtype. float16/bfloat16 on a CPU: a warning and float32 (CPU half kernels are slow)."""
    if name not in DTYPE_NAMES:
        raise EngineStartError(f"engine {engine}: unknown dtype {name!r}; expected one of {list(DTYPE_NAMES)}")
    if name != "float32" and device.type != "cuda":
        log.warning("engine %s: dtype %s is for CUDA devices; running float32 on %s", engine, name, device)
        return torch.float32
    return getattr(torch, name)


class HostStaging:
    """Host->device copies through pinned buffers, one per input name, grown on demand and reused.

    Safe to reuse because the engine reads its outputs back to the host (which waits for the stream)
    before the next batch is staged: a buffer is never overwritten while its copy is still in flight.
    On a CPU device it simply wraps the numpy array (no copy).
    """

    def __init__(self, torch: Any, device: Any) -> None:
        self._torch = torch
        self._device = device
        self._pinned = device.type == "cuda"
        self._buffers: dict[str, Any] = {}  # name -> flat pinned tensor

    def to_device(self, name: str, array: np.ndarray, dtype: Any = None) -> Any:
        """``array`` as a tensor on the device (``dtype``: cast there, after the copy)."""
        torch = self._torch
        host = torch.from_numpy(np.ascontiguousarray(array))
        if not self._pinned:
            return host if dtype is None else host.to(dtype)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != host.dtype or buffer.numel() < host.numel():
            buffer = torch.empty(max(host.numel(), 1), dtype=host.dtype).pin_memory()
            self._buffers[name] = buffer
        staged = buffer[: host.numel()].view(host.shape)
        staged.copy_(host)
        on_device = staged.to(self._device, non_blocking=True)
        return on_device if dtype is None else on_device.to(dtype)


def mean_pool(torch: Any, hidden: Any, attention_mask: Any) -> np.ndarray:
    """Mean of the attended tokens' states, in float32: (batch, tokens, dim), (batch, tokens) -> (batch, dim).

    The same arithmetic as :func:`sluice.engines.text_embedding.mean_pool`, run where the tensors are.
    """
    hidden = hidden.float()
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (batch, tokens, 1)
    summed = (hidden * mask).sum(dim=1)  # (batch, dim)
    counts = mask.sum(dim=1).clamp_min(1e-9)  # (batch, 1)
    pooled: np.ndarray = (summed / counts).cpu().numpy()
    return pooled.astype(np.float32, copy=False)
