"""Is there room for a second engine? Checked before a reload builds one beside the serving engine.

During a reload both engines are loaded at once, so the process needs about one more model's memory where
the model lives: host RAM for a CPU model, device memory (and the host RAM its loading passes through)
for a CUDA one. Before building, the reloader compares an estimate of the new engine's needs with what is
free, and refuses (the serving engine stays) when it does not fit.

* **The estimate** is the larger of the new model's size on disk (plus 10%) and the footprint measured when
  the serving engine started: resident memory (RSS) grown across its start and, for engines on CUDA
  through torch (torch, tensorrt, llm), device memory torch reserved. The first engine's footprint also
  holds the libraries its start imported (torch, onnxruntime: a few hundred MB), so the first reload's
  estimate errs on the safe side; each reload measures its own start, and the next reload uses that.
* **Free memory** on the host is the smaller of the kernel's ``MemAvailable`` and, in a container, the
  cgroup's limit less its working set (usage less inactive file cache: what the kernel cannot just drop).
  On a CUDA device it is ``torch.cuda.mem_get_info``. What cannot be read is not checked (and logged).

``engine.reload.check_memory: false`` turns the check off (for a model whose weights are mapped from disk
and shared, say, where the estimate is far too high).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)

R = TypeVar("R")

_MARGIN = 1.1  # the new model's size on disk, plus what loading it around the weights takes
_CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True, slots=True)
class Footprint:
    """Memory one engine took when it started."""

    host_bytes: int = 0  # resident memory grown across its start
    device_bytes: int = 0  # device memory torch reserved across its start (0: none, or not through torch)


def measure_start(start: Callable[[], R]) -> tuple[R, Footprint]:
    """``start()``, and the memory the process took meanwhile (other threads' allocations count too)."""
    host, device = _rss_bytes(), _torch_reserved_bytes()
    result = start()
    return result, Footprint(host_bytes=max(0, _rss_bytes() - host),
                             device_bytes=max(0, _torch_reserved_bytes() - device))


def room_for(device: str, model_bytes: int, serving: Footprint) -> str | None:
    """None when a second engine like ``serving``, for a model of ``model_bytes`` on disk, fits on
    ``device`` (``cpu`` or ``cuda:N``) beside the serving one; else why not, in one line."""
    on_cuda = device.startswith("cuda")
    need_host = serving.host_bytes if on_cuda else max(serving.host_bytes, int(model_bytes * _MARGIN))
    free_host = available_host_bytes()
    if free_host is None:
        log.info("cannot read the free host memory here: building the new engine unchecked")
    elif need_host > free_host:
        return (f"not enough host memory for a second engine: it needs about {_gib(need_host)} (the model is "
                f"{_gib(model_bytes)} on disk; the serving engine took {_gib(serving.host_bytes)}), "
                f"{_gib(free_host)} is free; free memory, or restart with the new model instead "
                "(engine.reload.check_memory: false skips this check)")
    if not on_cuda:
        return None
    need_device = max(serving.device_bytes, int(model_bytes * _MARGIN))
    free_device = available_device_bytes(device)
    if free_device is None:
        log.info("cannot read the free memory of %s here: building the new engine unchecked", device)
    elif need_device > free_device:
        return (f"not enough memory on {device} for a second engine: it needs about {_gib(need_device)} (the "
                f"serving engine took {_gib(serving.device_bytes)}), {_gib(free_device)} is free; an llm engine "
                "sizes its KV cache from the free memory unless engine.kv_cache_memory_mb is set")
    return None


def available_host_bytes() -> int | None:
    """What the process may still allocate: ``MemAvailable``, capped by its cgroup's room (None: unknown)."""
    found = [n for n in (_meminfo_available(), _cgroup_room()) if n is not None]
    return min(found) if found else None


def available_device_bytes(device: str) -> int | None:
    """Free memory on a CUDA device, through torch (None when torch or the device is not there)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    except Exception as err:  # no torch, a driver refusing: the check is skipped, the reason logged
        log.debug("no device memory figure for %s: %s", device, err)
        return None


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _torch_reserved_bytes() -> int:
    torch = sys.modules.get("torch")  # never imported here: a process without torch has none reserved
    try:
        if torch is None or not torch.cuda.is_initialized():
            return 0
        return sum(int(torch.cuda.memory_reserved(i)) for i in range(torch.cuda.device_count()))
    except Exception:
        return 0


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _cgroup_room() -> int | None:
    """The cgroup's limit less its working set (v2, then v1); None without a limit."""
    v2 = (_read_int(_CGROUP / "memory.max"), _read_int(_CGROUP / "memory.current"),
          _stat_field(_CGROUP / "memory.stat", "inactive_file"))
    v1_dir = _CGROUP / "memory"
    v1 = (_read_int(v1_dir / "memory.limit_in_bytes"), _read_int(v1_dir / "memory.usage_in_bytes"),
          _stat_field(v1_dir / "memory.stat", "total_inactive_file"))
    for limit, usage, inactive in (v2, v1):
        if limit is not None and usage is not None and limit < 1 << 60:  # v1 writes "no limit" as ~2^63
            return max(0, limit - (usage - (inactive or 0)))
    return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):  # missing, or "max" (no limit)
        return None


def _stat_field(path: Path, name: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / (1 << 30):.2f} GiB"
