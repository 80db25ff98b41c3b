"""What a build of the native CPU kernels depends on: its sources, flags and the key that names it.

The key covers everything that changes the compiled module -- the sources (headers included), torch's version
and C++ ABI, Python's extension ABI, the compiler's identity, the flags, the CPU's feature flags -- and
nothing else: not the environment's path, so two virtual environments with the same Python and torch share
one build (``native_build.py``), and a new torch or another CPU gets its own.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
import sys
import sysconfig
from pathlib import Path

SOURCE_DIR = Path(__file__).with_name("native")
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno")
LDFLAGS = ("-fopenmp",)


def sources() -> list[Path]:
    """Every file of the kernels (the headers too: they are part of the key)."""
    return sorted(p for p in SOURCE_DIR.iterdir() if p.suffix in (".cpp", ".h"))


def build_key() -> str:
    """A digest of everything that changes the compiled module (see the module docstring)."""
    import torch

    digest = hashlib.sha256()
    for source in sources():
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    for part in (torch.__version__, str(torch.version.git_version), str(torch._C._GLIBCXX_USE_CXX11_ABI),
                 str(getattr(torch._C, "_PYBIND11_BUILD_ABI", "")), sys.implementation.cache_tag,
                 str(sysconfig.get_config_var("EXT_SUFFIX")), compiler_identity(), " ".join(CFLAGS + LDFLAGS),
                 cpu_identity()):  # fmt: skip
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def compiler_identity() -> str:
    """The first line of ``$CXX --version`` (torch's extension builder uses ``$CXX``, else ``c++``)."""
    compiler = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return f"{compiler}: not found"
    return (out.stdout.splitlines() or [f"{compiler}: no version"])[0]


def cpu_identity() -> str:
    """What ``-march=native`` compiles for: the CPU's feature flags."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()
