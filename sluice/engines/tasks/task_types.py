"""Registry of tasks: the name under ``engine.task`` -> the module defining its ``TASK_TYPE``.

Like the engine registry, one line per task. Task modules import numpy and pydantic only at import time
(tokenizers and model files are loaded in ``create``), so every engine can list every task's options.

The engines (onnx, torch, tensorrt) take the task's options flat under ``engine:``, beside their own.
:func:`task_fields` merges every task's fields into one pydantic base class for an engine's options model;
:func:`task_options` then checks that only the chosen task's fields were given and builds that task's own
options object (which runs its validators). So adding a task touches no engine.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from pydantic import BaseModel, Field, ValidationError, create_model

from sluice.engines.tasks.task_contract import TaskOptions, TaskType

DEFAULT_TASK = "text-embedding"

# task name -> module that defines TASK_TYPE
_MODULES: dict[str, str] = {
    "text-embedding": "sluice.engines.tasks.text_embedding",
    "text-classification": "sluice.engines.tasks.text_classification",
    "token-classification": "sluice.engines.tasks.token_classification",
    "cross-encoder": "sluice.engines.tasks.cross_encoder",
    "image-classification": "sluice.engines.tasks.image_classification",
    "image-text-embedding": "sluice.engines.tasks.image_text_embedding",
    "raw": "sluice.engines.tasks.raw",
}


def names() -> list[str]:
    """Task names, in registry order."""
    return list(_MODULES)


def text_task_names() -> list[str]:
    """Tasks whose inputs are tokenised text (every one but raw)."""
    return [name for name in _MODULES if lookup(name).text]


def exportable_task_names() -> list[str]:
    """Tasks with a head to export to ONNX (every one but raw, which runs a graph as it is)."""
    return [name for name in _MODULES if lookup(name).model_class.value != "any"]


def check_name(name: str, allowed: list[str]) -> str:
    """``name`` when it is one of ``allowed`` (an engine's tasks); ValueError listing them otherwise."""
    if name not in allowed:
        raise ValueError(f"unknown task {name!r}; expected one of {allowed}")
    return name


def lookup(name: str) -> TaskType:
    """The task called ``name``. KeyError for unknown names."""
    task_type: TaskType = importlib.import_module(_MODULES[name]).TASK_TYPE
    return task_type


@cache
def task_fields() -> type[BaseModel]:
    """One pydantic model holding every task's option fields (a base class for engine options).

    A field that several tasks declare must be declared alike (same type and default): checked here.
    """
    # ``task`` first: fields are validated in order, so every task option can check it belongs to the task.
    task = Field(default=DEFAULT_TASK, description="What the model's outputs mean: `text-embedding`, "
                 "`text-classification`, `token-classification`, `cross-encoder`, `image-classification`, "
                 "`image-text-embedding` or `raw` (tensors in and out).")
    fields: dict[str, Any] = {"task": (str, task)}
    owners: dict[str, str] = {}
    for name in names():
        for field_name, info in lookup(name).options.model_fields.items():
            if field_name in fields:
                first = fields[field_name][1]
                if first.annotation != info.annotation or first.default != info.default:
                    raise TypeError(f"option {field_name!r} is declared differently by tasks {owners[field_name]} "
                                    f"and {name}")
                continue
            fields[field_name] = (info.annotation, info)
            owners[field_name] = name
    model: type[BaseModel] = create_model("TaskFields", __base__=TaskOptions, **fields)
    return model


def foreign_message(field: str, task: str) -> str:
    return f"'{field}' is an option of task {' / '.join(owners(field))}, not of task {task}"


def owners(field: str) -> list[str]:
    """The tasks that take option ``field``."""
    return [name for name in names() if field in lookup(name).options.model_fields]


def task_options(task: str, options: BaseModel) -> TaskOptions:
    """The options of ``task`` out of an engine's options; ValueError for another task's options.

    Only the fields the pipeline set are passed on, so the task's own defaults and validators apply.
    """
    own = lookup(task).options
    given = (options.model_fields_set & set(task_fields().model_fields)) - {"task"}
    foreign = sorted(given - set(own.model_fields))
    if foreign:
        raise ValueError("; ".join(foreign_message(field, task) for field in foreign))
    try:
        return own.model_validate({field: getattr(options, field) for field in given})
    except ValidationError as err:  # a cross-field rule of the task (field types were checked already)
        raise ValueError(err.errors()[0]["msg"].removeprefix("Value error, ")) from None
