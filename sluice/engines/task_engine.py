"""The batch engine every model engine is: a task (what the data means) run on a backend (where it runs).

The ``onnx``, ``torch`` and ``tensorrt`` engine types differ only in their backend
(:mod:`sluice.engines.backends`); the task (:mod:`sluice.engines.tasks`) is chosen by ``engine.task``.

Start, in this order, so a wrong pipeline fails before anything slow happens::

    files = backend.locate()            # the model exists
    task = task_type.create(...)        # tokenizer, labels, pooling config: one-line errors
    io = backend.open(request)          # export / build / load (may take long)
    task.bind(io)                       # the model's inputs and outputs fit the task
    warm-up: batch 1 and the largest batch, so the first records pay no set-up

``check_model`` (``sluice validate``) runs the first two steps alone, on the model's files as the backend
finds them without checking the machine (``backend.find()``), and drops the task.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sluice.engines.backends.backend_contract import Backend, LoadRequest, ModelFiles
from sluice.engines.engine_contract import BatchEngine, EngineContext, EngineStartError, first_line
from sluice.engines.identity import ModelSource, code_source
from sluice.engines.model_source import disk_source
from sluice.engines.start_log import StartLog
from sluice.engines.tasks import task_types
from sluice.engines.tasks.engine_options import EngineTaskOptions
from sluice.engines.tasks.task_contract import Task, TaskContext, TaskOptions, TaskType

WARMUP_MAX_BATCH = 64


class TaskEngine(BatchEngine):
    """A :class:`BatchEngine` over one task and one backend; see the module docstring."""

    def __init__(self, engine: str, options: EngineTaskOptions, backend: Backend, context: EngineContext) -> None:
        self.engine_name = engine
        self.options = options  # the engine's options: the backend's, ``task`` and the task's
        self.task_type: TaskType = task_types.lookup(options.task)
        self.task_options: TaskOptions = options.task_options()
        self.backend = backend
        self.context = context
        self.warmup = options.warmup
        self.task: Task | None = None  # after start()

    # ------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        start = StartLog(f"{self.engine_name} {self.backend.model_reference() or self.options.task}")
        with start.phase("located the model") as phase:
            files = self.backend.locate()
            phase.detail = str(files.model_path or files.directory or "")
        with start.phase(f"set up task {self.options.task}"):  # tokenizer, labels, pooling: one-line errors
            task = self._create_task(files)
        with start.phase("loaded the model"):  # an export, an int8 rewrite or an engine build log their own lines
            io = self.backend.open(LoadRequest(model_class=task.model_class, model_dir=task.model_dir,
                                               max_tokens=task.max_tokens, max_batch_size=self.context.max_batch_size,
                                               trust_remote_code=self.options.trust_remote_code))
        task.bind(io)
        self.task = task
        if self.warmup:
            with start.phase("warmed up") as phase:
                phase.detail = self._warm_up(task)

    def check_model(self) -> None:
        """The model's files against the task, as ``start`` sets the task up before loading the model:
        config.json's head and labels, the tokenizer, a sentence-transformers model's modules."""
        self._create_task(self.backend.find())

    def _create_task(self, files: ModelFiles) -> Task:
        return self.task_type.create(self.task_options, TaskContext(engine=self.engine_name, files=files,
                                                                    max_batch_size=self.context.max_batch_size,
                                                                    pipeline_dir=Path(self.context.pipeline_dir)))

    def close(self) -> None:
        if self.task is not None:
            self.task.close()
        self.backend.close()

    def model_source(self) -> ModelSource:
        reference = self.backend.model_reference()
        if reference is not None:
            return disk_source(reference, self.context.pipeline_dir)
        factory = str(getattr(self.options, "factory", None) or self.engine_name)
        return code_source(factory, factory.partition(":")[0])

    def memory_device(self) -> str:
        return self.backend.memory_device()

    def result_schema(self) -> dict[str, Any] | None:
        return self.task.result_schema() if self.task is not None else None

    # -------------------------------------------------------------------------------- per record

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        if self.task is None:
            raise RuntimeError(f"engine {self.engine_name}: prepare called before start()")
        return self.task.prepare(values)

    def takes_bytes(self) -> bool:
        return self.task_options.takes_bytes()

    def records_per_poll(self) -> int | None:
        return self.task.records_per_poll() if self.task is not None else None

    def prepare_each(self, values: Sequence[Any]) -> list[Any]:
        if self.task is None:
            raise RuntimeError(f"engine {self.engine_name}: prepare called before start()")
        return self.task.prepare_each(values)

    def item_length(self, item: Any) -> int:
        return self.task.item_length(item) if self.task is not None else 1

    def infer(self, items: Sequence[Any]) -> list[Any]:
        if not items:
            return []
        task = self.task
        if task is None:
            raise RuntimeError(f"engine {self.engine_name}: infer called before start()")
        backend = self.backend
        with backend.inference():  # post-processing on device outputs belongs to the same pass
            runs = task.collate(items)
            if len(runs) == 1:  # the common case: one run serves the whole batch, in order
                (run,) = runs
                return task.postprocess(run, backend.run(run.feeds, run.output_names), backend.ops)
            results: list[Any] = [None] * len(items)
            for run in runs:
                outputs = backend.run(run.feeds, run.output_names)
                for index, result in zip(run.rows, task.postprocess(run, outputs, backend.ops), strict=True):
                    results[index] = result
            return results

    # ------------------------------------------------------------------------------------ internals

    def _warm_up(self, task: Task) -> str:
        """Run the model at batch 1 and at the largest batch, so the first records pay no set-up; say which."""
        num_large = max(1, min(self.context.max_batch_size, WARMUP_MAX_BATCH))
        sizes = sorted({1, num_large})
        try:
            for size in sizes:
                self.infer(task.warmup_items(size))
            return "batches of " + " and ".join(map(str, sizes))
        except EngineStartError:
            raise
        except Exception as err:
            raise EngineStartError(f"engine {self.engine_name}: warm-up run of the model failed: "
                                   f"{first_line(err)}") from None
