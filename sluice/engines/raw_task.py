"""The ``raw`` task: records are mappings of numeric arrays fed to the model's inputs as they are.

``inputs`` in the pipeline maps each model input name to a (dotted) record field. ``prepare`` checks each
record against the model's declared input ranks and fixed dimensions, so a malformed record becomes a
:class:`RecordError` (dead letter) instead of failing its whole batch. ``infer`` stacks items of equal shapes
into one run; items of different shapes run as separate sub-batches (never padded: padding changes the
meaning of arbitrary tensors). Results are ``{output_name: array}`` per item, as nested lists or base64.

Numpy only; the engine passes in its ``run(feeds, output_names)`` function.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from sluice.engines.base import EngineStartError, RecordError

RunFn = Callable[[dict[str, np.ndarray], list[str]], list[np.ndarray]]


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


class RawTask:
    """Input checking, batching and output shaping for ``task: raw``."""

    def __init__(self, model_inputs: Sequence[Any], mapping: Mapping[str, str], feed_types: Mapping[str, Any],
                 output_names: Sequence[str]) -> None:
        names = [i.name for i in model_inputs]
        unknown = [name for name in mapping if name not in names]
        if unknown:
            raise EngineStartError(f"'inputs' names {unknown} are not inputs of the model; it takes {names}")
        unmapped = [name for name in names if name not in mapping]
        if unmapped:
            raise EngineStartError(f"model inputs {unmapped} have no record field in 'inputs'")
        self._specs = [
            _InputSpec(name=i.name, field=mapping[i.name], dtype=feed_types[i.name],
                       dims=tuple(d if isinstance(d, int) and d > 0 else None for d in list(i.shape)[1:]))
            for i in model_inputs
        ]
        self._output_names = list(output_names)

    def prepare(self, value: Any) -> RawItem:
        if not isinstance(value, Mapping):
            raise RecordError(f"task raw expects a JSON object, got {type(value).__name__}")
        arrays = {}
        for spec in self._specs:
            field_value = _lookup(value, spec.field)
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

    def infer(self, items: Sequence[RawItem], run: RunFn, output_format: Literal["list", "base64"]
              ) -> list[dict[str, Any]]:
        results: list[dict[str, Any] | None] = [None] * len(items)
        groups: dict[tuple[tuple[int, ...], ...], list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(item.signature(), []).append(index)
        for indices in groups.values():
            feeds = {spec.name: np.stack([items[i].arrays[spec.name] for i in indices]) for spec in self._specs}
            outputs = run(feeds, self._output_names)  # each (group_size, ...)
            for row, index in enumerate(indices):
                results[index] = {name: _format(out[row], output_format)
                                  for name, out in zip(self._output_names, outputs, strict=True)}
        return [r for r in results if r is not None]

    def warm_up(self, run: RunFn) -> None:
        feeds = {spec.name: np.zeros((1, *[d or 1 for d in spec.dims]), dtype=spec.dtype) for spec in self._specs}
        run(feeds, self._output_names)


def _lookup(record: Mapping[str, Any], dotted: str) -> Any:
    current: Any = record
    for part in dotted.split("."):
        if not isinstance(current, Mapping) or part not in current:
            raise RecordError(f"the record has no field {dotted!r}")
        current = current[part]
    return current


def _format(array: np.ndarray, output_format: Literal["list", "base64"]) -> Any:
    if output_format == "base64":
        return base64.b64encode(np.ascontiguousarray(array, dtype="<f4").tobytes()).decode("ascii")
    return array.tolist()
