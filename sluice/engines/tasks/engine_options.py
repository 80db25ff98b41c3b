"""The base of a model engine's options: ``task`` and that task's options, flat beside the backend's own.

``engine: {type: onnx, model: ..., task: text-classification, top_k: 3, providers: [cpu]}`` -- ``top_k`` is
the task's, ``providers`` the backend's. Every task's fields are declared here (merged by
:func:`sluice.engines.tasks.task_types.task_fields`), so a misspelt or misplaced key is an error with its YAML
path; a field of another task is an error naming the task it belongs to.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import PrivateAttr, ValidationInfo, field_validator, model_validator

from sluice.engines.tasks import task_types as tasks
from sluice.engines.tasks.task_contract import TaskOptions


class EngineTaskOptions(tasks.task_fields()):  # type: ignore[misc]  # a class made from the task registry
    """Subclassed by each engine's options; ``text_only`` engines refuse tasks that are not text."""

    text_only: ClassVar[bool] = False
    warmup: bool = True
    """Run the model at batch 1 and at the largest batch before consuming, so the first records pay no set-up."""
    trust_remote_code: bool = False
    """Run the Python files of a Hugging Face model directory (named in its `config.json`'s `auto_map`) to
    load it. Off, such a directory is refused unless transformers has its model type built in. Review the
    code first."""
    _task_options: Any = PrivateAttr(default=None)

    @field_validator("task")
    @classmethod
    def _known_task(cls, value: str) -> str:
        if cls.text_only and value in tasks.names() and value not in tasks.text_task_names():
            raise ValueError(f"this engine runs text tasks; run task {value} on engine type onnx (on a GPU with "
                             "providers: [tensorrt, cuda, cpu]) or torch")
        return tasks.check_name(value, tasks.text_task_names() if cls.text_only else tasks.names())

    @field_validator("*")
    @classmethod
    def _option_of_the_task(cls, value: Any, info: ValidationInfo) -> Any:
        """A task option given for another task is an error at its own key (``task`` is validated first)."""
        field, task = info.field_name, info.data.get("task")
        if task is not None and field != "task" and field in tasks.task_fields().model_fields:
            if field not in tasks.lookup(task).options.model_fields:
                raise ValueError(tasks.foreign_message(str(field), task))
        return value

    @model_validator(mode="after")
    def _task_takes_its_options(self) -> EngineTaskOptions:
        self._task_options = tasks.task_options(self.task, self)
        return self

    def task_options(self) -> TaskOptions:
        """The chosen task's own options (its defaults filled in, its validators run)."""
        options: TaskOptions = self._task_options
        return options
