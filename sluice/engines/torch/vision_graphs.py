"""How a Hugging Face image model runs as Sluice graphs: what each graph takes and gives, and its torch module.

An image classifier is one graph, ``pixel_values -> logits``. A CLIP or SigLIP model is two towers into one
space, run apart (a record holds an image or a text, never both):

* ``image``: ``pixel_values (batch, 3, H, W) float32 -> image_embeds (batch, dim)``, as ``get_image_features``;
* ``text``: ``input_ids`` [+ ``attention_mask``] ``(batch, tokens) int64 -> text_embeds (batch, dim)``, as
  ``get_text_features``, with the inputs the model's tokenizer gives (:func:`text_inputs`). SigLIP was
  trained on texts padded to the tokenizer's full length and reads the last position, so its texts are
  padded that way (:func:`pads_to_full_length`).

The torch backend calls these modules and the ONNX export traces them, so both compute the same thing.
torch is imported inside :func:`graphs`; the rest is plain data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.engines.backends.backend_contract import ModelClass

IMAGE_GRAPH = "image"  # the image tower of an image-text model; its export is model.onnx
TEXT_GRAPH = "text"  # the text tower; its export is model.text.onnx beside it (text_graph_path)
_FULL_LENGTH_TYPES = frozenset({"siglip"})  # text towers trained on full-length padding, read at the last position


@dataclass(frozen=True, slots=True)
class Graph:
    """One graph of a model: positional inputs in this order, one output."""

    name: str
    inputs: tuple[str, ...]
    output: str
    module: Any = None  # torch.nn.Module called with the inputs positionally; None where only the shape is known


def text_graph_path(onnx_path: Path) -> Path:
    """Where an image-text model's text tower is kept beside its image tower's ONNX file: ``model.onnx`` ->
    ``model.text.onnx`` (so two models' exports in one folder keep their own)."""
    return onnx_path.with_name(f"{onnx_path.stem}.text.onnx")


def text_inputs(model_dir: Path) -> tuple[str, ...]:
    """The inputs of an image-text model's text tower: what its tokenizer gives (``tokenizer_config.json``'s
    ``model_input_names``; ids and mask when it does not say, as transformers 5's tokenizers give)."""
    from sluice.engines.tasks.model_config import read_json

    names = read_json(model_dir / "tokenizer_config.json").get("model_input_names")
    if isinstance(names, list) and "input_ids" in names:
        return ("input_ids",) if "attention_mask" not in names else ("input_ids", "attention_mask")
    return ("input_ids", "attention_mask")


def pads_to_full_length(model_type: str) -> bool:
    """Whether texts are padded to the tokenizer's full length (SigLIP: trained so, reads the last position)."""
    return model_type in _FULL_LENGTH_TYPES


def graphs(model: Any, model_class: ModelClass, model_dir: Path) -> list[Graph]:
    """The graphs of the HF ``model`` loaded from ``model_dir`` for ``model_class`` (an image class), each with
    its torch module."""
    import torch

    class Classifier(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values: Any) -> Any:
            return self.inner(pixel_values=pixel_values).logits

    class ImageTower(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values: Any) -> Any:
            return _features(self.inner.get_image_features(pixel_values=pixel_values))

    class TextTower(torch.nn.Module):
        def __init__(self, inner: Any, names: tuple[str, ...]) -> None:
            super().__init__()
            self.inner = inner
            self.names = names

        def forward(self, *tensors: Any) -> Any:
            return _features(self.inner.get_text_features(**dict(zip(self.names, tensors, strict=True))))

    if model_class is ModelClass.IMAGE_CLASSIFICATION:
        return [Graph("model", ("pixel_values",), "logits", Classifier(model).eval())]
    if model_class is ModelClass.IMAGE_TEXT:
        names = text_inputs(model_dir)
        return [Graph(IMAGE_GRAPH, ("pixel_values",), "image_embeds", ImageTower(model).eval()),
                Graph(TEXT_GRAPH, names, "text_embeds", TextTower(model, names).eval())]
    raise ValueError(f"{model_class.value} is not an image model class")


def _features(returned: Any) -> Any:
    """``get_*_features``' result as a tensor: transformers 5 returns the projected vector as the output's
    ``pooler_output``, transformers 4 the tensor itself."""
    pooled = getattr(returned, "pooler_output", None)
    return pooled if pooled is not None else returned


def image_size(model: Any) -> int:
    """The square side the vision tower takes (config's ``image_size``), for example inputs."""
    config = getattr(model.config, "vision_config", None) or model.config
    return int(getattr(config, "image_size", 224))
