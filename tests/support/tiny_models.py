"""Small randomly initialised Hugging Face models saved as plain directories, the way users have them.

Each builder writes ``config.json`` + ``model.safetensors`` + tokenizer files (and, for embedding models,
sentence-transformers' ``modules.json`` & co.) into a directory and returns it. Weights are drawn with a
fixed seed and a large initialiser range, so outputs are far from ties (a label decided by 1e-6 would make
a parity test flaky) and the same directory content comes out every time (export caches stay valid).

Tokenizers: MiniLM's real WordPiece files (BERT-style, with segment ids), or ones trained here in a
second: a byte-level BPE saved through ``RobertaTokenizer`` and a Unigram (SentencePiece-style) saved
through ``XLMRobertaTokenizer``, so transformers writes their ``tokenizer.json`` as it does for real models.

``shape``: ``tiny`` for tests; ``minilm-l6`` / ``bge-small`` / ``bge-base`` give the real models' sizes
(for throughput checks on a GPU) with random weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64},
    "minilm-l6": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
    "bge-small": {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 1536},
    "bge-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
}
NER_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
_CORPUS = ("The quick brown fox from Berlin met Angela Merkel in New York City on Monday. "
           "Shipping took far too long, the battery lasts all day, très bon produit, 東京タワー 👍. "
           "Apple and Microsoft opened offices in São Paulo and Zürich; customer service was helpful.")


def copy_tokenizer(source: Path, target: Path) -> None:
    """MiniLM's WordPiece tokenizer files (uncased BERT vocabulary)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in _TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, target / name)


def roberta_tokenizer(target: Path, corpus: list[str]) -> int:
    """A byte-level BPE tokenizer trained on ``corpus``, saved as transformers' RobertaTokenizer; its size."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([*corpus, _CORPUS] * 3, vocab_size=700, min_frequency=1,
                           special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = RobertaTokenizer(vocab=model["vocab"], merges=merges, model_max_length=512)
    tokenizer.save_pretrained(str(target))
    return len(tokenizer)


def xlmr_tokenizer(target: Path, corpus: list[str]) -> int:
    """A Unigram tokenizer (SentencePiece-style, ``▁`` word marks), saved as XLMRobertaTokenizer; its size."""
    from tokenizers import SentencePieceUnigramTokenizer
    from transformers import XLMRobertaTokenizer

    unigram = SentencePieceUnigramTokenizer()
    unigram.train_from_iterator([*corpus, _CORPUS] * 3, vocab_size=500, show_progress=False,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>")
    vocab = [tuple(entry) for entry in json.loads(unigram.to_str())["model"]["vocab"]]
    tokenizer = XLMRobertaTokenizer(vocab=vocab, model_max_length=512)
    tokenizer.save_pretrained(str(target))
    return len(tokenizer)


def _config(family: str, vocab_size: int, shape: str, **extra: Any) -> Any:
    from transformers import AutoConfig

    sizes = dict(SHAPES[shape])
    if family == "distilbert":
        sizes = {"dim": sizes["hidden_size"], "n_layers": sizes["num_hidden_layers"],
                 "n_heads": sizes["num_attention_heads"], "hidden_dim": sizes["intermediate_size"]}
    elif family in ("roberta", "xlm-roberta"):
        extra = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "max_position_embeddings": 514,
                 "type_vocab_size": 1, **extra}
    return AutoConfig.for_model(family, vocab_size=vocab_size, initializer_range=0.4 if shape == "tiny" else 0.02,
                                **sizes, **extra)


def save_model(target: Path, head: str, *, family: str = "bert", tokenizer: Path | str = "", shape: str = "tiny",
               seed: int = 0, corpus: list[str] | None = None, **config: Any) -> Path:
    """A random ``family`` model with ``head`` (``base``, ``sequence``, ``token``) saved in ``target``.

    ``tokenizer``: a directory to copy WordPiece files from (BERT, DistilBERT), or ``"roberta"`` /
    ``"xlmr"`` to train one on ``corpus``. ``config``: extra config keys (``id2label``, ``problem_type``...).
    """
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification

    target.mkdir(parents=True, exist_ok=True)
    if tokenizer == "roberta":
        vocab_size = roberta_tokenizer(target, corpus or [])
    elif tokenizer == "xlmr":
        vocab_size = xlmr_tokenizer(target, corpus or [])
    else:
        copy_tokenizer(Path(tokenizer), target)
        vocab_size = 30522
    if "id2label" in config:
        config["label2id"] = {label: int(i) for i, label in config["id2label"].items()}
    auto = {"base": AutoModel, "sequence": AutoModelForSequenceClassification,
            "token": AutoModelForTokenClassification}[head]
    torch.manual_seed(seed)
    model = auto.from_config(_config(family, vocab_size, shape, **config)).eval()
    if head != "base":
        _center_head(model, target)
    model.save_pretrained(str(target))
    return target


def _center_head(model: Any, directory: Path) -> None:
    """Shift the classifier's bias so every label wins somewhere: a random encoder gives every token nearly
    the same state, and without this one label would win everywhere (a parity test would see no entities)."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    texts = [sentence.strip() for sentence in _CORPUS.split(".") if sentence.strip()]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    layer = dict(model.named_modules()).get("classifier.out_proj") or model.classifier
    with torch.no_grad():
        logits = model(**batch).logits
        rows = logits[batch["attention_mask"].bool()] if logits.dim() == 3 else logits
        layer.bias -= rows.mean(dim=0)


def save_embedding_model(target: Path, tokenizer: Path | str, *, pooling: str | list[str] = "mean",
                         normalize: bool = True, include_prompt: bool = True, prompts: dict[str, str] | None = None,
                         default_prompt_name: str | None = None, dense_features: int | None = None,
                         max_seq_length: int | None = None, shape: str = "tiny", family: str = "bert",
                         seed: int = 0, corpus: list[str] | None = None) -> Path:
    """A sentence-transformers model directory: Transformer, Pooling, [Dense (tanh)], [Normalize].

    Written with sentence-transformers' own classes, so its files are what a user's model holds.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    hf_dir = target.parent / f".{target.name}-hf"
    save_model(hf_dir, "base", family=family, tokenizer=tokenizer, shape=shape, seed=seed, corpus=corpus)
    transformer = Transformer(str(hf_dir), max_seq_length=max_seq_length)
    dim = transformer.get_embedding_dimension()
    modes = tuple(pooling) if isinstance(pooling, list) else pooling
    modules: list[Any] = [transformer, Pooling(dim, pooling_mode=modes, include_prompt=include_prompt)]
    if dense_features:
        import torch

        torch.manual_seed(seed + 1)
        in_features = dim * (len(pooling) if isinstance(pooling, list) else 1)
        modules.append(Dense(in_features, dense_features))
    if normalize:
        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device="cpu", prompts=prompts,
                                default_prompt_name=default_prompt_name)
    model.save(str(target))
    shutil.rmtree(hf_dir)
    return target


def save_cross_encoder(target: Path, tokenizer: Path | str, *, num_labels: int = 1, family: str = "bert",
                       seed: int = 0, activation: str | None = None, corpus: list[str] | None = None) -> Path:
    """A cross-encoder as sentence-transformers saves one (``CrossEncoder.save_pretrained``)."""
    from sentence_transformers import CrossEncoder

    hf_dir = target.parent / f".{target.name}-hf"
    save_model(hf_dir, "sequence", family=family, tokenizer=tokenizer, seed=seed, corpus=corpus,
               id2label={i: f"LABEL_{i}" for i in range(num_labels)})
    activation_fn = None
    if activation is not None:
        import torch

        activation_fn = {"sigmoid": torch.nn.Sigmoid(), "identity": torch.nn.Identity(),
                         "tanh": torch.nn.Tanh()}[activation]
    CrossEncoder(str(hf_dir), device="cpu", activation_fn=activation_fn).save_pretrained(str(target))
    shutil.rmtree(hf_dir)
    return target
