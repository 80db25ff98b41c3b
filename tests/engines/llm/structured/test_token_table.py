"""The token table a grammar backend gets is the engine's own tokenizer, byte for byte."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models

from sluice.engines.llm.loading.chat_tokenizer import ChatTokenizer
from sluice.engines.llm.structured.backend import TokenTable
from sluice.engines.llm.structured.token_table import token_table

TEXTS = ['{"product": "Café crème", "stars": 4}', "naïve 日本語 emoji 🙂 tabs\tand\nnewlines", "  spaced  out  ",
         "1234567890 digits split one by one"]


@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_token_bytes_spell_the_text(smollm2_tokenizer: ChatTokenizer, smollm2_table: TokenTable,
                                            text: str) -> None:
    ids = smollm2_tokenizer.encode(text)
    assert b"".join(smollm2_table.token_bytes[i] for i in ids) == text.encode()
    assert smollm2_table.encode(text) == ids


def test_smollm2_control_tokens_are_special_and_every_id_has_bytes(smollm2_tokenizer: ChatTokenizer,
                                                                   smollm2_table: TokenTable) -> None:
    tok = smollm2_tokenizer.tokenizer
    for name in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert tok.token_to_id(name) in smollm2_table.special_token_ids
    assert len(smollm2_table.token_bytes) == 49152 and all(smollm2_table.token_bytes)
    ordinary = [i for i in range(0, 49152, 97) if i not in smollm2_table.special_token_ids]
    for i in ordinary:  # single tokens that are whole UTF-8 decode as the tokenizer does
        raw = smollm2_table.token_bytes[i]
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            continue
        assert text == smollm2_tokenizer.decode([i])


def test_ids_past_the_tokenizer_are_special_placeholders(tiny_table: TokenTable) -> None:
    tok = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    table = token_table(tok, 5, (1,))
    assert table.token_bytes[:2] == [b"a", b"b"] and table.special_token_ids == {2, 3, 4}
    with pytest.raises(ValueError, match="2 tokens but the model's LM head only 1"):
        token_table(tok, 1, ())
    assert tiny_table.token_bytes[0] == b" " and tiny_table.token_bytes[200] == chr(0x100 + 105).encode()


def test_sentencepiece_pieces_become_spaces_and_bytes() -> None:
    from tokenizers import decoders

    tok = Tokenizer(models.BPE(vocab={"\u2581hi": 0, "<0x0A>": 1, "x": 2}, merges=[]))
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    assert token_table(tok, 3, ()).token_bytes == [b" hi", b"\n", b"x"]
