"""The backend contract: load one model, report its inputs and outputs, run batches of arrays.

Driven by :class:`sluice.engines.task_engine.TaskEngine`, on these threads::

    backend = make_backend(options, context)   # cheap: nothing loaded
    files = backend.locate()                   # engine start: where the model's configs and tokenizer are
    files = backend.find()                     # or, for ``sluice validate``: the same, this machine unchecked
    io = backend.open(request)                 # engine start: load (export, build) the model; may block long
    outputs = backend.run(feeds, names)        # engine thread, one batch at a time
    backend.close()

``run`` returns one array per requested output name, in that order, as the backend holds it (numpy for
ONNX Runtime, a torch tensor on the device for torch and TensorRT); ``backend.ops`` says how to compute on
them and bring them to the host (:mod:`sluice.engines.backends.arrays`). So a task can reduce a large
output (pool hidden states) where it was computed and copy back only the small result.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from sluice.engines.backends.arrays import ArrayOps


class ModelClass(str, Enum):
    """What a task needs the model to be: decides the head an export or a load gives it.

    Each names the Hugging Face auto class that loads it and the output the task reads.
    """

    ENCODER = "encoder"  # AutoModel -> last_hidden_state (batch, tokens, hidden)
    SEQUENCE_CLASSIFICATION = "sequence-classification"  # ...ForSequenceClassification -> logits (batch, labels)
    TOKEN_CLASSIFICATION = "token-classification"  # ...ForTokenClassification -> logits (batch, tokens, labels)
    IMAGE_CLASSIFICATION = "image-classification"  # ...ForImageClassification: pixel_values -> logits (batch, labels)
    # CLIP / SigLIP: two towers into one space, each its own graph (sluice.engines.image_text):
    # pixel_values -> image_embeds (batch, dim), and input_ids [+ attention_mask] -> text_embeds (batch, dim)
    IMAGE_TEXT = "image-text"
    ANY = "any"  # the raw task: whatever the model is, fed as it declares

    @property
    def auto_class(self) -> str:
        """The transformers auto class loading this head (``""`` for ANY)."""
        return _AUTO_CLASSES[self]

    @property
    def output_name(self) -> str:
        """The output an export of this head is given (``""`` for ANY)."""
        if self is ModelClass.IMAGE_TEXT:
            return "image_embeds"  # the first graph's; the text graph gives text_embeds
        return "last_hidden_state" if self is ModelClass.ENCODER else "" if self is ModelClass.ANY else "logits"

    @property
    def architecture_suffix(self) -> str:
        """How the ``architectures`` entry of a matching config.json ends (``""``: any)."""
        return {ModelClass.SEQUENCE_CLASSIFICATION: "ForSequenceClassification",
                ModelClass.TOKEN_CLASSIFICATION: "ForTokenClassification",
                ModelClass.IMAGE_CLASSIFICATION: "ForImageClassification"}.get(self, "")

    @property
    def images(self) -> bool:
        """Whether the model takes ``pixel_values`` (an image tower) rather than tokens alone."""
        return self in (ModelClass.IMAGE_CLASSIFICATION, ModelClass.IMAGE_TEXT)


_AUTO_CLASSES = {ModelClass.ENCODER: "AutoModel",
                 ModelClass.SEQUENCE_CLASSIFICATION: "AutoModelForSequenceClassification",
                 ModelClass.TOKEN_CLASSIFICATION: "AutoModelForTokenClassification",
                 ModelClass.IMAGE_CLASSIFICATION: "AutoModelForImageClassification", ModelClass.IMAGE_TEXT: "AutoModel",
                 ModelClass.ANY: ""}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One model input or output as the loaded model declares it."""

    name: str
    dtype: Any  # numpy dtype the model wants (inputs) or gives (outputs)
    shape: tuple[int | None, ...]  # batch axis first; None where the size is dynamic or unknown


@dataclass(frozen=True, slots=True)
class ModelIO:
    """What :meth:`Backend.open` loaded: the model's inputs and outputs."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [spec.name for spec in self.outputs]


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """Where a model's files are, as :meth:`Backend.locate` found them (before anything is loaded)."""

    directory: Path | None  # config.json, tokenizer files, sentence-transformers configs; None: none (raw)
    model_path: Path | None  # the file or directory the backend loads; None for in-code modules (factory)


@dataclass(frozen=True, slots=True)
class LoadRequest:
    """What the task asks the backend to load."""

    model_class: ModelClass  # which head: decides the export and the HF class loaded
    model_dir: Path | None  # the Hugging Face directory holding that model (config.json, weights), if any
    max_tokens: int | None  # longest (batch, tokens) row a batch can have; None when inputs are not tokens
    max_batch_size: int
    trust_remote_code: bool = False  # engine.trust_remote_code: run Python files of the model directory


class Backend(ABC):
    """One model on one device. See the module docstring for who calls what, when."""

    ops: ArrayOps  # how to compute on, and copy back, what ``run`` returns; set by ``open``

    def model_reference(self) -> str | None:
        """The pipeline's name for the model on disk (a known model name, a path), or None for a model built
        in code. Read before ``locate``; never loads anything."""
        return None

    def memory_device(self) -> str:
        """After ``open``: where the model's memory lives, ``cpu`` or ``cuda:N``."""
        device = getattr(self, "device", None)
        return "cpu" if device is None else str(device)

    @abstractmethod
    def locate(self) -> ModelFiles:
        """Resolve the pipeline's model reference (a name, a path) without loading it.

        Raises EngineStartError (one line) when it does not exist.
        """

    def find(self) -> ModelFiles:
        """What :meth:`locate` returns, without checking what this machine has (a GPU, a runtime package):
        where ``sluice validate`` reads the model's files. EngineStartError (one line) when they are not
        there. Default: ``locate()``, for backends whose ``locate`` checks nothing of the machine."""
        return self.locate()

    @abstractmethod
    def open(self, request: LoadRequest) -> ModelIO:
        """Load the model for ``request`` (exporting or building it first where needed); return its IO.

        Raises EngineStartError (one line) when it cannot: a missing file, a model whose class does not
        match ``request.model_class``, a missing runtime package or device.
        """

    @abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[Any]:
        """One forward pass over a batch: ``feeds`` maps input names to (batch, ...) arrays.

        Returns one array per name of ``output_names``, in order, batch axis first. May raise; the batch
        then fails as a whole (the runner may bisect it).
        """

    def inference(self) -> AbstractContextManager[Any]:
        """A context around one batch's runs and its post-processing (torch: inference mode, the stream)."""
        return nullcontext()

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the model and device memory. Called once; no call follows."""
