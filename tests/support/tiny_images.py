"""Small random image models saved as Hugging Face directories, and real image files written by Pillow.

* :func:`save_vit_classifier` -- ``ViTForImageClassification`` + ``ViTImageProcessor`` (resize to a square).
* :func:`save_clip` -- ``CLIPModel`` + ``CLIPImageProcessor`` (shortest edge, centre crop) and a CLIP BPE
  tokenizer (character-level merges: byte-level alphabet with CLIP's ``</w>`` word ends).
* :func:`save_siglip` -- ``SiglipModel`` + ``SiglipImageProcessor`` and a Unigram ``tokenizer.json`` (texts end
  with ``</s>``, padded with it to 16 tokens as SigLIP's are to 64).
* :func:`image_files` -- JPEG, PNG and WebP files in RGB, RGBA, L, CMYK and P, odd sizes, one EXIF-rotated;
  :func:`png_bomb` -- a decompression bomb.

Weights come from a fixed seed with a large initialiser range, so scores are far from ties and a directory's
content is the same every time (export caches stay valid).
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

LABELS = ("cat", "dog", "bird", "fish", "car", "tree")
SIDE = 32  # the models' image size


# ViT-Tiny's shape (DeiT-Tiny / vit_tiny_patch16_224: 5.7 M parameters), with a realistic initialiser range
VIT_TINY = {"image_size": 224, "patch_size": 16, "hidden_size": 192, "num_hidden_layers": 12,
            "num_attention_heads": 3, "intermediate_size": 768, "initializer_range": 0.02}


def save_vit_classifier(target: Path, *, seed: int = 0, num_labels: int = len(LABELS),
                        shape: Mapping[str, Any] | None = None) -> Path:
    """``shape``: ViTConfig fields over the tiny default's (``image_size`` sizes the processor too), e.g.
    :data:`VIT_TINY`."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    labels = {i: LABELS[i % len(LABELS)] + ("" if i < len(LABELS) else str(i)) for i in range(num_labels)}
    dims = {"image_size": SIDE, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 64, "initializer_range": 0.4, **(shape or {})}
    config = ViTConfig(**dims, id2label=labels, label2id={v: k for k, v in labels.items()})
    torch.manual_seed(seed)
    ViTForImageClassification(config).eval().save_pretrained(str(target))
    side = int(dims["image_size"])
    ViTImageProcessor(size={"height": side, "width": side}, resample=2).save_pretrained(str(target))
    return target


def clip_tokenizer_files(target: Path) -> int:
    """A CLIP tokenizer with a character-level vocabulary (no merges); its size."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    vocab = {token: i for i, token in enumerate([*alphabet, *(c + "</w>" for c in alphabet)])}
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)
    tokenizer.save_pretrained(str(target))
    return len(vocab)


def save_clip(target: Path, *, seed: int = 0, legacy_eos: bool = False) -> Path:
    """``legacy_eos``: ``eos_token_id: 2`` as OpenAI's checkpoints have it, so CLIP pools at the largest id."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    target.mkdir(parents=True, exist_ok=True)
    vocab_size = clip_tokenizer_files(target)
    config = CLIPConfig(
        text_config={"vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "max_position_embeddings": 77,
                     "eos_token_id": 2 if legacy_eos else vocab_size - 1,
                     "bos_token_id": vocab_size - 2, "pad_token_id": vocab_size - 1},
        vision_config={"image_size": SIDE, "patch_size": 8, "hidden_size": 32, "intermediate_size": 64,
                       "num_hidden_layers": 2, "num_attention_heads": 4},
        projection_dim=24, initializer_factor=4.0)
    torch.manual_seed(seed)
    CLIPModel(config).eval().save_pretrained(str(target))
    CLIPImageProcessor(size={"shortest_edge": SIDE}, crop_size={"height": SIDE, "width": SIDE}).save_pretrained(
        str(target))
    return target


def siglip_tokenizer_files(target: Path, max_length: int = 16, ids_only: bool = False) -> int:
    """A Unigram tokenizer whose texts end with ``</s>`` and pad with it (SigLIP's layout); its size.
    ``ids_only``: it gives no attention mask (``model_input_names``), as transformers 4's SigLIP tokenizer."""
    from tokenizers import SentencePieceUnigramTokenizer, processors
    from transformers import PreTrainedTokenizerFast

    unigram = SentencePieceUnigramTokenizer()
    corpus = ["a photo of a cat", "a red car on a street", "two dogs playing in the snow", "the tree by the lake"]
    unigram.train_from_iterator(corpus * 5, vocab_size=60, show_progress=False, special_tokens=["<pad>", "</s>",
                                "<unk>"], unk_token="<unk>")  # fmt: skip
    eos = unigram.token_to_id("</s>")
    unigram.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", eos)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=unigram._tokenizer, eos_token="</s>", pad_token="</s>",
                                        unk_token="<unk>", model_max_length=max_length)
    tokenizer.save_pretrained(str(target))
    if ids_only:
        config_path = target / "tokenizer_config.json"
        write_json(config_path, {**json.loads(config_path.read_text(encoding="utf-8")),
                                 "model_input_names": ["input_ids"]})
    return int(unigram.get_vocab_size())


def save_siglip(target: Path, *, seed: int = 0, ids_only: bool = False) -> Path:
    import torch
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

    target.mkdir(parents=True, exist_ok=True)
    vocab_size = siglip_tokenizer_files(target, ids_only=ids_only)
    config = SiglipConfig(
        text_config={"vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "max_position_embeddings": 16, "projection_size": 32,
                     "pad_token_id": 1, "eos_token_id": 1, "bos_token_id": 1},
        vision_config={"image_size": SIDE, "patch_size": 8, "hidden_size": 32, "intermediate_size": 64,
                       "num_hidden_layers": 2, "num_attention_heads": 4})
    torch.manual_seed(seed)
    model = SiglipModel(config).eval()
    with torch.no_grad():  # a wider spread than the default init: vectors far from equal
        for param in model.parameters():
            if param.dim() > 1:
                param.mul_(3.0)
    model.save_pretrained(str(target))
    SiglipImageProcessor(size={"height": SIDE, "width": SIDE}).save_pretrained(str(target))
    return target


def image_bytes(image: Any, fmt: str, **save: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save)
    return buffer.getvalue()


def picture(width: int, height: int, seed: int = 0) -> Any:
    """An RGB image with structure (gradients and blocks), not noise: resizing it means something."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(1, width - 1), y * 255 // max(1, height - 1),
                     (x + y) * 255 // max(1, width + height - 2)], axis=-1).astype(np.int32)
    blocks = rng.integers(0, 80, size=(4, 4, 3))[(y * 4 // height), (x * 4 // width)]
    return Image.fromarray(np.clip(base + blocks, 0, 255).astype(np.uint8), "RGB")


def image_files(seed: int = 0) -> dict[str, bytes]:
    """Named image files covering formats, modes and sizes (name: ``<what>.<ext>``)."""
    from PIL import Image

    files = {
        "rgb-224.jpg": image_bytes(picture(224, 224, seed), "JPEG", quality=90),
        "rgb-odd.png": image_bytes(picture(517, 3 + 90, seed + 1), "PNG"),
        "rgba.png": image_bytes(picture(97, 141, seed + 2).convert("RGBA"), "PNG"),
        "grey.jpg": image_bytes(picture(300, 200, seed + 3).convert("L"), "JPEG"),
        "cmyk.jpg": image_bytes(picture(120, 80, seed + 4).convert("CMYK"), "JPEG"),
        "palette.png": image_bytes(picture(64, 48, seed + 5).convert("P"), "PNG"),
        "photo.webp": image_bytes(picture(641, 97, seed + 6), "WEBP", quality=85),
    }
    rotated = picture(160, 90, seed + 7)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display
    files["exif-rotated.jpg"] = image_bytes(rotated, "JPEG", exif=exif.tobytes())
    return files


def png_bomb(width: int, height: int) -> bytes:
    """A valid black 1-bit PNG, compressed as it is built: 30000x30000 is ~110 KB of file, 900 M pixels."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    compressor, row = zlib.compressobj(9), bytes(1 + (width + 7) // 8)  # filter byte + packed bits
    rows = [compressor.compress(row * min(1000, height - start)) for start in range(0, height, 1000)]
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", b"".join(rows) + compressor.flush()) + chunk(b"IEND", b""))


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")
