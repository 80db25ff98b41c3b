""""Did you mean ...?" for a misspelt key: the closest key the section at that YAML path accepts."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence

from pydantic import BaseModel


def did_you_mean(model: type[BaseModel] | None, loc: Sequence[str | int]) -> str:
    """`` (did you mean 'x'?)`` for the unknown key ``loc[-1]`` of the section ``loc[:-1]`` of ``model``, or
    an empty string when no accepted key is close."""
    section = _section(model, loc[:-1]) if model is not None else None
    if section is None or not isinstance(loc[-1], str):
        return ""
    names = [f.alias or name for name, f in section.model_fields.items()]
    close = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _section(model: type[BaseModel], path: Sequence[str | int]) -> type[BaseModel] | None:
    current: object = model
    for part in path:
        if isinstance(part, int):
            current = _inner(current, list_item=True)
            continue
        cls = _model(current)
        if cls is None:
            return None
        field = next((f for name, f in cls.model_fields.items() if (f.alias or name) == part), None)
        if field is None:
            return None
        current = field.annotation
    return _model(current)


def _model(annotation: object) -> type[BaseModel] | None:
    """The one BaseModel in ``annotation`` (``X``, ``X | None``, ``Annotated[X, ...]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _model(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        found = [m for m in map(_model, typing.get_args(annotation)) if m is not None]
        return found[0] if len(found) == 1 else None
    return None


def _inner(annotation: object, list_item: bool) -> object:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return _inner(args[0], list_item)
    return args[0] if typing.get_origin(annotation) is list and args else None
