"""Task ``raw``: records are mappings of numeric arrays fed to the model's inputs as they are.

``inputs`` in the pipeline maps each model input name to a (dotted) record field. ``prepare`` checks each
record against the model's declared input ranks and fixed dimensions, so a malformed record becomes a
:class:`RecordError` (dead letter) instead of failing its whole batch. ``collate`` stacks items of equal
shapes into one run; items of different shapes run separately (never padded: padding changes the meaning
of arbitrary tensors). Results are ``{output_name: array}`` per item, as nested lists or base64.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from sluice.engines.backends.arrays import ArrayOps
from sluice.engines.backends.backend_contract import ModelClass, ModelIO
from sluice.engines.engine_contract import EngineStartError, RecordError
from sluice.engines.tasks.record_fields import lookup
from sluice.engines.tasks.task_contract import ModelRun, Task, TaskContext, TaskOptions, TaskType
from sluice.engines.tasks.vector_formats import OutputFormat, format_array


class RawOptions(TaskOptions):
    inputs: dict[str, str] = Field(default_factory=dict)
    """Model input name to record field (dotted path)."""
    output_format: OutputFormat = "list"
    """Each output array as a nested `list`, or `base64` of its little-endian bytes."""

    @model_validator(mode="after")
    def _has_inputs(self) -> RawOptions:
        if not self.inputs:
            raise ValueError("task 'raw' needs 'inputs' (model input name -> record field)")
        return self


@dataclass(frozen=True, slots=True)
class RawItem:
    """One record's model inputs, without the batch axis."""

    arrays: dict[str, np.ndarray]  # model input name -> (*input_shape_without_batch)

    def signature(self) -> tuple[tuple[int, ...], ...]:
        return tuple(array.shape for array in self.arrays.values())


@dataclass(frozen=True, slots=True)
class _InputSpec:
    name: str
    field: str  # dotted path in the record
    dtype: Any  # numpy dtype the model wants
    dims: tuple[int | None, ...]  # declared shape without the batch axis; None = dynamic


class RawTask(Task):
    """Input checking, batching and output shaping for ``task: raw``."""

    name = "raw"
    model_class = ModelClass.ANY

    def __init__(self, options: RawOptions, context: TaskContext) -> None:
        self.mapping = dict(options.inputs)
        self.output_format = options.output_format
        self._specs: list[_InputSpec] = []
        self._output_names: list[str] = []

    def bind(self, io: ModelIO) -> None:
        names = io.input_names
        unknown = [name for name in self.mapping if name not in names]
        if unknown:
            raise EngineStartError(f"'inputs' names {unknown} are not inputs of the model; it takes {names}")
        unmapped = [name for name in names if name not in self.mapping]
        if unmapped:
            raise EngineStartError(f"model inputs {unmapped} have no record field in 'inputs'")
        self._specs = [_InputSpec(name=spec.name, field=self.mapping[spec.name], dtype=spec.dtype,
                                  dims=tuple(d if isinstance(d, int) and d > 0 else None for d in spec.shape[1:]))
                       for spec in io.inputs]
        self._output_names = io.output_names

    def prepare(self, values: Sequence[Any]) -> list[RawItem]:
        return [self._prepare_one(value) for value in values]

    def _prepare_one(self, value: Any) -> RawItem:
        if not isinstance(value, Mapping):
            raise RecordError(f"task raw expects a JSON object, got {type(value).__name__}")
        arrays = {}
        for spec in self._specs:
            field_value = lookup(value, spec.field)
            try:
                array = np.asarray(field_value, dtype=spec.dtype)
            except (TypeError, ValueError):
                raise RecordError(f"field {spec.field!r} is not a numeric array for input {spec.name!r}") from None
            if array.ndim != len(spec.dims):
                raise RecordError(f"field {spec.field!r} has {array.ndim} dimensions; input {spec.name!r} "
                                  f"expects {len(spec.dims)} per record")
            for axis, (got, want) in enumerate(zip(array.shape, spec.dims, strict=True)):
                if want is not None and got != want:
                    raise RecordError(f"field {spec.field!r} has size {got} on axis {axis}; input "
                                      f"{spec.name!r} expects {want}")
            arrays[spec.name] = array
        return RawItem(arrays=arrays)

    def collate(self, items: Sequence[RawItem]) -> list[ModelRun]:
        groups: dict[tuple[tuple[int, ...], ...], list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(item.signature(), []).append(index)
        return [ModelRun(feeds={spec.name: np.stack([items[i].arrays[spec.name] for i in rows])
                                for spec in self._specs},
                         output_names=self._output_names, rows=rows)
                for rows in groups.values()]

    def postprocess(self, run: ModelRun, outputs: list[Any], ops: ArrayOps) -> list[Any]:
        arrays = [ops.to_host(output) for output in outputs]  # each (rows, ...)
        return [{name: format_array(array[row], self.output_format)
                 for name, array in zip(self._output_names, arrays, strict=True)}
                for row in range(len(run.rows))]

    def warmup_items(self, num_items: int) -> list[Any]:
        zeros = RawItem(arrays={spec.name: np.zeros([d or 1 for d in spec.dims], dtype=spec.dtype)
                                for spec in self._specs})
        return [zeros] * num_items


def _create(options: RawOptions, context: TaskContext) -> RawTask:
    return RawTask(options, context)


TASK_TYPE = TaskType(name="raw", options=RawOptions, create=_create, model_class=ModelClass.ANY, text=False)
