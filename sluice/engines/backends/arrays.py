"""Array operations on what a backend returns: numpy arrays (ONNX Runtime) or torch tensors (torch, TensorRT).

Tasks compute on model outputs through an :class:`ArrayOps` so that one implementation (the pooler, say)
runs where the outputs are: numpy on the host, torch on the GPU. Only the small result is copied back.

The operations are the ones numpy and torch spell alike (``x.sum(axis=1, keepdims=True)``,
``xp.amax``, ``xp.where``, ``xp.clip``, ``x.argmax(axis=1)``, slicing and integer indexing); the few that
differ (creating arrays on the device, casting, copying to the host) are methods here.

torch is passed in; nothing here imports it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ArrayOps:
    """numpy on the host: what ONNX Runtime returns. The base for other array libraries."""

    xp: Any = np  # the array namespace: ``xp.amax``, ``xp.where``, ``xp.clip``, ``xp.sqrt``

    def to_host(self, array: Any) -> np.ndarray:
        """A host numpy array; floating arrays become float32."""
        host = np.asarray(array)
        return host.astype(np.float32, copy=False) if host.dtype.kind == "f" else host

    def from_host(self, name: str, array: np.ndarray) -> Any:
        """``array`` where the outputs are. ``name`` keys a reusable staging buffer (distinct per use)."""
        return array

    def arange(self, num: int) -> Any:
        """``0 .. num - 1`` as int64 where the outputs are."""
        return np.arange(num, dtype=np.int64)

    def float32(self, array: Any) -> Any:
        """``array`` as float32 where it is (half-precision outputs are reduced in float32)."""
        return array.astype(np.float32, copy=False)


NUMPY_OPS = ArrayOps()


class TorchOps(ArrayOps):
    """torch tensors on ``device``; host copies go through pinned staging buffers on CUDA."""

    def __init__(self, torch: Any, device: Any, staging: Any) -> None:
        self.xp = torch
        self._torch = torch
        self._device = device
        self._staging = staging  # sluice.engines.torch.placement.HostStaging

    def to_host(self, array: Any) -> np.ndarray:
        if not isinstance(array, self._torch.Tensor):
            return super().to_host(array)
        if array.is_floating_point():
            array = array.float()
        host: np.ndarray = array.detach().cpu().numpy()  # waits for the device
        return host

    def from_host(self, name: str, array: np.ndarray) -> Any:
        return self._staging.to_device(name, array)

    def arange(self, num: int) -> Any:
        return self._torch.arange(num, dtype=self._torch.int64, device=self._device)

    def float32(self, array: Any) -> Any:
        return array.float()
