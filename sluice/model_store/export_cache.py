"""ONNX exports of Hugging Face directories, made once and found again by the directory's content.

Guarantees of :func:`exported_onnx`:

* **Keyed by content.** The key hashes the head being exported, :data:`EXPORT_VERSION` and the bytes of
  ``config.json`` and every weights file; editing or replacing the weights makes a new export, copying or
  moving the directory does not.
* **Atomic.** The export is written into a temporary folder beside the target and renamed into place, so
  an interrupted export leaves no half-written model, and two processes exporting the same model at once
  both end with one complete copy.
* **One-line errors** (:class:`ModelError`), saying how to export elsewhere when torch is not installed.

Layout: ``<cache>/exports/<directory name>-<head>-<key>/model.onnx``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from sluice.engines.backends.backend_contract import ModelClass
from sluice.model_store.catalogue import ModelError
from sluice.model_store.download import default_cache_dir

log = logging.getLogger("sluice.model_store")

EXPORT_VERSION = 1  # bump when sluice.model_store.export changes what a graph computes or takes
_WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json")


def content_key(model_dir: Path, model_class: ModelClass) -> str:
    """A hex key naming the export of ``model_dir`` for ``model_class``; see the module docstring."""
    files = [model_dir / "config.json"] + sorted({p for pattern in _WEIGHT_PATTERNS for p in model_dir.glob(pattern)})
    if not any(p.is_file() and p.name != "config.json" for p in files):
        raise ModelError(f"{model_dir} holds no model weights (model.safetensors or pytorch_model.bin) to export")
    digest = hashlib.sha256(f"sluice-export-{EXPORT_VERSION}-{model_class.value}".encode())
    for path in files:
        if not path.is_file():
            raise ModelError(f"no {path.name} in {model_dir}; a Hugging Face model directory needs it")
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:24]


def exported_onnx(model_dir: Path, model_class: ModelClass, cache_dir: Path | None = None,
                  trust_remote_code: bool = False) -> Path:
    """The ONNX export of ``model_dir`` for ``model_class``: from the cache, else exported now and cached.
    ``trust_remote_code``: the export may run the directory's own Python files (``engine.trust_remote_code``)."""
    if not trust_remote_code:  # the same answer whether an export made with the code is cached or not
        from sluice.engines.torch.text_graphs import custom_code_refusal

        refusal = custom_code_refusal(model_dir)
        if refusal is not None:
            raise ModelError(refusal)
    root = (cache_dir if cache_dir is not None else default_cache_dir() / "exports")
    target = root / f"{model_dir.resolve().name}-{model_class.value}-{content_key(model_dir, model_class)}"
    onnx_path = target / "model.onnx"
    if onnx_path.is_file():
        log.info("using the ONNX export of %s cached at %s", model_dir, onnx_path)
        return onnx_path
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=root))
    except OSError as err:
        raise ModelError(f"cannot write ONNX exports to {root}: {err.strerror or err}") from None
    log.info("exporting %s to ONNX for its %s head (once: the export is cached at %s)", model_dir,
             model_class.value, target)
    try:
        seconds = _export(model_dir, staging / "model.onnx", model_class, trust_remote_code)
        try:
            os.rename(staging, target)
        except OSError:
            if not onnx_path.is_file():  # not another process's complete copy: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone after a rename; removes a failed export's remains
    log.info("exported %s in %.1f s; the ONNX graph matches torch", model_dir, seconds)
    return onnx_path


def _export(model_dir: Path, onnx_path: Path, model_class: ModelClass, trust_remote_code: bool) -> float:
    from sluice.model_store.export import ExportUnavailable, export_to_onnx

    try:
        return export_to_onnx(model_dir, onnx_path, model_class, trust_remote_code=trust_remote_code)
    except ExportUnavailable as err:
        raise ModelError(f"{err}; or export it where torch is installed (sluice models export {model_dir} "
                         "--task TASK) and point 'model' at the result") from None
    except (ModelError, OSError):
        raise
    except Exception as err:  # torch.onnx raises RuntimeError & co. with pages of text
        text = str(err).strip()
        raise ModelError(f"ONNX export of {model_dir} failed: {text.splitlines()[0] if text else type(err).__name__}"
                         ) from None
