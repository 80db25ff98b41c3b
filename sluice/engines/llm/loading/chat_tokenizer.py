"""Tokenizer and chat template, from a HF directory or a GGUF file, plus incremental detokenisation.

From a HF directory: ``tokenizer.json`` (the same ``tokenizers`` library HF's fast tokenizers run on), the
BOS rule of ``tokenizer_config.json`` (``add_bos_token``) or else of ``tokenizer.json``'s post-processor,
and the chat template from ``chat_template.jinja`` or ``tokenizer_config.json``. From a GGUF file: the
tokenizer rebuilt from its vocabulary (:mod:`.gguf_tokenizer`: byte-level BPE for Llama 3 / Qwen,
SentencePiece BPE for Gemma / Phi-3) and ``tokenizer.chat_template``.

Chat templates render in the sandboxed jinja2 environment HF transformers uses (``trim_blocks``,
``lstrip_blocks``, loop controls, its ``tojson``, ``raise_exception`` and ``strftime_now``), with the special
tokens (``bos_token``, ``eos_token``...) in scope, so ``apply_chat_template`` returns HF's prompt string.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from sluice.engines.llm.loading.gguf_file import GGUFFile
from sluice.engines.llm.loading.gguf_tokenizer import tokenizer_from_gguf


class ChatTokenizer:
    """Encode / decode text and render chat messages into a prompt string."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str | None,
        bos_token: str = "",
        eos_token: str = "",
        add_bos: bool = False,
        add_eos: bool = False,
        special_tokens: dict[str, str] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.bos_token, self.eos_token, self.add_bos, self.add_eos = bos_token, eos_token, add_bos, add_eos
        self._bos_id = tokenizer.token_to_id(bos_token) if bos_token else None
        self._eos_id = tokenizer.token_to_id(eos_token) if eos_token else None
        # what templates see besides the messages: bos_token, eos_token, pad_token, unk_token...
        self.special_tokens = {"bos_token": bos_token, "eos_token": eos_token, **(special_tokens or {})}
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
        if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()

        def text(v: Any) -> str:
            return (v.get("content", "") if isinstance(v, dict) else v) or ""

        bos, eos = text(cfg.get("bos_token")), text(cfg.get("eos_token"))
        add_bos = cfg.get("add_bos_token")
        if add_bos is None:  # no explicit rule: what tokenizer.json's post-processor does
            add_bos = bool(bos) and tok.encode("a", add_special_tokens=True).ids[:1] == [tok.token_to_id(bos)]
        specials = {key: text(cfg.get(key)) for key in ("pad_token", "unk_token") if cfg.get(key)}
        return cls(tok, template, bos, eos, add_bos=bool(add_bos), add_eos=bool(cfg.get("add_eos_token")),
                   special_tokens=specials)  # fmt: skip

    @classmethod
    def from_gguf(cls, path: Path, file: GGUFFile | None = None) -> ChatTokenizer:
        """``file``: ``path`` already opened (its weights are read from the same parse)."""
        file = file if file is not None else GGUFFile(path)
        tok, settings = tokenizer_from_gguf(file.get)
        return cls(tok, settings["chat_template"], settings["bos_token"], settings["eos_token"],
                   add_bos=settings["add_bos"], add_eos=settings["add_eos"])  # fmt: skip

    # ---- text <-> ids --------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special-token strings in it become their single ids.

        With ``add_special_tokens`` (HF's default) the model's BOS / EOS rule applies, except that a BOS the
        text already starts with (a rendered chat template's) is not doubled. Without, the ids are exactly
        HF's ``apply_chat_template(..., tokenize=True)`` of a rendered prompt.
        """
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            if self.add_bos and self._bos_id is not None and (not ids or ids[0] != self._bos_id):
                ids.insert(0, self._bos_id)
            if self.add_eos and self._eos_id is not None:
                ids.append(self._eos_id)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True, **template_vars: Any
    ) -> str:
        """Render ``[{"role": ..., "content": ...}, ...]`` into the model's prompt text.

        ``template_vars`` reach the template as HF's keyword arguments do (``enable_thinking=False``...).
        """
        if not self.chat_template:
            raise ValueError("this model has no chat template; pass a plain prompt instead")
        if self._template is None:
            self._template = _compile(self.chat_template)
        context = {**self.special_tokens, **template_vars}
        return str(self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, **context))


def _compile(template: str) -> Any:
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(f"chat template error: {message}")

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:  # fmt: skip
        # HF's: no HTML escaping (jinja's own tojson escapes <, >, &, ')
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)


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
