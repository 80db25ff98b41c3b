"""Tiny random models of every supported LLM family, with tokenizers, for parity tests against HF.

Each model directory holds what a user's checkpoint holds: ``config.json`` and ``model.safetensors`` from
``save_pretrained`` (:func:`sluice.engines.llm.random_models.save_random_model`, weights drawn larger than
transformers' default so that greedy choices are never near-ties), plus a SentencePiece tokenizer trained
here in milliseconds on :func:`tests.support.texts.varied_texts` -- ``tokenizer.model`` (what llama.cpp's
converter reads; the Gemma and Phi-3 converters insist on one) and the ``tokenizer.json`` /
``tokenizer_config.json`` / ``chat_template.jinja`` that HF's ``save_pretrained`` writes from it.

Two tokenizer styles, as the families ship them: ``gemma`` (no dummy prefix, ``<start_of_turn>`` turns, BOS
added) and ``llama`` (Llama 2 / Phi-3: a leading ``▁``, ``<|user|>`` turns). The chat templates below are
written in the shape of those families' templates (roles, BOS placement, ``raise_exception`` on bad role
order), enough to compare rendering with HF's ``apply_chat_template``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from sluice.engines.llm.random_models import save_random_model
from tests.support.texts import varied_texts

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "granite", "smollm3", "olmo2",
            "qwen3_moe", "mixtral", "gpt_oss")
TOKENIZER_STYLE = {"gemma2": "gemma", "gemma3": "gemma"}  # the others: "llama"
WEIGHT_STD = 0.15

GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] + '\\n\\n' %}"
    "{% set turns = messages[1:] %}{% else %}{% set first = '' %}{% set turns = messages %}{% endif %}"
    "{% for message in turns %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + (first if loop.first else '') + message['content'] | trim "
    "+ '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
PHI3_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- set date_string = strftime_now('%d %b %Y') %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Today Date: ' + date_string + '\\n\\n' }}{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim "
    "+ '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

_STYLES = {
    # style: (dummy prefix, chat pieces, HF tokenizer class, template, (pad, eos, bos, unk) ids)
    "gemma": (False, ["<start_of_turn>", "<end_of_turn>", "<mask>"], "GemmaTokenizer", GEMMA_TEMPLATE,
              ("<pad>", "<eos>", "<bos>", "<unk>")),
    "llama": (True, ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"], "LlamaTokenizer", PHI3_TEMPLATE,
              ("<pad>", "</s>", "<s>", "<unk>")),
}  # fmt: skip


def save_sentencepiece_tokenizer(path: Path, style: str, vocab_size: int = 400) -> int:
    """Train a SentencePiece BPE model (byte fallback) of ``style`` into ``path`` with HF's tokenizer files
    beside it; return its vocabulary size."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    dummy_prefix, pieces, cls, template, (pad, eos, bos, unk) = _STYLES[style]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(varied_texts(400, seed=3)), model_writer=model, model_type="bpe",
        vocab_size=vocab_size, byte_fallback=True, character_coverage=0.9995, normalization_rule_name="identity",
        add_dummy_prefix=dummy_prefix, remove_extra_whitespaces=False, split_digits=True,
        allow_whitespace_only_pieces=True, user_defined_symbols=pieces, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
        pad_piece=pad, eos_piece=eos, bos_piece=bos, unk_piece=unk, hard_vocab_limit=False, num_threads=1,
        minloglevel=2,
    )  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.model").write_bytes(model.getvalue())
    config = {"tokenizer_class": cls, "bos_token": bos, "eos_token": eos, "unk_token": unk, "pad_token": pad,
              "add_bos_token": True, "legacy": False}  # fmt: skip
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = AutoTokenizer.from_pretrained(path)
    tok.add_tokens(pieces, special_tokens=True)  # chat markers are special tokens, as in the families' files
    tok.chat_template = template
    tok.save_pretrained(path)
    # Hub tokenizer configs list the added tokens; llama.cpp's SentencePiece converters read their types here.
    added = json.loads((path / "tokenizer.json").read_text())["added_tokens"]
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return int(spm.SentencePieceProcessor(model_proto=model.getvalue()).vocab_size())


def save_tiny_model(path: Path, family: str, seed: int = 1, **overrides: object) -> Path:
    """A tiny random ``family`` model with a SentencePiece tokenizer in ``path`` (see the module docstring)."""
    vocab_size = save_sentencepiece_tokenizer(path, TOKENIZER_STYLE.get(family, "llama"))
    return save_random_model(path, f"tiny-{family}", vocab_size=vocab_size, weight_std=WEIGHT_STD, seed=seed,
                             **overrides)  # fmt: skip
