"""``engine``: the engine type, and its options as given (validated by the type's own model at load)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from sluice.engines import registry


class EngineSection(BaseModel):
    """``engine: {type: NAME, ...options}``; the options are validated by the engine type's own model."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str

    @field_validator("type")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in registry.known_types():
            raise ValueError(f"unknown engine type {value!r}; expected one of {registry.known_types()}")
        return value

    def raw_options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})
