"""Export a Hugging Face BERT-family encoder to ONNX, and check the export against torch.

Used by :func:`sluice.models.fetch` for embedding models. The exported graph takes ``input_ids`` and
``attention_mask`` (both ``int64``, shape ``(batch, sequence)``, both axes dynamic) and returns
``last_hidden_state`` ``(batch, sequence, hidden)``; pooling is left to the task code
(:mod:`sluice.engines.text_embedding`) so every engine pools the same way.

torch and transformers are imported inside the functions: they are only needed to fetch, never to serve.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sluice.models.catalogue import ModelError

OPSET_VERSION = 17
INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAME = "last_hidden_state"
MAX_ABS_DIFF = 1e-3  # export check: largest allowed |onnx - torch| on any unmasked hidden value


def export_encoder_to_onnx(model_dir: Path, onnx_path: Path) -> float:
    """Write ``onnx_path`` from the HF model in ``model_dir``; verify it; return the export time in seconds.

    Raises ModelError (one line) when torch/transformers are missing or the exported graph disagrees with
    torch on a batch whose shape differs from the one used for tracing (which catches baked-in shapes).
    """
    try:
        import torch
        from transformers import AutoModel
    except ImportError as err:
        raise ModelError(f"exporting to ONNX needs torch and transformers ({err.name} is missing): "
                         "pip install 'sluice[export]'") from None

    start_s = time.perf_counter()
    with _quiet():
        model = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager")
    model.eval()
    wrapper = _keyword_call(model)

    # Trace with one shape, verify with another: a traced constant shape would show up as a mismatch.
    ids, mask = _dummy_batch(torch, batch_size=2, seq_len=16, vocab_size=model.config.vocab_size, seed=0)
    with torch.no_grad(), _quiet():
        torch.onnx.export(
            wrapper,
            (ids, mask),
            str(onnx_path),
            input_names=list(INPUT_NAMES),
            output_names=[OUTPUT_NAME],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "sequence"},
                OUTPUT_NAME: {0: "batch", 1: "sequence"},
            },
            opset_version=OPSET_VERSION,
            dynamo=False,  # the TorchScript exporter handles this model; see docs MODELS.md
        )
    export_s = time.perf_counter() - start_s
    _verify(torch, wrapper, onnx_path, model.config.vocab_size)
    return export_s


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Hide tracer warnings and transformers' weight-loading progress bar (fetch prints its own lines).

    The tracer warnings are about shapes becoming constants; :func:`_verify` checks that none did.
    """
    from transformers.utils import logging as hf_logging

    bars_were_disabled = hf_logging.is_progress_bar_enabled() is False
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if not bars_were_disabled:
            hf_logging.enable_progress_bar()


def _keyword_call(model: Any) -> Any:
    """Wrap ``model`` so that a positional ``(input_ids, attention_mask)`` call becomes a keyword call.

    transformers 5.x rejects positional arguments in some forward signatures; the exporter calls
    positionally.
    """
    import torch

    class KeywordCall(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return KeywordCall(model).eval()


def _dummy_batch(torch: Any, *, batch_size: int, seq_len: int, vocab_size: int, seed: int) -> tuple[Any, Any]:
    """Random ids with [CLS]=101 first; row i keeps ``seq_len - 3*i`` tokens (the rest is padding)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab_size, (batch_size, seq_len), generator=gen)  # (batch, seq)
    ids[:, 0] = 101
    mask = torch.ones(batch_size, seq_len, dtype=torch.int64)  # (batch, seq)
    for row in range(batch_size):
        kept = max(2, seq_len - 3 * row)
        mask[row, kept:] = 0
        ids[row, kept:] = 0
    return ids, mask


def _verify(torch: Any, wrapper: Any, onnx_path: Path, vocab_size: int) -> None:
    import onnxruntime as ort

    ids, mask = _dummy_batch(torch, batch_size=3, seq_len=37, vocab_size=vocab_size, seed=1)
    with torch.no_grad():
        expected = wrapper(ids, mask).numpy()  # (batch, seq, hidden)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (got,) = session.run([OUTPUT_NAME], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    valid = mask.numpy().astype(bool)  # padded positions carry no meaning; compare the rest
    if got.shape != expected.shape:
        raise ModelError(f"ONNX export check failed: output shape {got.shape}, torch gives {expected.shape}")
    max_diff = float(np.abs(got[valid] - expected[valid]).max())
    if max_diff > MAX_ABS_DIFF:
        raise ModelError(f"ONNX export check failed: max |onnx - torch| = {max_diff:.2e} > {MAX_ABS_DIFF}")
