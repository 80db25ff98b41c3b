"""Random-weight models of real shapes for the GPU check, built where it runs in seconds (none travel).

Decoders (HF ``AutoModelForCausalLM.from_config``, saved as a HF safetensors directory that Sluice's LLM
engine loads the way a user's model loads): Llama-3.2-1B- and Qwen3-0.6B-shaped on the GPU, tiny ones of
the same families plus a plain Llama in the CPU dry run. Encoders (``BertModel``): MiniLM-L6- and
BGE-base-shaped (tiny in the dry run), with a WordPiece ``tokenizer.json`` built from the benchmark's own
review vocabulary (no tokenizer travels either).

Speed does not depend on the weights' values. Parity does depend on how peaked the next-token
distribution is: with the default initialisation the logits of a random model are nearly flat, and greedy
choices between near-equal logits would be decided by float rounding. Every weight matrix is drawn with
std 1/sqrt(fan_in) (activations stay of order one through the depth) and the embedding, which is also the
LM head when tied, with std 4/sqrt(hidden) (logits of std ~4: top choices well apart).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EMBEDDING_GAIN = 4.0


@dataclass(frozen=True)
class DecoderSpec:
    name: str  # row prefix, e.g. "llama-3.2-1b"
    model_type: str  # HF model_type: "llama", "qwen3"
    config: dict[str, Any]  # HF config fields
    # Retried with these fields instead when the engine refuses the exact config, so the shape is still
    # measured (the model row then says so); empty: no retry.
    fallback: dict[str, Any] = field(default_factory=dict)
    fallback_note: str = ""

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])


_LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA_3_2_1B = DecoderSpec("llama-3.2-1b", "llama", dict(
    vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
    num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
    tie_word_embeddings=True, rope_parameters=_LLAMA3_ROPE,
), fallback={"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
    fallback_note="llama3 rope scaling dropped (plain rope, theta 500000)")
QWEN3_0_6B = DecoderSpec("qwen3-0.6b", "qwen3", dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
    tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
))
_TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6)
TINY_LLAMA = DecoderSpec("tiny-llama", "llama", dict(_TINY, max_position_embeddings=2048,
                                                     tie_word_embeddings=False))
# original_max_position_embeddings 64: the scaled frequencies matter on prompts this short.
TINY_LLAMA3 = DecoderSpec("tiny-llama-3.2", "llama", dict(
    _TINY, max_position_embeddings=2048, tie_word_embeddings=True,
    rope_parameters={**_LLAMA3_ROPE, "original_max_position_embeddings": 64}))
TINY_QWEN3 = DecoderSpec("tiny-qwen3", "qwen3", dict(_TINY, max_position_embeddings=2048, tie_word_embeddings=True,
                                                     rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
DECODERS = {"full": (LLAMA_3_2_1B, QWEN3_0_6B), "tiny": (TINY_LLAMA, TINY_LLAMA3, TINY_QWEN3)}


@dataclass(frozen=True)
class EncoderSpec:
    name: str
    config: dict[str, Any] = field(default_factory=dict)  # BertConfig fields


MINILM_L6 = EncoderSpec("minilm-l6", dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                                          num_attention_heads=12, intermediate_size=1536))
BGE_BASE = EncoderSpec("bge-base", dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                                        num_attention_heads=12, intermediate_size=3072))
TINY_BERT = EncoderSpec("tiny-bert", dict(vocab_size=1024, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=2, intermediate_size=64))
ENCODERS = {"full": (MINILM_L6, BGE_BASE), "tiny": (TINY_BERT,)}


def decoder(profile: str, name: str) -> DecoderSpec:
    for spec in DECODERS[profile]:
        if spec.name == name:
            return spec
    raise KeyError(f"no decoder {name!r} in profile {profile!r}")


def hf_config(spec: DecoderSpec, override: dict[str, Any] | None = None) -> Any:
    """The HF config of ``spec`` (fields replaced by ``override``) without special tokens: no EOS can end a
    generation early."""
    from transformers import AutoConfig

    fields = {**spec.config, **(override or {})}
    return AutoConfig.for_model(spec.model_type, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                **fields)


def peak_weights(model: Any, hidden_size: int, seed: int) -> None:
    """Redraw every weight matrix as the module docstring says (in place, on the model's device)."""
    import torch

    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    embedding = model.get_input_embeddings().weight
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                gain = EMBEDDING_GAIN if param is embedding else 1.0
                std = gain / (hidden_size if param is embedding else param.shape[1]) ** 0.5
                param.normal_(0.0, std, generator=gen)


def build_decoder(spec: DecoderSpec, device: str, dtype: Any, override: dict[str, Any] | None = None,
                  seed: int = 0) -> Any:
    """The HF causal LM of ``spec`` (fields replaced by ``override``) with peaked random weights, built
    directly on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):  # random init on the GPU: seconds, where the CPU would take minutes
        model = AutoModelForCausalLM.from_config(hf_config(spec, override), dtype=dtype)
    model.to(device)  # a no-op unless this transformers built it elsewhere
    peak_weights(model, spec.hidden_size, seed)
    return model.eval()


def save_decoder(model: Any, path: Path) -> Path:
    model.save_pretrained(path)  # config.json + model.safetensors
    return path


def probe_dir(spec: DecoderSpec, path: Path, override: dict[str, Any] | None = None) -> Path:
    """A one-layer, narrow model of ``spec``'s family and options on the CPU: asks the engine cheaply
    whether it loads this architecture before the real-shaped one is built."""
    from transformers import AutoModelForCausalLM

    small = DecoderSpec(spec.name, spec.model_type, {**spec.config, **_TINY, "num_hidden_layers": 1})
    model = AutoModelForCausalLM.from_config(hf_config(small, override))
    if path.exists():
        shutil.rmtree(path)
    return save_decoder(model, path)


# ----------------------------------------------------------------------------------------------- encoders

_SPECIAL = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}


def wordpiece_vocab(words: list[str], size: int) -> dict[str, int]:
    """BERT's special ids, the given words, single characters and their ``##`` pieces, padded to ``size``."""
    chars = sorted({c for w in words for c in w} | set("abcdefghijklmnopqrstuvwxyz0123456789"))
    pieces = iter(dict.fromkeys([*words, *chars, *(f"##{c}" for c in chars)]))
    by_id = {i: token for token, i in _SPECIAL.items()}
    vocab: dict[str, int] = {}
    for i in range(size):
        token = by_id.get(i) or next((p for p in pieces if p not in _SPECIAL), f"[unused{i}]")
        vocab[token] = i
    return vocab


def save_wordpiece_tokenizer(path: Path, texts: list[str], vocab_size: int) -> None:
    """A BERT-style uncased WordPiece ``tokenizer.json`` whose vocabulary covers ``texts``' words."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    words = [w for text in texts for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(text))]
    tok = Tokenizer(models.WordPiece(wordpiece_vocab(words, vocab_size), unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 101),
                                                                                             ("[SEP]", 102)])
    tok.decoder = decoders.WordPiece()
    tok.save(str(path / "tokenizer.json"))


def save_encoder(spec: EncoderSpec, path: Path, texts: list[str], seed: int = 0) -> Path:
    """A random ``BertModel`` of ``spec``'s shape plus its tokenizer, saved as a HF directory."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    model = BertModel(BertConfig(**spec.config)).eval()
    model.save_pretrained(path)
    save_wordpiece_tokenizer(path, texts, int(spec.config["vocab_size"]))
    return path


def scratch_dir(num_bytes: int) -> str | None:
    """Where to write models: /dev/shm when it has room for them three times over, else the temp dir."""
    shm = Path("/dev/shm")
    if shm.is_dir():
        usage = shutil.disk_usage(shm)
        if usage.free > 3 * num_bytes:
            return str(shm)
    return None
