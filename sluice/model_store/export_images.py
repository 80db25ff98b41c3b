"""Export a Hugging Face image model to ONNX, graph by graph, and check every graph against torch.

The graphs are :mod:`sluice.engines.torch.vision_graphs`' (the torch backend runs the same modules):

* image classification: ``model.onnx``, ``pixel_values (batch, 3, H, W) -> logits (batch, labels)``;
* image-text (CLIP, SigLIP): ``model.onnx`` is the image tower (``-> image_embeds``) and ``model.text.onnx``
  beside it the text tower (``input_ids`` [+ ``attention_mask``] ``-> text_embeds``).

The batch axis is dynamic (and the token axis of the text graph); the image size is the model's own. Each
graph is traced on one batch shape and checked on another, within :data:`MAX_ABS_DIFF` of torch.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from sluice.engines.backends.backend_contract import ModelClass
from sluice.engines.torch.vision_graphs import Graph, graphs, image_size, text_graph_path
from sluice.model_store.catalogue import ModelError

MAX_ABS_DIFF = 1e-3  # largest allowed |onnx - torch| on any output value


def export_image_model(model: Any, model_dir: Path, onnx_path: Path, model_class: ModelClass,
                       text_path: Path | None = None) -> float:
    """Write the graphs of the loaded HF ``model``: ``onnx_path``, and for image-text the text tower at
    ``text_path`` (default: :func:`text_graph_path`); verify each; return the seconds it took. ModelError (one
    line) when a graph disagrees with torch."""
    import torch

    start_s = time.perf_counter()
    side = image_size(model)
    vocab = int(getattr(getattr(model.config, "text_config", None) or model.config, "vocab_size", 1000))
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    for graph in graphs(model, model_class, model_dir):
        path = onnx_path if graph.name != "text" else (text_path or text_graph_path(onnx_path))
        example = _example(torch, graph, batch=2, tokens=16, side=side, vocab=vocab, seed=0)
        axes = {name: ({0: "batch"} if name == "pixel_values" else {0: "batch", 1: "sequence"}) for name in graph.inputs}
        with torch.no_grad():
            torch.onnx.export(graph.module, example, str(path), input_names=list(graph.inputs),
                              output_names=[graph.output], dynamic_axes={**axes, graph.output: {0: "batch"}},
                              opset_version=17, dynamo=False)
        _verify(torch, graph, path, _example(torch, graph, batch=3, tokens=11, side=side, vocab=vocab, seed=1))
    return time.perf_counter() - start_s


def _example(torch: Any, graph: Graph, *, batch: int, tokens: int, side: int, vocab: int,
             seed: int) -> tuple[Any, ...]:
    """Random inputs of ``graph``: normalised-looking pixels, token ids with the last rows padded."""
    gen = torch.Generator().manual_seed(seed)
    tensors = []
    for name in graph.inputs:
        if name == "pixel_values":
            tensors.append(torch.randn(batch, 3, side, side, generator=gen))
        elif name == "input_ids":
            tensors.append(torch.randint(1, vocab, (batch, tokens), generator=gen))
        else:  # attention_mask: row i keeps tokens - 2i
            mask = torch.ones(batch, tokens, dtype=torch.int64)
            for row in range(batch):
                mask[row, max(2, tokens - 2 * row):] = 0
            tensors.append(mask)
    return tuple(tensors)


def _verify(torch: Any, graph: Graph, path: Path, batch: tuple[Any, ...]) -> None:
    import onnxruntime as ort

    with torch.no_grad():
        expected = graph.module(*batch).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {name: tensor.numpy() for name, tensor in zip(graph.inputs, batch, strict=True)}
    (got,) = session.run([graph.output], feeds)
    if got.shape != expected.shape:
        raise ModelError(f"ONNX export check of the {graph.name} graph failed: output shape {got.shape}, "
                         f"torch gives {expected.shape}")
    max_diff = float(np.abs(got - expected).max())
    if max_diff > MAX_ABS_DIFF:
        raise ModelError(f"ONNX export check of the {graph.name} graph failed: max |onnx - torch| = "
                         f"{max_diff:.2e} > {MAX_ABS_DIFF}")
