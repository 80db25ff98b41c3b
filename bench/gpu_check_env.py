"""GPU check step: what ran where -- the device, the library versions, the device-copy bandwidth.

    python bench/gpu_check_env.py --out rows.json [--device cuda] [--profile full]

The bandwidth row is the ceiling the LLM step's memory floor is measured against (that step measures it
again in its own process, next to its timings).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys

from gpu_check_common import Rows, child_args, copy_bandwidth_bytes_per_s

DISTRIBUTIONS = ("torch", "triton", "transformers", "tokenizers", "safetensors", "sentence-transformers", "onnx",
                 "onnxruntime", "onnxruntime-gpu", "tensorrt", "numpy", "pydantic")


def versions() -> dict[str, str]:
    found = {}
    for dist in DISTRIBUTIONS:
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            found[dist] = "-"
    return found


def main() -> None:
    args = child_args(__doc__.splitlines()[0])
    import torch

    rows = Rows(args.out, {"device": "device", "versions": "versions", "copy bandwidth": "bandwidth"})
    with rows.attempt("device"):
        cuda = args.device.startswith("cuda")
        props = torch.cuda.get_device_properties(0) if cuda else None
        rows.measured("device", "device", device=torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
                      memory_gib=round(props.total_memory / 2**30, 1) if props else None,
                      multiprocessors=props.multi_processor_count if props else None,
                      cuda=torch.version.cuda, cpus=os.cpu_count(), python=sys.version.split()[0],
                      machine=platform.platform())
    with rows.attempt("versions"):
        rows.measured("versions", "versions", **versions())
    with rows.attempt("copy bandwidth"):
        num_bytes = (4 << 30) if cuda else (128 << 20)
        rate = copy_bandwidth_bytes_per_s(torch, args.device, num_bytes)
        rows.measured("copy bandwidth", "bandwidth", buffer_gib=round(num_bytes / 2**30, 3),
                      gb_per_s=round(rate / 1e9, 1), counts="bytes read + bytes written")


if __name__ == "__main__":
    main()
