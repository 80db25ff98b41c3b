"""Task ``image-text-embedding``: a CLIP or SigLIP vector per record, for an image or a text, in one space.

A record with an image gets the image tower's vector (``get_image_features``), a record with a text the text
tower's (``get_text_features``): search a catalogue's images by text, or find images like an image. The
model directory is a Hugging Face CLIP / SigLIP model (``CLIPModel``, ``SiglipModel``), or a
sentence-transformers CLIP model (its ``0_CLIPModel`` folder, and a Normalize module if it has one).

Which records are which: with ``inputs`` unset every value is an image (``engine.image`` says how it is
carried); ``inputs: {text: "."}`` makes every value a text; ``inputs: {image: FIELD, text: FIELD}`` (with
``codec.input_field: "."``) reads a JSON object: its image field when set, else its text field.

Texts are tokenised as the model's processor does: truncated at the tokenizer's length (CLIP: 77), and for
SigLIP, whose text tower reads the last position, padded to that full length (``padding="max_length"``, as
SigLIP's documentation asks); the attention mask goes in when the tokenizer gives one.
``normalize`` (default: as the model says -- false for a Hugging Face directory, as ``get_*_features``)
scales vectors to unit length; ``output_format`` is ``list`` or ``base64``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from sluice.engines.backends.arrays import ArrayOps
from sluice.engines.backends.backend_contract import ModelClass, ModelIO
from sluice.engines.engine_contract import EngineStartError, RecordError
from sluice.engines.tasks.image_inputs import (
    ImageInputs,
    ImageItem,
    ImageOptions,
    check_pixel_input,
    raise_first_failure,
)
from sluice.engines.tasks.model_config import read_model_config, read_tokenizer_config
from sluice.engines.tasks.record_fields import as_text, lookup
from sluice.engines.tasks.task_contract import ModelRun, Task, TaskContext, TaskOptions, TaskType
from sluice.engines.tasks.text_inputs import TokenizedText, pad_batch
from sluice.engines.tasks.tokenizer import TextTokenizer
from sluice.engines.tasks.vector_formats import OutputFormat, format_vectors, l2_normalize
from sluice.engines.torch.vision_graphs import pads_to_full_length, text_inputs

_FIELDS = ("image", "text")


class ImageTextEmbeddingOptions(TaskOptions):
    image: ImageOptions = Field(default_factory=ImageOptions)
    """Where each record's image is (`source`), and the limits on it."""

    def takes_bytes(self) -> bool:  # a raw value is an image's bytes unless inputs make every value a text
        return self.image.source == "bytes" and (not self.inputs or self.inputs.get("image") == ".")
    inputs: dict[str, str] = Field(default_factory=dict)
    """Which records are images and which texts: unset, every value is an image; `{text: "."}`, every value is
    a text; `{image: FIELD, text: FIELD}`, a JSON object's image field when set, else its text field."""
    max_length: int | None = Field(default=None, ge=2, le=65_536)
    """Truncate texts to this many tokens (default: the model's limit)."""
    normalize: bool | None = None
    """Scale vectors to unit length (default: as the model says; `false` for a Hugging Face directory)."""
    output_format: OutputFormat = "list"
    """`list` of floats, or `base64` of little-endian float32."""

    @model_validator(mode="after")
    def _known_fields(self) -> ImageTextEmbeddingOptions:
        unknown = sorted(set(self.inputs) - set(_FIELDS))
        if unknown:
            raise ValueError(f"inputs: task image-text-embedding reads 'image' and 'text' fields, not {unknown}")
        return self


class ImageTextEmbeddingTask(Task):
    name = "image-text-embedding"
    model_class = ModelClass.IMAGE_TEXT

    def __init__(self, options: ImageTextEmbeddingOptions, context: TaskContext) -> None:
        assert context.files.directory is not None  # an image task always has a model directory
        self.model_dir, st_normalize = _clip_dir(context.files.directory)
        self.model_name = self.model_dir.name
        config = read_model_config(self.model_dir)
        if not config.exists:
            raise EngineStartError(f"task {self.name}: no config.json in {self.model_dir}")
        self.images = ImageInputs(options.image, self.model_dir, context.pipeline_dir, self.name)
        self.fields = dict(options.inputs) or {"image": "."}
        self.tokenizer: TextTokenizer | None = None
        if "text" in self.fields:
            tokenizer_config = read_tokenizer_config(self.model_dir)
            limit = _text_limit(config.raw, tokenizer_config)
            if options.max_length is not None and options.max_length > limit:
                raise EngineStartError(f"task {self.name}: max_length {options.max_length} is more than the model's "
                                       f"text length ({limit} tokens)")
            self.max_tokens = options.max_length or limit
            self.tokenizer = TextTokenizer(self.model_dir, self.max_tokens, config, tokenizer_config, task=self.name)
        self.text_names = text_inputs(self.model_dir)
        self.full_length = pads_to_full_length(config.model_type)
        self.normalize = options.normalize if options.normalize is not None else st_normalize
        self.output_format = options.output_format

    def bind(self, io: ModelIO) -> None:
        check_pixel_input(io.input_names, self.model_name, self.name)
        for output in ("image_embeds", "text_embeds"):
            if output not in io.output_names:
                raise EngineStartError(f"model {self.model_name} has outputs {io.output_names}; task {self.name} "
                                       f"reads image_embeds and text_embeds")
        dims = {spec.name: spec.shape[-1] for spec in io.outputs if spec.shape}
        if None not in (image_dim := dims.get("image_embeds"), text_dim := dims.get("text_embeds")) \
                and image_dim != text_dim:
            raise EngineStartError(f"model {self.model_name}: its image tower gives {image_dim} values and its text "
                                   f"tower {text_dim}; they are not one model's towers")
        self.text_names = tuple(name for name in io.input_names if name in ("input_ids", "attention_mask"))

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        return raise_first_failure(self.prepare_each(values))

    def prepare_each(self, values: Sequence[Any]) -> list[Any]:
        routed = [self._route(value) for value in values]
        items: list[Any] = [r if isinstance(r, RecordError) else None for r in routed]
        images = [(i, r[1]) for i, r in enumerate(routed) if isinstance(r, tuple) and r[0] == "image"]
        texts = [(i, r[1]) for i, r in enumerate(routed) if isinstance(r, tuple) and r[0] == "text"]
        for (i, _), item in zip(images, self.images.prepare_each([value for _, value in images]), strict=True):
            items[i] = item
        if texts:
            assert self.tokenizer is not None  # _route gives texts only when inputs name a text field
            for (i, _), encoding in zip(texts, self.tokenizer.encode([text for _, text in texts]), strict=True):
                ids = np.asarray(encoding.ids, dtype=np.int64)
                items[i] = TokenizedText(ids=ids, num_tokens=int(ids.shape[0]))
        return items

    def item_length(self, item: Any) -> int:
        return int(item.num_tokens) if isinstance(item, TokenizedText) else 1

    def collate(self, items: Sequence[Any]) -> list[ModelRun]:
        images = [i for i, item in enumerate(items) if isinstance(item, ImageItem)]
        runs = [ModelRun(feeds={"pixel_values": pixels}, output_names=["image_embeds"], rows=[images[j] for j in group])
                for group, pixels in self.images.collate([items[i] for i in images])]
        texts = [i for i, item in enumerate(items) if isinstance(item, TokenizedText)]
        if texts:
            runs.append(ModelRun(feeds=self._text_feeds([items[i] for i in texts]), output_names=["text_embeds"],
                                 rows=texts))
        return runs

    def postprocess(self, run: ModelRun, outputs: list[Any], ops: ArrayOps) -> list[Any]:
        vectors = ops.to_host(outputs[0]).astype(np.float32, copy=False)  # (rows, dim)
        return format_vectors(l2_normalize(vectors) if self.normalize else vectors, self.output_format)

    def warmup_items(self, num_items: int) -> list[Any]:
        """``num_items`` images, and as many texts when records may be texts (both towers warmed up)."""
        items: list[Any] = [self.images.warmup_item()] * num_items
        if self.tokenizer is not None:
            (encoding,) = self.tokenizer.encode(["warm-up run"])
            ids = np.asarray(encoding.ids, dtype=np.int64)
            items += [TokenizedText(ids=ids, num_tokens=int(ids.shape[0]))] * num_items
        return items

    def records_per_poll(self) -> int | None:
        return self.images.records_per_poll()

    def close(self) -> None:
        self.images.close()

    def result_schema(self) -> dict[str, Any] | None:
        if self.output_format == "list":
            return {"type": "array", "items": {"type": "number", "format": "float"}}
        return {"type": "string", "contentEncoding": "base64"}

    # ------------------------------------------------------------------------------------ internals

    def _route(self, value: Any) -> tuple[str, Any] | RecordError:
        """``("image", value)`` or ``("text", str)`` for one record, or why it is neither."""
        image_field, text_field = self.fields.get("image"), self.fields.get("text")
        if image_field == ".":
            return ("image", value)
        if text_field == "." and image_field is None:
            return _text(value, self.name, None)
        if not isinstance(value, Mapping):
            return RecordError(f"task {self.name} reads the fields {sorted(self.fields.values())} of a JSON object "
                               f"(codec.input_field: \".\"), got {type(value).__name__}")
        for kind, field in (("image", image_field), ("text", text_field)):
            if field is not None:
                try:
                    found = lookup(value, field)
                except RecordError:
                    continue
                if found is not None and (kind == "text" or found not in ("", b"")):  # "" is a text, not an image
                    return ("image", found) if kind == "image" else _text(found, self.name, field)
        return RecordError(f"the record has none of the fields {sorted(self.fields.values())}")

    def _text_feeds(self, items: list[TokenizedText]) -> dict[str, np.ndarray]:
        assert self.tokenizer is not None
        batch = pad_batch(items, self.tokenizer.pad_id)
        ids, mask = batch.input_ids, batch.attention_mask
        if self.full_length:  # SigLIP: padded to the full length, as it was trained
            ids = np.full((len(items), self.tokenizer.max_length), self.tokenizer.pad_id, dtype=np.int64)
            mask = np.zeros_like(ids)
            ids[:, : batch.input_ids.shape[1]] = batch.input_ids
            mask[:, : batch.input_ids.shape[1]] = batch.attention_mask
        return {"input_ids": ids, "attention_mask": mask} if "attention_mask" in self.text_names else {
            "input_ids": ids}


def _text(value: Any, task: str, field: str | None) -> tuple[str, str] | RecordError:
    try:
        return ("text", as_text(value, task, field))
    except RecordError as err:
        return err


def _text_limit(config: dict[str, Any], tokenizer: Any) -> int:
    """The model's text length: the tokenizer's ``model_max_length`` capped by the text positions."""
    text_config = config.get("text_config") or {}
    limits = [n for n in (tokenizer.model_max_length, text_config.get("max_position_embeddings")) if isinstance(n, int)]
    return min(limits) if limits else 77


def _clip_dir(directory: Path) -> tuple[Path, bool]:
    """The HF directory of the model, and whether its vectors are normalised (a sentence-transformers CLIP model:
    ``0_CLIPModel`` then ``Normalize``); a plain HF directory is itself, unnormalised."""
    modules_path = directory / "modules.json"
    if not modules_path.is_file():
        return directory, False
    try:
        modules = sorted(json.loads(modules_path.read_text(encoding="utf-8")), key=lambda m: int(m.get("idx", 0)))
        kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    except (OSError, ValueError, TypeError, AttributeError) as err:
        raise EngineStartError(f"cannot read {modules_path}: {err}") from None
    if not kinds or kinds[0] != "CLIPModel" or any(kind != "Normalize" for kind in kinds[1:]):
        raise EngineStartError(f"{modules_path}: modules {kinds}; task image-text-embedding runs a CLIPModel "
                               "module, optionally followed by Normalize")
    return directory / str(modules[0].get("path", "")), "Normalize" in kinds


def _model_dir(directory: Path) -> Path:
    return _clip_dir(directory)[0]


def _create(options: ImageTextEmbeddingOptions, context: TaskContext) -> ImageTextEmbeddingTask:
    return ImageTextEmbeddingTask(options, context)


TASK_TYPE = TaskType(name="image-text-embedding", options=ImageTextEmbeddingOptions, create=_create,
                     model_class=ModelClass.IMAGE_TEXT, text=False, model_dir=_model_dir)
