"""A ``tokenizers.Tokenizer`` rebuilt from GGUF metadata, equal to the one in the model's HF directory.

llama.cpp's converter stores the vocabulary, not a ``tokenizer.json``; what the tokenizer does beyond its
vocabulary is named by two keys, which this module maps onto the HF pieces those models ship with:

* ``tokenizer.ggml.model == "gpt2"``: byte-level BPE with stored merges (Llama 3, Qwen2/2.5/3, SmolLM2,
  Phi-4-mini). ``tokenizer.ggml.pre`` names the split rule: ``llama-bpe`` (Llama 3's regex, numbers in runs
  of up to 3 digits, matched tokens not re-merged), ``qwen2`` (single digits, NFC-normalised input),
  ``gpt-4o``, ``smollm`` (every digit alone, then GPT-2's regex), ``gpt-2`` / ``default``. Other values
  are refused rather than guessed.
* ``tokenizer.ggml.model == "llama"``: SentencePiece BPE with byte fallback (Gemma, Phi-3, Llama 2). The
  merges are derived from the vocabulary as HF derives them from a ``tokenizer.model`` (every split of a
  piece into two pieces, ordered by the merged piece's id); spaces become ``▁``, with a leading one when
  ``tokenizer.ggml.add_space_prefix`` (default true; Gemma's converter writes false).

Control tokens (``<|im_start|>``, ``<start_of_turn>``...) and user-defined ones become added tokens, so a
rendered chat template tokenises them as single ids.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp token types

_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_GPT4O_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip

# tokenizer.ggml.pre -> (split regex or None for GPT-2's, digits one by one first, NFC, ignore merges)
_BPE_PRE: dict[str, tuple[str | None, bool, bool, bool]] = {
    **{name: (_LLAMA3_REGEX, False, False, True) for name in ("llama-bpe", "llama3", "llama-v3", "falcon3", "dbrx")},
    **{name: (_QWEN2_REGEX, False, True, False) for name in ("qwen2", "deepseek-r1-qwen")},
    "gpt-4o": (_GPT4O_REGEX, False, False, False),
    **{name: (None, True, False, False) for name in ("smollm", "starcoder", "refact", "codeshell")},
    **{name: (None, False, False, False) for name in ("gpt-2", "default", "phi-2", "mpt", "olmo")},
}


def tokenizer_from_gguf(field: Any) -> tuple[Tokenizer, dict[str, Any]]:
    """The tokenizer of a GGUF file whose key/values ``field(key, default)`` returns, and its settings:
    ``{"bos_token", "eos_token", "add_bos", "add_eos", "chat_template"}``."""
    kind = field("tokenizer.ggml.model")
    tokens: list[str] = field("tokenizer.ggml.tokens")
    types: list[int] = field("tokenizer.ggml.token_type", [_NORMAL] * len(tokens))
    if kind == "gpt2":
        tok = _byte_level_bpe(tokens, field("tokenizer.ggml.merges", []), str(field("tokenizer.ggml.pre", "default")))
        add_bos_default = False
    elif kind == "llama":
        tok = _sentencepiece_bpe(tokens, types, field("tokenizer.ggml.unknown_token_id"),
                                 bool(field("tokenizer.ggml.add_space_prefix", True)))  # fmt: skip
        add_bos_default = True  # llama.cpp's default for SentencePiece vocabularies
    else:
        raise ValueError(
            f"GGUF tokenizer model {kind!r} is not supported (supported: gpt2, llama); use the model's HF "
            "directory with its tokenizer.json instead"
        )
    specials = [AddedToken(t, special=k == _CONTROL, normalized=False)
                for t, k in zip(tokens, types, strict=True) if k in (_CONTROL, _USER_DEFINED)]  # fmt: skip
    tok.add_tokens(specials)

    def token(key: str) -> str:
        i = field(key)
        return tokens[i] if i is not None and 0 <= i < len(tokens) else ""

    settings = dict(
        bos_token=token("tokenizer.ggml.bos_token_id"),
        eos_token=token("tokenizer.ggml.eos_token_id"),
        add_bos=bool(field("tokenizer.ggml.add_bos_token", add_bos_default)),
        add_eos=bool(field("tokenizer.ggml.add_eos_token", False)),
        chat_template=field("tokenizer.chat_template"),
    )
    return tok, settings


def _byte_level_bpe(tokens: list[str], merges: list[str], pre: str) -> Tokenizer:
    if pre not in _BPE_PRE:
        raise ValueError(
            f"GGUF pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(_BPE_PRE))}); use the "
            "model's HF directory with its tokenizer.json instead"
        )
    regex, digits, nfc, ignore_merges = _BPE_PRE[pre]
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [(left, right) for left, right in (m.split(" ", 1) for m in merges)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False,
                               ignore_merges=ignore_merges))  # fmt: skip
    if regex is None:
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.pre_tokenizer = (
            pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level]) if digits else byte_level
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])  # fmt: skip
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    return tok


def sentencepiece_merges(vocab: dict[str, int]) -> list[tuple[str, str]]:
    """BPE merges of a SentencePiece BPE vocabulary: every split of a piece into two pieces of the
    vocabulary, ordered by the merged piece's id (its merge rank), then by the left and right ids."""
    merges: list[tuple[int, int, int, str, str]] = []
    for piece, rank in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((rank, len(left), len(right), left, right))
    merges.sort()
    return [(left, right) for *_, left, right in merges]


def _sentencepiece_bpe(tokens: list[str], types: list[int], unk_id: int | None, add_space_prefix: bool) -> Tokenizer:
    vocab = {t: i for i, t in enumerate(tokens)}
    # pieces that are whole symbols, never parts of a word: byte pieces, control and unused tokens
    mergeable = {t: i for t, i in vocab.items() if types[i] in (_NORMAL, _USER_DEFINED, _UNKNOWN)}
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=sentencepiece_merges(mergeable), unk_token=unk, fuse_unk=True,
                               byte_fallback=True))  # fmt: skip
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first" if add_space_prefix else "never", split=False
    )
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(steps)
    return tok
