"""The model's token table for a grammar backend, read from the ``tokenizers.Tokenizer`` the engine already has.

Sluice builds its tokenizer itself -- from a HF ``tokenizer.json`` or, for a GGUF file (which has no such
file), from the vocabulary and merges in the GGUF metadata (``loading/chat_tokenizer.py``). Either way the result is one
``tokenizers.Tokenizer``, so the grammar backend gets the same tokens the engine encodes and decodes with:
its JSON (for backends that load it themselves) and, for any tokenizer, the bytes of every token id.

Token bytes by decoder: byte-level BPE (GPT-2 style, SmolLM2, Llama 3, Qwen) maps each character of a token
back to one byte; SentencePiece-style vocabularies write a space as ``▁`` and single bytes as ``<0xNN>``;
any other decoder (one character per token, say) is the token's text in UTF-8. Added tokens marked special
are control tokens. Ids past the tokenizer's end, up to the LM head's ``vocab_size``, become special
placeholder tokens, so no grammar ever allows them.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

from sluice.engines.llm.structured.backend import TokenTable

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def token_table(tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]) -> TokenTable:
    """The :class:`TokenTable` of a ``tokenizers.Tokenizer`` for a model whose LM head has ``vocab_size`` rows.

    ValueError when the tokenizer has more tokens than the LM head (the model could never produce them,
    and a bitmask would not cover them).
    """
    text = tokenizer.to_str()
    data = json.loads(text)
    vocab: dict[str, int] = tokenizer.get_vocab(with_added_tokens=True)
    num_tokens = max(vocab.values(), default=-1) + 1
    if num_tokens > vocab_size:
        raise ValueError(f"the tokenizer has {num_tokens} tokens but the model's LM head only {vocab_size}")
    added = {int(t["id"]): t for t in data.get("added_tokens", [])}
    special = {i for i, t in added.items() if t.get("special")}
    decode_piece = _piece_decoder(data.get("decoder"))
    token_bytes = [b""] * vocab_size
    for piece, token_id in vocab.items():
        token_bytes[token_id] = piece.encode() if token_id in added else decode_piece(piece)
    for token_id in range(vocab_size):
        if not token_bytes[token_id]:  # a hole in the vocabulary, or past the tokenizer's end
            token_bytes[token_id] = f"<|sluice_unused_{token_id}|>".encode()
            special.add(token_id)

    def encode(s: str) -> list[int]:
        ids: list[int] = tokenizer.encode(s, add_special_tokens=False).ids
        return ids

    return TokenTable(
        vocab_size=vocab_size,
        token_bytes=token_bytes,
        special_token_ids=frozenset(special),
        eos_token_ids=tuple(eos_token_ids),
        encode=encode,
        tokenizer_json=text,
    )


def _piece_decoder(decoder: dict[str, Any] | None) -> Any:
    kinds = _decoder_kinds(decoder)
    if "ByteLevel" in kinds:
        table = _byte_level_decoder()

        def byte_level(piece: str) -> bytes:
            try:
                return bytes(table[c] for c in piece)
            except KeyError:  # not a byte-level piece (an added token's text, say)
                return piece.encode()

        return byte_level
    sentencepiece = "Metaspace" in kinds or "ByteFallback" in kinds or "Replace" in kinds

    def plain(piece: str) -> bytes:
        if sentencepiece:
            byte = _BYTE_TOKEN.match(piece)
            if byte:
                return bytes([int(byte.group(1), 16)])
            piece = piece.replace("\u2581", " ")
        return piece.encode()

    return plain


def _decoder_kinds(decoder: dict[str, Any] | None) -> set[str]:
    if not decoder:
        return set()
    kinds = {str(decoder.get("type"))}
    for inner in decoder.get("decoders", []) or []:
        kinds |= _decoder_kinds(inner)
    return kinds


@cache
def _byte_level_decoder() -> dict[str, int]:
    """Inverse of byte-level BPE's byte -> printable character map.

    Printable Latin-1 bytes stand for themselves; the others (control bytes, space, ...) are shifted, in
    byte order, to the characters from U+0100 on, so every byte has a visible single-character name.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shift)
            shift += 1
    return {c: b for b, c in chars.items()}
