"""``engine``: the engine type, and its options as given (validated by the type's own model at load).

Besides the type's own options, two keys are the operator's, for any engine type: ``model_name`` (what
the ``sluice.model`` header calls the model) and ``reload`` (rolling a new model version out while the
pipeline runs, sluice/operator/reload/).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sluice.config.section import Section
from sluice.engines import engine_types


class Reload(Section):
    """``engine.reload``: load a new version of the model beside the running one, then switch."""

    watch: bool = False
    """Poll the model's path and load a new version beside the serving one when it changes."""
    poll_interval_s: float = Field(default=30.0, gt=0)
    """How often the path is looked at (a few `stat` calls)."""
    settle_s: float = Field(default=1.0, ge=0)
    """A change is loaded once the model has stayed unchanged this long."""
    check_memory: bool = True
    """Refuse a reload when a second engine would not fit (host RAM, the cgroup limit, device memory)."""


class EngineSection(BaseModel):
    """``engine: {type: NAME, ...options}``; the options are validated by the engine type's own model."""

    model_config = ConfigDict(extra="allow", frozen=True, protected_namespaces=(), use_attribute_docstrings=True)
    type: str
    """The engine: `python`, `onnx`, `torch`, `tensorrt` or `llm`. Its options sit beside `type`."""
    model_name: str | None = Field(default=None, min_length=1, max_length=200)
    """The model's name in the `sluice.model` output header and in metrics (default: from `model`)."""
    reload: Reload = Field(default_factory=Reload)
    """Load a new version of the model while the pipeline runs."""

    @field_validator("type")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in engine_types.known_types():
            raise ValueError(f"unknown engine type {value!r}; expected one of {engine_types.known_types()}")
        return value

    def raw_options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})
