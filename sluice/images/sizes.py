"""transformers' image size forms, and the sizes an image is resized to, with transformers' rounding.

:func:`read_size` reads a ``size`` or ``crop_size`` of ``preprocessor_config.json`` as transformers'
``get_size_dict`` does; :meth:`Size.target` gives the (height, width) an image is resized to. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.engines.engine_contract import EngineStartError

_SIZE_FORMS = (frozenset({"height", "width"}), frozenset({"shortest_edge"}),
               frozenset({"shortest_edge", "longest_edge"}), frozenset({"max_height", "max_width"}))


@dataclass(frozen=True, slots=True)
class Size:
    """One of transformers' size forms (exactly one form's fields are set)."""

    height: int | None = None
    width: int | None = None
    shortest_edge: int | None = None
    longest_edge: int | None = None
    max_height: int | None = None
    max_width: int | None = None

    def target(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) an image of this size is resized to, with transformers' rounding."""
        if self.height is not None and self.width is not None:
            return self.height, self.width
        if self.max_height is not None and self.max_width is not None:
            scale = min(self.max_height / height, self.max_width / width)
            return int(height * scale), int(width * scale)
        assert self.shortest_edge is not None  # from_config admits no other form
        if self.longest_edge is None:
            return shortest_edge_target(height, width, self.shortest_edge)
        return bounded_target(height, width, self.shortest_edge, self.longest_edge)


def read_size(value: Any, default_to_square: bool, key: str, source: str) -> Size:
    """transformers' size forms, as ``get_size_dict`` reads them (a null edge in a dict is an absent one)."""
    given = {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else {}
    if _positive_int(value):
        return Size(height=value, width=value) if default_to_square else Size(shortest_edge=value)
    if isinstance(value, list) and len(value) == 2 and all(map(_positive_int, value)):
        return Size(height=value[0], width=value[1])
    if frozenset(given) in _SIZE_FORMS and all(map(_positive_int, given.values())):
        return Size(**given)
    raise EngineStartError(f"{source}: {key} {value!r} is not supported: expected positive integers as "
                           "{height, width}, {shortest_edge}, {shortest_edge, longest_edge}, "
                           "{max_height, max_width}, an int or [height, width]")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def shortest_edge_target(height: int, width: int, edge: int) -> tuple[int, int]:
    """The shorter side to ``edge``, the longer one scaled and truncated (torchvision's rule, as transformers')."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(edge * long / short)
    return (new_long, edge) if width <= height else (edge, new_long)


def bounded_target(height: int, width: int, edge: int, max_edge: int) -> tuple[int, int]:
    """The shorter side to ``edge`` unless the longer one would pass ``max_edge`` (DETR's rule)."""
    shortest, longest = float(min(height, width)), float(max(height, width))
    raw: float | None = None
    if longest / shortest * edge > max_edge:
        raw = max_edge * shortest / longest
        edge = int(round(raw))
    if (height <= width and height == edge) or (width <= height and width == edge):
        return height, width
    scale = raw if raw is not None else edge
    if width < height:
        return int(scale * height / width), edge
    return edge, int(scale * width / height)
