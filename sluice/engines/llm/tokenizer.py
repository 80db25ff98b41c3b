"""Tokenizer and chat template, from a GGUF file or a HF directory, plus incremental detokenisation.

From a GGUF (``tokenizer.ggml.model == "gpt2"``) we build a byte-level BPE ``tokenizers.Tokenizer`` from
the stored vocabulary and merges; control tokens (``<|im_start|>``...) become special added tokens so a
rendered chat template tokenises them as single ids. The split rule follows ``tokenizer.ggml.pre``: for
``smollm`` digits are split one by one before the GPT-2 byte-level regex, as in SmolLM2's own
``tokenizer.json``. The chat template is rendered with jinja2 in a sandbox, with the same whitespace
options HF transformers uses (``trim_blocks``, ``lstrip_blocks``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

_GGUF_CONTROL = 3  # llama.cpp token type of control tokens
_GGUF_USER_DEFINED = 4
_DIGIT_SPLITTING_PRE = ("smollm", "starcoder", "refact", "deepseek-coder")


class ChatTokenizer:
    """Encode / decode text and render chat messages into a prompt string."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str | None,
        bos_token: str = "",
        eos_token: str = "",
        add_bos: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.bos_token, self.eos_token, self.add_bos = bos_token, eos_token, add_bos
        self._bos_id = tokenizer.token_to_id(bos_token) if bos_token else None
        self._template: Any = None

    @classmethod
    def from_path(cls, path: str | Path) -> ChatTokenizer:
        """A ``.gguf`` file, or a directory with ``tokenizer.json`` (and ``tokenizer_config.json``)."""
        path = Path(path)
        if path.is_dir() and (path / "tokenizer.json").is_file():
            return cls.from_hf_dir(path)
        if path.is_dir():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                path = ggufs[0]
        if path.is_file() and path.suffix == ".gguf":
            return cls.from_gguf(path)
        raise ValueError(f"no tokenizer in {path}: expected a .gguf file or a directory with tokenizer.json")

    @classmethod
    def from_hf_dir(cls, path: Path) -> ChatTokenizer:
        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        cfg: dict[str, Any] = {}
        if (path / "tokenizer_config.json").is_file():
            cfg = json.loads((path / "tokenizer_config.json").read_text())
        template = cfg.get("chat_template")
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()

        def text(v: Any) -> str:
            return (v.get("content", "") if isinstance(v, dict) else v) or ""

        return cls(tok, template, text(cfg.get("bos_token")), text(cfg.get("eos_token")))

    @classmethod
    def from_gguf(cls, path: Path, reader: Any = None) -> ChatTokenizer:
        """``reader``: an already opened ``gguf.GGUFReader`` of ``path`` (parsing one takes seconds)."""
        from gguf import GGUFReader

        reader = reader if reader is not None else GGUFReader(str(path))

        def field(key: str, default: Any = None) -> Any:
            f = reader.fields.get(key)
            return default if f is None else f.contents()

        kind = field("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2')")
        tokens: list[str] = field("tokenizer.ggml.tokens")
        types: list[int] = field("tokenizer.ggml.token_type", [1] * len(tokens))
        merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges", [])]
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if field("tokenizer.ggml.pre", "default") in _DIGIT_SPLITTING_PRE:
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), byte_level]
            )
        else:
            tok.pre_tokenizer = byte_level
        tok.decoder = decoders.ByteLevel()
        specials = [t for t, k in zip(tokens, types, strict=True) if k in (_GGUF_CONTROL, _GGUF_USER_DEFINED)]
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])

        def token(key: str) -> str:
            i = field(key)
            return tokens[i] if i is not None and 0 <= i < len(tokens) else ""

        return cls(
            tok,
            field("tokenizer.chat_template"),
            bos_token=token("tokenizer.ggml.bos_token_id"),
            eos_token=token("tokenizer.ggml.eos_token_id"),
            add_bos=bool(field("tokenizer.ggml.add_bos_token", False)),
        )

    # ---- text <-> ids --------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in it become their single ids."""
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        if self.add_bos and self._bos_id is not None and (not ids or ids[0] != self._bos_id):
            ids.insert(0, self._bos_id)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render ``[{"role": ..., "content": ...}, ...]`` into the model's prompt text."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; pass a plain prompt instead")
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

            def raise_exception(message: str) -> None:
                raise ValueError(f"chat template error: {message}")

            env.globals["raise_exception"] = raise_exception
            self._template = env.from_string(self.chat_template)
        return str(
            self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        )


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas, holding back incomplete UTF-8 sequences.

    Byte-level BPE may split one character across tokens; decoding a window that starts a few tokens back
    (``prefix_offset``) and emitting only what lies beyond the already-read part avoids both broken
    characters and quadratic re-decoding of the whole output.
    """

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self._tok = tokenizer
        self.token_ids: list[int] = []
        self.text = ""
        self._prefix_offset = 0
        self._read_offset = 0

    def add(self, token_id: int) -> str:
        """Append one token; return the new text it completes (possibly empty)."""
        self.token_ids.append(token_id)
        ids = self.token_ids
        prefix = self._tok.decode(ids[self._prefix_offset : self._read_offset])
        full = self._tok.decode(ids[self._prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        delta = full[len(prefix) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(ids)
        self.text += delta
        return delta
