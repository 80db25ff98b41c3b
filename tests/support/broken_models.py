"""Model directories that are broken the ways users' directories are, for the one-line error tests.

Each builder writes one directory and returns it; :func:`build_all` writes every kind under a root:

* ``missing-weights``: config.json and a tokenizer, no weights file;
* ``missing-config``: weights and a tokenizer, no config.json;
* ``truncated-weights``: model.safetensors cut to half its size;
* ``truncated-config``: config.json cut in the middle of its JSON;
* ``custom-code``: a model type transformers does not know, with ``auto_map`` naming a ``modeling_marker.py``
  whose import writes a marker file (so a test sees whether the directory's code ran);
* ``wrong-head``: an encoder without a classifier, for a classification task;
* ``no-pad-token``: a Qwen3 sequence classifier whose config has no ``pad_token_id``;
* ``no-tokenizer``: a complete BERT model without tokenizer files;
* ``truncated-gguf``: a GGUF file cut after its header (for the llm engine).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.support.tiny_models import save_embedding_model, save_model

CUSTOM_TYPE = "sluice-marker-bert"
MARKER_ENV = "SLUICE_TEST_MARKER"  # where the custom code writes its marker (an environment variable)

_MODELING = '''"""A model whose import leaves a marker: proof that a model directory's code ran."""
import os
import pathlib

from transformers import BertConfig, BertModel

pathlib.Path(os.environ["{env}"]).write_text("the model directory's code ran\\n")


class MarkerConfig(BertConfig):
    model_type = "{model_type}"


class MarkerModel(BertModel):
    config_class = MarkerConfig
'''


def custom_code(target: Path, tokenizer: Path) -> Path:
    """A BERT encoder saved under a model type of its own, loadable only by running its modeling file."""
    save_embedding_model(target, tokenizer)
    config = json.loads((target / "config.json").read_text())
    config["model_type"] = CUSTOM_TYPE
    config["architectures"] = ["MarkerModel"]
    config["auto_map"] = {"AutoConfig": "modeling_marker.MarkerConfig", "AutoModel": "modeling_marker.MarkerModel"}
    (target / "config.json").write_text(json.dumps(config, indent=2))
    (target / "modeling_marker.py").write_text(_MODELING.format(env=MARKER_ENV, model_type=CUSTOM_TYPE))
    return target


def _truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def no_pad_token(target: Path, tokenizer: Path) -> Path:
    """A tiny Qwen3 sequence classifier without ``pad_token_id`` (transformers cannot batch it as it is)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from tests.support.tiny_models import copy_tokenizer

    copy_tokenizer(tokenizer, target)
    config = AutoConfig.for_model("qwen3", vocab_size=30522, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                  id2label={0: "negative", 1: "positive"}, pad_token_id=None)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(str(target))
    saved = json.loads((target / "config.json").read_text())
    saved.pop("pad_token_id", None)
    (target / "config.json").write_text(json.dumps(saved, indent=2))
    return target


def build_all(root: Path, tokenizer: Path, gguf: Path | None = None) -> dict[str, Path]:
    """Every broken kind under ``root`` (name -> directory or file); ``gguf``: a real GGUF to cut."""
    good = save_embedding_model(root / "good", tokenizer)
    dirs: dict[str, Path] = {}
    for name in ("missing-weights", "missing-config", "truncated-weights", "truncated-config", "no-tokenizer"):
        shutil.copytree(good, root / name)
        dirs[name] = root / name
    (dirs["missing-weights"] / "model.safetensors").unlink()
    (dirs["missing-config"] / "config.json").unlink()
    _truncate(dirs["truncated-weights"] / "model.safetensors", 0.5)
    _truncate(dirs["truncated-config"] / "config.json", 0.5)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        (dirs["no-tokenizer"] / name).unlink(missing_ok=True)
    dirs["custom-code"] = custom_code(root / "custom-code", tokenizer)
    dirs["wrong-head"] = save_model(root / "wrong-head", "base", tokenizer=tokenizer)
    dirs["no-pad-token"] = no_pad_token(root / "no-pad-token", tokenizer)
    if gguf is not None:
        (root / "truncated-gguf").mkdir()
        cut = root / "truncated-gguf" / "model.gguf"
        cut.write_bytes(gguf.read_bytes()[: 64 * 1024])
        dirs["truncated-gguf"] = cut.parent
    return dirs
