"""A model's fast tokenizer (``tokenizer.json``), set up as the transformers pipelines use it.

Truncation on (``longest_first``, so a pair loses tokens from its longer text first) at the task's
``max_length``; padding off (a batch is padded to its own longest item when it is collated). Special tokens
come from the tokenizer's own post-processor, as ``tokenizer(text)`` / ``tokenizer(text, text_pair)`` adds
them. Offsets are character offsets into the text given.

``encode`` is called on the intake thread while the engine thread may decode tokens (``decode_tokens``):
the ``tokenizers`` library allows concurrent use of one tokenizer.
``tokenizers`` is imported when a tokenizer is loaded, never at module import.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sluice.engines.engine_contract import EngineStartError, first_line
from sluice.engines.tasks.model_config import ModelConfig, TokenizerConfig


class TextTokenizer:
    """One model's tokenizer. See the module docstring."""

    def __init__(self, directory: Path, max_length: int, model: ModelConfig, config: TokenizerConfig, *,
                 lowercase: bool = False, task: str, needed_for: str = "") -> None:
        path = directory / "tokenizer.json"
        if not path.is_file():
            why = f" ({needed_for})" if needed_for else ""
            raise EngineStartError(f"task {task}: no tokenizer.json in {directory}{why}; save the model's fast "
                                   "tokenizer there (AutoTokenizer.from_pretrained(dir).save_pretrained(dir))")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise EngineStartError(f"task {task} needs the 'tokenizers' package (pip install 'sluice[onnx]')") from None
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises plain Exceptions for unreadable files
            raise EngineStartError(f"cannot load {path}: {first_line(err)}") from None
        # tokenizer.json often carries padding/truncation from training: padding happens per batch, and
        # truncation follows the pipeline's max_length.
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=max_length)
        if lowercase:
            _prepend_lowercase(tokenizer)
        self._tokenizer = tokenizer
        self.path = path
        self.max_length = max_length
        self.pad_id = self._id_of(config.pad_token, model.pad_token_id, ("[PAD]", "<pad>"))
        unk = self._id_of(config.unk_token, None, ("[UNK]", "<unk>"))
        self.unk_id: int | None = unk if unk >= 0 else None
        added = tokenizer.get_added_tokens_decoder()  # id -> AddedToken
        self.special_ids = frozenset(token_id for token_id, token in added.items() if token.special)
        prefix = getattr(tokenizer.model, "continuing_subword_prefix", None)
        self.continuing_subword_prefix: str = prefix or ""  # "##" for WordPiece; "" when words are not marked

    def encode(self, texts: Sequence[str]) -> list[Any]:
        """``tokenizers.Encoding`` per text, in order (special tokens added, truncated)."""
        if len(texts) == 1:
            return [self._tokenizer.encode(texts[0])]
        return list(self._tokenizer.encode_batch(list(texts)))  # parallel, releases the GIL

    def encode_pairs(self, pairs: Sequence[tuple[str, str] | str]) -> list[Any]:
        """``tokenizers.Encoding`` per (text, text_pair): both segments, their type ids, truncated together.

        A plain string among them is encoded as a single text.
        """
        if len(pairs) == 1:
            first = pairs[0]
            return [self._tokenizer.encode(first) if isinstance(first, str) else self._tokenizer.encode(*first)]
        return list(self._tokenizer.encode_batch(list(pairs)))

    def decode_tokens(self, tokens: Sequence[str]) -> str:
        """Token strings back to text as transformers' ``convert_tokens_to_string`` does (the decoder)."""
        decoder = self._tokenizer.decoder
        return decoder.decode(list(tokens)) if decoder is not None else " ".join(tokens)

    def _id_of(self, token: str | None, config_id: int | None, fallbacks: tuple[str, ...]) -> int:
        """The id of ``token``, else the config's id, else the first known fallback token; -1 if none."""
        for candidate in (token, *fallbacks):
            if candidate is not None and (found := self._tokenizer.token_to_id(candidate)) is not None:
                return int(found)
        if config_id is not None:
            return config_id
        return -1 if fallbacks[0] == "[UNK]" else 0


def _prepend_lowercase(tokenizer: Any) -> None:
    """sentence-transformers' ``do_lower_case``: lowercase first, unless the normaliser already does."""
    from tokenizers import normalizers

    current = tokenizer.normalizer
    # The same test as sentence-transformers: a Lowercase normaliser, alone or in a Sequence (a
    # BertNormalizer(lowercase=True) does not count, so such a tokenizer lowercases twice, harmlessly).
    if isinstance(current, normalizers.Lowercase) or (
            isinstance(current, normalizers.Sequence)
            and any(isinstance(n, normalizers.Lowercase) for n in current)):  # type: ignore[attr-defined]
        return
    tokenizer.normalizer = (normalizers.Lowercase() if current is None
                            else normalizers.Sequence([normalizers.Lowercase(), current]))
