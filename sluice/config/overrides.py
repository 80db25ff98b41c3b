"""``--set path=value``: a setting given on the command line over the pipeline file's.

``path`` is the dotted YAML path (``telemetry.metrics.enabled``, ``batching.max_batch_size``); librdkafka
keys keep their dots (``source.kafka.config.fetch.max.bytes``): at each level the longest run of segments
that names an existing key is taken, and under a ``config`` mapping the rest is one key. ``value`` is read as
a YAML scalar or flow collection (``true``, ``64``, ``[a, b]``, ``{enabled: true}``); ``${VAR}`` in it is
interpolated like the file's. The result is validated with the rest of the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml


class OverrideError(ValueError):
    """A ``--set`` argument that is not ``path=value``."""


def parse_override(text: str) -> tuple[str, Any]:
    """``"a.b=1"`` -> ``("a.b", 1)``. Raises OverrideError."""
    path, sep, raw = text.partition("=")
    path = path.strip()
    if not sep or not path or any(not part for part in path.split(".")):
        raise OverrideError(f"--set {text!r}: expected path=value, as in --set telemetry.metrics.enabled=true")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise OverrideError(f"--set {text!r}: the value is not YAML ({str(err).splitlines()[0]})") from None
    return path, value


def apply_overrides(data: dict[str, Any], overrides: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """``data`` with each ``(path, value)`` set, in order (a later one wins). Mappings on the way are
    created; a path through a value that is not a mapping raises OverrideError."""
    for path, value in overrides:
        parts = path.split(".")
        node = data
        walked: list[str] = []
        while True:
            key, parts = _next_key(node, parts, walked)
            walked.append(key)
            if not parts:
                node[key] = value
                break
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise OverrideError(f"--set {path}: {'.'.join(walked)} is not a section")
            node = child
    return data


def _next_key(node: dict[str, Any], parts: list[str], walked: list[str]) -> tuple[str, list[str]]:
    for n in range(len(parts), 0, -1):  # the longest run of segments that is a key already
        candidate = ".".join(parts[:n])
        if candidate in node:
            return candidate, parts[n:]
    if walked and walked[-1] == "config":  # librdkafka's pass-through: its keys have dots
        return ".".join(parts), []
    return parts[0], parts[1:]
