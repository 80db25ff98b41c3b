"""Export a Hugging Face model to ONNX for a task's head, and check the export against torch.

The graph takes ``input_ids`` and ``attention_mask`` (and ``token_type_ids`` where the model has
segments: BERT-style pairs), all ``int64`` of shape ``(batch, sequence)`` with both axes dynamic, and
returns the head's output:

* encoder: ``last_hidden_state`` ``(batch, sequence, hidden)`` -- pooling is left to the task
  (:mod:`sluice.engines.tasks.pooling`) so every engine pools the same way;
* sequence classification: ``logits`` ``(batch, labels)``;
* token classification: ``logits`` ``(batch, sequence, labels)``;
* image models: their own graphs (:mod:`sluice.model_store.export_images`).

Every export is checked: the graph runs on a batch of another shape than the one traced (which catches a
shape baked in as a constant) and must agree with torch within :data:`MAX_ABS_DIFF` on every unmasked value.

torch and transformers are imported inside the functions: they are needed to export, never to serve.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sluice.engines.backends.backend_contract import ModelClass
from sluice.engines.engine_contract import first_line
from sluice.model_store.catalogue import ModelError

log = logging.getLogger("sluice.model_store")

class ExportUnavailable(ModelError):
    """torch or transformers is not installed here: export on another machine."""


class ExportLoadError(ModelError):
    """The directory holds no model with the head asked for."""


OPSET_VERSION = 17
MAX_ABS_DIFF = 1e-3  # export check: largest allowed |onnx - torch| on any unmasked output value
_TOKEN_LEVEL = (ModelClass.ENCODER, ModelClass.TOKEN_CLASSIFICATION)


def export_encoder_to_onnx(model_dir: Path, onnx_path: Path) -> float:
    """The encoder export of a known embedding model (``sluice models fetch``): ids and mask only."""
    try:
        return export_to_onnx(model_dir, onnx_path, ModelClass.ENCODER, segments=False)
    except ExportLoadError as err:  # fetch reports other errors as "ONNX export of <model name> failed: ..."
        raise RuntimeError(str(err)) from None


def export_to_onnx(model_dir: Path, onnx_path: Path, model_class: ModelClass, *, segments: bool | None = None,
                   text_path: Path | None = None, trust_remote_code: bool = False) -> float:
    """Write ``onnx_path`` from the HF model in ``model_dir`` with ``model_class``'s head; verify it; return the
    export time in seconds.

    ``text_path``: an image-text model's text tower (default: ``<stem>.text.onnx`` beside ``onnx_path``).
    ``segments``: whether the graph takes ``token_type_ids`` (default: when the model has more than one
    segment type). Raises ModelError (one line) when torch/transformers are missing, the directory holds no
    such model (a head without weights), or the exported graph disagrees with torch.
    """
    if model_class is ModelClass.ANY:
        raise ModelError("task raw runs an ONNX file as it is; there is no head to export for it")
    try:
        import torch
        import transformers  # noqa: F401 - checked here for a clear message
    except ImportError as err:
        raise ExportUnavailable(f"exporting to ONNX needs torch and transformers ({err.name} is missing): "
                         "pip install 'sluice[export]'") from None
    from sluice.engines.engine_contract import EngineStartError
    from sluice.engines.torch.text_graphs import load_hf_model

    start_s = time.perf_counter()
    try:
        with _quiet():
            model = load_hf_model(model_dir, model_class, attn_implementation="eager",
                                  trust_remote_code=trust_remote_code)
    except EngineStartError as err:
        raise ExportLoadError(str(err).removeprefix("engine torch: ")) from None
    if model_class.images:  # pixel inputs, and an image-text model's two towers: their own graphs
        from sluice.model_store.export_images import export_image_model

        with _quiet():
            return export_image_model(model, model_dir, onnx_path, model_class, text_path) + (time.perf_counter() - start_s)
    names = input_names(model, segments)
    wrapper = _keyword_call(model, names, model_class.output_name)
    vocab_size = int(model.config.vocab_size)

    # Trace with one shape, verify with another: a traced constant shape would show up as a mismatch.
    example = _dummy_batch(torch, names, batch_size=2, seq_len=16, vocab_size=vocab_size, seed=0)
    token_axes = {0: "batch", 1: "sequence"}
    output_axes = token_axes if model_class in _TOKEN_LEVEL else {0: "batch"}
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with torch.no_grad(), _quiet():
            torch.onnx.export(
                wrapper,
                example,
                str(onnx_path),
                input_names=names,
                output_names=[model_class.output_name],
                dynamic_axes={**{name: token_axes for name in names}, model_class.output_name: output_axes},
                opset_version=OPSET_VERSION,
                dynamo=False,  # TorchScript: fast, and exports most encoders as they are
            )
    except Exception as err:  # what TorchScript cannot trace (EmbeddingGemma's bidirectional masks): the newer exporter
        torchscript_error = _first_line(err)
        log.info("the TorchScript exporter cannot export %s (%s); exporting with torch.export instead", model_dir,
                 torchscript_error)
        try:
            _export_with_dynamo(torch, wrapper, example, onnx_path, names, model_class.output_name)
        except Exception as dynamo_err:
            raise ModelError(f"{model_dir} cannot be exported to ONNX (TorchScript exporter: {torchscript_error}; "
                             f"torch.export: {_first_line(dynamo_err)}); run it with engine type torch, which "
                             "loads the directory as it is") from None
    export_s = time.perf_counter() - start_s
    _verify(torch, wrapper, onnx_path, names, model_class, vocab_size)
    return export_s


def _export_with_dynamo(torch: Any, wrapper: Any, example: tuple[Any, ...], onnx_path: Path, names: list[str],
                        output_name: str) -> None:
    """torch.onnx's torch.export-based exporter, batch and sequence dynamic (its own opset)."""
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    onnx_path.unlink(missing_ok=True)
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)  # "torchvision is not installed" & co. on stderr
    try:
        with torch.no_grad(), _quiet(), contextlib.redirect_stdout(io.StringIO()):  # it prints its progress
            torch.onnx.export(wrapper, example, str(onnx_path), input_names=names, output_names=[output_name],
                              dynamic_shapes=(tuple({0: batch, 1: sequence} for _ in names),),  # *inputs
                              dynamo=True,
                              verbose=False, external_data=False)
    finally:
        exporter_log.setLevel(level)


def _first_line(err: BaseException) -> str:
    """The exception's class and first line, without torch.export's colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", f"{type(err).__name__}: {first_line(err)}")[:200]


def input_names(model: Any, segments: bool | None) -> list[str]:
    """The token inputs the graph takes: ids, mask, and segment ids when asked (default: the model has some)."""
    accepted = set(inspect.signature(model.forward).parameters)
    if segments is None:
        segments = int(getattr(model.config, "type_vocab_size", 0) or 0) > 1
    names = ["input_ids", "attention_mask"]
    if segments and "token_type_ids" in accepted:
        names.append("token_type_ids")
    return names


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Hide tracer warnings and transformers' progress bars (callers print their own lines).

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


def _keyword_call(model: Any, names: list[str], output_name: str) -> Any:
    """Wrap ``model`` so that a positional call becomes a keyword call returning one output tensor.

    transformers 5.x rejects positional arguments in some forward signatures; the exporter calls
    positionally.
    """
    import torch

    class KeywordCall(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *inputs: Any) -> Any:
            return getattr(self.inner(**dict(zip(names, inputs, strict=True))), output_name)

    return KeywordCall(model).eval()


def _dummy_batch(torch: Any, names: list[str], *, batch_size: int, seq_len: int, vocab_size: int,
                 seed: int) -> tuple[Any, ...]:
    """Random ids; row i keeps ``seq_len - 3*i`` tokens (the rest is padding); a second segment at the end."""
    gen = torch.Generator().manual_seed(seed)
    low = min(1000, vocab_size // 2)
    ids = torch.randint(low, vocab_size, (batch_size, seq_len), generator=gen)  # (batch, seq)
    mask = torch.ones(batch_size, seq_len, dtype=torch.int64)  # (batch, seq)
    segments = torch.zeros(batch_size, seq_len, dtype=torch.int64)  # (batch, seq)
    for row in range(batch_size):
        kept = max(2, seq_len - 3 * row)
        mask[row, kept:] = 0
        ids[row, kept:] = 0
        segments[row, kept // 2 : kept] = 1
    columns = {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments}
    return tuple(columns[name] for name in names)


def _verify(torch: Any, wrapper: Any, onnx_path: Path, names: list[str], model_class: ModelClass,
            vocab_size: int) -> None:
    import onnxruntime as ort

    batch = _dummy_batch(torch, names, batch_size=3, seq_len=37, vocab_size=vocab_size, seed=1)
    with torch.no_grad():
        expected = wrapper(*batch).numpy()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (got,) = session.run([model_class.output_name], {n: t.numpy() for n, t in zip(names, batch, strict=True)})
    if got.shape != expected.shape:
        raise ModelError(f"ONNX export check failed: output shape {got.shape}, torch gives {expected.shape}")
    if model_class in _TOKEN_LEVEL:  # padded positions carry no meaning; compare the rest
        valid = batch[names.index("attention_mask")].numpy().astype(bool)
        got, expected = got[valid], expected[valid]
    max_diff = float(np.abs(got - expected).max())
    if max_diff > MAX_ABS_DIFF:
        raise ModelError(f"ONNX export check failed: max |onnx - torch| = {max_diff:.2e} > {MAX_ABS_DIFF}")
