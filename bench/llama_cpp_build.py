"""llama.cpp's ``llama-server`` and ``llama-quantize``, built once from the sources vendored in the
``llama-cpp-python`` sdist, and its own HF -> GGUF converter: the peer of ``bench/llm_peers.py``.

The build lives outside the repository, in the model cache's tools folder
(``<cache>/tools/llama.cpp-server-<version>/``, ``$SLUICE_CACHE_DIR`` or the user cache dir), so it survives
checkouts and is never committed; a marker file written last makes it idempotent. It takes 5-8 minutes on
two cores. ``GGML_NATIVE=ON`` tunes it for this CPU, as a user building llama.cpp would; the AMX kernels are
switched off because on the machines seen here the native build died with an illegal instruction in the
AMX Q4_1 kernel.

    .venv/bin/python bench/llama_cpp_build.py        # build (or say where the cached build is)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"
_ROOT = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
_MARKER = ".sluice-ready"
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
TARGETS = ("llama-server", "llama-quantize")


def cache_root() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from sluice.model_store.download import default_cache_dir

    return default_cache_dir() / "tools" / f"llama.cpp-server-{VERSION}"


def _fetch_sources(target: Path) -> Path:
    """``target/src``: the vendored llama.cpp tree of the sdist (downloaded with pip once)."""
    src = target / "src"
    if (src / "CMakeLists.txt").is_file():
        return src
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
               f"llama-cpp-python=={VERSION}", "-d", tmp]  # fmt: skip
        subprocess.run(cmd, check=True, timeout=900)
        sdist = next(Path(tmp).glob("*.tar.gz"))
        staging = Path(tmp) / "src"
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                if member.name.startswith(_ROOT) and (member.isfile() or member.isdir()):
                    member.name = member.name.removeprefix(_ROOT) or "."
                    tar.extract(member, staging, filter="data")
        staging.rename(src)
    return src


def ensure_built(jobs: int = 2) -> Path:
    """The folder holding ``bin/llama-server`` and ``bin/llama-quantize`` (built on first call) and ``src/``
    (``convert_hf_to_gguf.py`` and its ``gguf-py``)."""
    target = cache_root()
    if (target / _MARKER).is_file():
        return target
    src = _fetch_sources(target)
    build = target / "build"
    flags = f"-DCMAKE_C_FLAGS={_NO_AMX}", f"-DCMAKE_CXX_FLAGS={_NO_AMX}"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Release",
                    "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DBUILD_SHARED_LIBS=OFF", *flags], check=True)  # fmt: skip
    subprocess.run(["cmake", "--build", str(build), "-j", str(jobs), "--target", *TARGETS], check=True)
    bin_dir = target / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in TARGETS:
        shutil.copy2(build / "bin" / name, bin_dir / name)
    (target / _MARKER).write_text(f"llama-cpp-python=={VERSION} GGML_NATIVE=ON {_NO_AMX}\n")
    return target


if __name__ == "__main__":
    where = ensure_built(int(os.environ.get("JOBS", "2")))
    print(f"llama.cpp tools in {where}")
