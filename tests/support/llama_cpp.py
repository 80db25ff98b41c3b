"""llama.cpp's own HF -> GGUF converter, fetched from the package index once and cached, for GGUF tests.

The converter (``convert_hf_to_gguf.py``, its ``conversion/`` package and its ``gguf-py``) is vendored in the
``llama-cpp-python`` source distribution. :func:`converter_dir` downloads that sdist once into the model
cache's ``tools/`` (:mod:`tests.support.pip_files`), extracts only the converter's files, and returns their
directory. :func:`convert` runs it
on a HF directory in a child process (it needs ``torch``, ``transformers``, ``numpy``, ``sentencepiece``).

Using the independent writer matters: a GGUF written by our own code would only test the loader against
itself (tensor names, the Q/K permutation, Gemma's norm offset and the metadata keys are llama.cpp's).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.support.pip_files import cached_package_files

PACKAGE, VERSION = "llama-cpp-python", "0.3.36"
_ROOT = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
_MEMBERS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def converter_dir(cache_dir: Path | None = None) -> Path:
    """Directory holding ``convert_hf_to_gguf.py`` (fetched on first use; atomic, so never half-written)."""

    def extract(sdist: Path, staging: Path) -> None:
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                rel = member.name.removeprefix(_ROOT)
                if member.name.startswith(_ROOT) and rel.startswith(_MEMBERS) and (member.isfile() or member.isdir()):
                    member.name = rel
                    tar.extract(member, staging, filter="data")

    return cached_package_files(f"llama.cpp-converter-{VERSION}", f"{PACKAGE}=={VERSION}", extract, source=True,
                                cache_dir=cache_dir)  # fmt: skip


# Runs the converter once per job in one child process: torch, transformers and the converter's modules are
# imported once, not once per model (seconds each on a 2-core runner).
#
# The converter writes some families' vocabularies only as byte-level BPE with a pre-tokenizer it knows by the
# hash of its output (OLMo 2); the tiny models' SentencePiece tokenizers are none of those, so an unknown one is
# written as llama.cpp's "default" split. Only that label changes: tensors and metadata are the converter's.
_DRIVER = """
import runpy, sys
sys.path.insert(0, TOOL)
from conversion import base
_known_pre = base.TextModel.get_vocab_base_pre
def _pre_or_default(self, tokenizer):
    try:
        return _known_pre(self, tokenizer)
    except NotImplementedError:
        return "default"
base.TextModel.get_vocab_base_pre = _pre_or_default
for args in sys.argv[1:]:
    sys.argv = ["convert_hf_to_gguf.py", *args.split("\\x1f")]
    runpy.run_path(SCRIPT, run_name="__main__")
"""


def convert_many(jobs: list[tuple[Path, Path, bool]]) -> None:
    """Convert each ``(hf_dir, out_file, vocab_only)`` to an f32 GGUF with llama.cpp's converter.

    RuntimeError with the converter's output if one fails or writes nothing.
    """
    tool = converter_dir()
    # its own gguf-py, not the installed one; and its conversion/ package, found from the script's dir
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tool / "gguf-py"), str(tool)])}
    args = []
    for hf_dir, out_file, vocab_only in jobs:
        argv = [str(hf_dir), "--outtype", "f32", "--outfile", str(out_file)] + (["--vocab-only"] if vocab_only else [])
        args.append("\x1f".join(argv))  # one argument per job: the unit separator cannot occur in paths here
    driver = _DRIVER.replace("SCRIPT", repr(str(tool / "convert_hf_to_gguf.py"))).replace("TOOL", repr(str(tool)))
    proc = subprocess.run([sys.executable, "-c", driver, *args], env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    missing = [str(out) for _, out, _ in jobs if not out.is_file()]
    if proc.returncode != 0 or missing:
        raise RuntimeError(f"convert_hf_to_gguf.py failed ({missing}):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")


def convert(hf_dir: Path, out_file: Path, vocab_only: bool = False) -> Path:
    """One conversion; see :func:`convert_many`."""
    convert_many([(hf_dir, out_file, vocab_only)])
    return out_file
