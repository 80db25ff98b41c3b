"""The models of ``bench/llm_peers.py``: SmolLM2-135M Q4_1 as fetched, and a random-weight Llama-3.2-1B-shaped
model written once as Q4_0 and Q8_0 GGUF files by llama.cpp's own tools.

The 1B model: ``save_random_model("llama-3.2-1b")`` (published shape, random bf16 weights) with the real
Llama 3.2 tokenizer beside it (:mod:`tests.support.real_tokenizers`) and a chat template in Llama 3's
shape, converted to an F16 GGUF with
llama.cpp's ``convert_hf_to_gguf.py`` and quantised with its ``llama-quantize``, so both engines read the
same bytes. The files are cached in ``<cache>/tools/llama-3.2-1b-random-<version>/`` (2.1 GB for both);
the intermediate checkpoint and F16 file are deleted once the quantised files exist.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from llama_cpp_build import VERSION, cache_root, ensure_built

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

QUANTS = ("Q4_0", "Q8_0")
_LAYOUT = 2  # bump when what llama_1b writes changes (2: with a chat template)


def smollm2() -> str:
    from sluice.model_store import fetch

    path = Path(fetch("smollm2-135m"))
    return str(next(iter(sorted(path.glob("*.gguf")))))


def llama_1b(quant: str) -> str:
    """The random Llama-3.2-1B-shaped model as a ``quant`` GGUF file (built on first use: minutes)."""
    folder = cache_root().parent / f"llama-3.2-1b-random-{VERSION}-{_LAYOUT}"
    target = folder / f"llama-3.2-1b-random-{quant}.gguf"
    if target.is_file():
        return str(target)
    tools = ensure_built()
    folder.mkdir(parents=True, exist_ok=True)
    hf_dir, f16 = folder / "hf", folder / "llama-3.2-1b-random-F16.gguf"
    if not f16.is_file():
        import torch

        from sluice.engines.llm.random_models import PRESETS, save_random_model
        from tests.support.real_tokenizers import tokenizer_files
        from tests.support.tiny_llms import LLAMA3_TEMPLATE

        if not (hf_dir / "model.safetensors").is_file():
            save_random_model(hf_dir, "llama-3.2-1b", dtype=torch.bfloat16)
        # the package's tokenizer adds one token past the published 128256 (<|image|>): drop it, keep the shape
        vocab = PRESETS["llama-3.2-1b"]["vocab_size"]
        tokens = json.loads((tokenizer_files("llama3") / "tokenizer.json").read_text())
        tokens["added_tokens"] = [t for t in tokens["added_tokens"] if t["id"] < vocab]
        (hf_dir / "tokenizer.json").write_text(json.dumps(tokens))
        config = json.loads((tokenizer_files("llama3") / "tokenizer_config.json").read_text())
        decoder = config.get("added_tokens_decoder", {})
        config["added_tokens_decoder"] = {k: v for k, v in decoder.items() if int(k) < vocab}
        (hf_dir / "tokenizer_config.json").write_text(json.dumps(config))
        (hf_dir / "chat_template.jinja").write_text(LLAMA3_TEMPLATE)  # the package ships none
        src = tools / "src"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src / "gguf-py"), str(src)])}
        subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(hf_dir), "--outtype", "f16",
                        "--outfile", str(f16)], check=True, env=env)  # fmt: skip
        shutil.rmtree(hf_dir)
    for q in QUANTS:
        out = folder / f"llama-3.2-1b-random-{q}.gguf"
        if not out.is_file():
            tmp = out.with_suffix(".tmp")
            subprocess.run([str(tools / "bin" / "llama-quantize"), str(f16), str(tmp), q, "2"], check=True)
            tmp.rename(out)
    f16.unlink()
    return str(target)
