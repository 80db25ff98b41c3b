"""The task contract: what a model's inputs and outputs mean, on any backend.

A task turns record values into model feeds and model outputs into results; a backend
(:mod:`sluice.engines.backends`) only loads the model and runs it. Driven by
:class:`sluice.engines.task_engine.TaskEngine`::

    task = task_type.create(options, TaskContext(...))  # engine start: tokenizer, configs; one-line errors
    backend.open(LoadRequest(task.model_class, task.max_tokens, ...))
    task.bind(io)                                        # check the model's inputs/outputs, choose names
    items = task.prepare(values)                         # intake thread (tokenise), RecordError per record
    for run in task.collate(items):                      # engine thread
        outputs = backend.run(run.feeds, run.output_names)
        results[run.rows] = task.postprocess(run, outputs, backend.ops)

``prepare`` runs on the intake thread while the engine thread collates and post-processes the previous
batch; a task keeps no per-batch state between the two.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from sluice.engines.backends.arrays import ArrayOps
from sluice.engines.backends.backend_contract import ModelClass, ModelFiles, ModelIO


class TaskOptions(BaseModel):
    """A task's own options (under ``engine:``, beside the backend's). Subclassed by each task.

    Fields that several tasks share must be declared with the same type and default in each (the engine
    options merge every task's fields; see :mod:`sluice.engines.tasks.task_types`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    def takes_bytes(self) -> bool:
        """Whether the task reads a raw record's bytes as they are (an image file). Default: UTF-8 text."""
        return False


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a task is built from at engine start."""

    engine: str  # engine type name, for messages
    files: ModelFiles  # where the model's configs and tokenizer are
    max_batch_size: int
    pipeline_dir: Path = Path(".")  # the pipeline file's folder: relative paths in records resolve against it


@dataclass(slots=True)
class ModelRun:
    """One backend run of a batch (or part of one): the feeds and what post-processing needs."""

    feeds: dict[str, np.ndarray]  # model input name -> (rows, ...) array
    output_names: list[str]  # the outputs post-processing reads, in the order it reads them
    rows: Sequence[int]  # indices into the collated items, one per row of the feeds, in order
    state: Any = None  # task-specific: the padded batch, the items...


class Task(ABC):
    """A task bound to one model; see the module docstring for who calls what, when."""

    name: ClassVar[str]
    model_class: ModelClass  # the head the backend must load or export
    model_dir: Path | None = None  # the Hugging Face directory to load or export (a transformer's own folder)
    max_tokens: int | None = None  # longest tokenised row (max_length); None for inputs that are not tokens

    @abstractmethod
    def bind(self, io: ModelIO) -> None:
        """Check the loaded model's inputs and outputs against the task; choose the outputs to read.

        Raises EngineStartError (one line) naming what does not fit.
        """

    @abstractmethod
    def prepare(self, values: Sequence[Any]) -> list[Any]:
        """Decoded record values -> items (tokenised). Raises RecordError (single-value calls only)."""

    def prepare_each(self, values: Sequence[Any]) -> list[Any]:
        """``prepare``, a failing value's RecordError in its place where the task can (image fetches are not
        repeated record by record). Default: ``prepare``, which raises."""
        return self.prepare(values)

    def item_length(self, item: Any) -> int:
        """Length of an item in the unit of ``max_batch_tokens``: tokens. Default 1."""
        return 1

    @abstractmethod
    def collate(self, items: Sequence[Any]) -> list[ModelRun]:
        """Items (non-empty) -> the backend runs that compute them; every item index in exactly one run."""

    @abstractmethod
    def postprocess(self, run: ModelRun, outputs: list[Any], ops: ArrayOps) -> list[Any]:
        """One run's outputs -> one JSON-serialisable result per row of the run, in order."""

    @abstractmethod
    def warmup_items(self, num_items: int) -> list[Any]:
        """``num_items`` prepared items to warm the model up with (no record needed)."""

    def records_per_poll(self) -> int | None:
        """See :meth:`sluice.engines.engine_contract.BatchEngine.records_per_poll`. Default None."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the task holds (fetch and decode threads). Called once, with the engine's close."""

    def result_schema(self) -> dict[str, Any] | None:
        """A JSON Schema every result of ``postprocess`` validates against (schema-registry outputs derive
        theirs from it; see :meth:`sluice.engines.engine_contract.BatchEngine.result_schema`). None: not known."""
        return None


def same_directory(directory: Path) -> Path:
    return directory


@dataclass(frozen=True)
class TaskType:
    """One task: its name under ``engine.task``, its options and how it is built."""

    name: str
    options: type[TaskOptions]
    create: Callable[[Any, TaskContext], Task]  # (validated options, context) -> task; loads tokenizer/configs
    model_class: ModelClass  # the head it needs (what ``sluice models export --task`` exports)
    text: bool = True  # its inputs are tokens (False for raw): decides backend shape profiles
    # The Hugging Face directory holding the model, given the pipeline's model directory (a
    # sentence-transformers model may keep its transformer in a subfolder).
    model_dir: Callable[[Path], Path] = same_directory
